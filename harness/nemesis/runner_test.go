package nemesis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tcp-relay/mesh"
)

// fakeCluster keeps node states in memory, in front of a real relay mesh
// (relays to ports nothing listens on: partitions and link faults are real
// relay operations). It checks the same state transitions cluster.Cluster
// does, so a nemesis that signals a node in the wrong state fails here.
type fakeCluster struct {
	m *mesh.Mesh
	// network, when set, is the mesh the nemesis sees instead of m.
	network cluster.Network

	mu      sync.Mutex
	states  map[string]cluster.State
	leader  string
	nextID  uint64
	calls   []string
	noAdds  int // AddMember fails this many times first
	healthy bool

	// Disks (disk_test.go): noDisks makes it a cluster without faultfs;
	// exited marks nodes whose process exited on their own.
	noDisks bool
	disks   map[string]*fakeDisk
	exited  map[string]bool

	// stopCodes are the exit codes graceful stops answer (graceful_test.go).
	stopCodes map[string]int
}

func newFake(t *testing.T, n int) *fakeCluster {
	t.Helper()
	nodes := map[string]mesh.Node{}
	f := &fakeCluster{states: map[string]cluster.State{}, leader: "n1", nextID: uint64(n) + 1, healthy: true}
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("n%d", i)
		nodes[name] = mesh.Node{Peer: "127.0.0.1:1", Client: "127.0.0.1:1"}
		f.states[name] = cluster.Running
	}
	m, err := mesh.New(mesh.Config{Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	f.m = m
	return f
}

func (f *fakeCluster) Names() []string { return f.m.Nodes() }
func (f *fakeCluster) Mesh() cluster.Network {
	if f.network != nil {
		return f.network
	}
	return f.m
}

func (f *fakeCluster) State(n string) cluster.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.states[n]
}

func (f *fakeCluster) move(call, n string, from []cluster.State, to cluster.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call+" "+n)
	if !slices.Contains(from, f.states[n]) {
		return fmt.Errorf("fake: %s %s: node is %s", call, n, f.states[n])
	}
	f.states[n] = to
	if to != cluster.Running && f.leader == n {
		f.leader = ""
	}
	return nil
}

func (f *fakeCluster) Kill(n string) error {
	return f.move("kill", n, []cluster.State{cluster.Running, cluster.Paused}, cluster.Killed)
}
func (f *fakeCluster) Pause(n string) error {
	return f.move("pause", n, []cluster.State{cluster.Running}, cluster.Paused)
}
func (f *fakeCluster) Resume(n string) error {
	return f.move("resume", n, []cluster.State{cluster.Paused}, cluster.Running)
}
func (f *fakeCluster) Start(n string) error {
	return f.move("start", n, []cluster.State{cluster.Killed, cluster.Stopped}, cluster.Running)
}
func (f *fakeCluster) Restart(n string) error {
	return f.move("restart", n, []cluster.State{cluster.Running, cluster.Killed, cluster.Stopped}, cluster.Running)
}
func (f *fakeCluster) RemoveMember(_ context.Context, n string) error {
	return f.move("remove", n, []cluster.State{cluster.Running, cluster.Paused, cluster.Killed}, cluster.Removed)
}

func (f *fakeCluster) AddMember(_ context.Context, n string) (uint64, error) {
	f.mu.Lock()
	if f.noAdds > 0 {
		f.noAdds--
		f.calls = append(f.calls, "add-refused "+n)
		f.mu.Unlock()
		return 0, errors.New("fake: 503 no leader")
	}
	id := f.nextID
	f.nextID++
	f.mu.Unlock()
	return id, f.move("add", n, []cluster.State{cluster.Removed}, cluster.Running)
}

func (f *fakeCluster) WaitLeader(ctx context.Context) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leader == "" {
		// Elect the first running node, as a real cluster would soon.
		for _, n := range f.m.Nodes() {
			if f.states[n] == cluster.Running && f.healthy {
				f.leader = n
				break
			}
		}
	}
	if f.leader == "" {
		return "", fmt.Errorf("fake: no leader: %w", context.DeadlineExceeded)
	}
	return f.leader, nil
}

func (f *fakeCluster) WaitConverged(ctx context.Context) error {
	_, err := f.WaitLeader(ctx)
	return err
}

func (f *fakeCluster) TransferLeader(_ context.Context, from, to string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "transfer "+from+"->"+to)
	if f.leader != from {
		return fmt.Errorf("fake: %s is not the leader", from)
	}
	f.leader = to
	return nil
}

func (f *fakeCluster) callLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func newRecorder(t *testing.T) (*history.Recorder, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "history.jsonl")
	rec, err := history.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	return rec, path
}

func readHistory(t *testing.T, rec *history.Recorder, path string) []history.Op {
	t.Helper()
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	ops, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

// summary renders nemesis ops as "invoke kill leader n1" lines.
func summary(ops []history.Op) []string {
	var out []string
	for _, op := range ops {
		if op.Process != history.Nemesis {
			continue
		}
		line := string(op.Type) + " " + op.F
		if len(op.Value) > 0 {
			fv, _ := history.Decode[history.FaultValue](op)
			line += " " + fv.Kind + " " + strings.Join(fv.Targets, ",")
		}
		out = append(out, strings.TrimSpace(line))
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// The history the runner writes is what checker.FaultWindows reads: each
// fault's window runs from its invoke to the ok of its heal, instant
// faults end at their own completion, and heal-all closes the rest.
func TestRecordedFaultsGiveFaultWindows(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)

	must(t, r.Inject(ctx, Step{Kind: "isolate-one", Targets: []string{"n2"}}))
	must(t, r.Heal(ctx, "isolate-one"))
	must(t, r.Inject(ctx, Step{Kind: "kill-leader"}))
	must(t, r.Inject(ctx, Step{Kind: "slow-links", Targets: []string{"n3"}, Link: genConfig().withDefaults().linkSpec("slow-links")}))
	must(t, r.Heal(ctx, "kill-leader"))
	must(t, r.Inject(ctx, Step{Kind: "transfer-leader", Targets: []string{"n3", "n2"}}))
	must(t, r.Inject(ctx, Step{Kind: "pause-one", Targets: []string{"n3"}}))
	if got := r.Active(); !slices.Equal(got, []string{"pause-one on n3", "slow-links on n3"}) {
		t.Fatalf("active: expected pause-one and slow-links, found %v", got)
	}
	must(t, r.HealAll(ctx))
	ops := readHistory(t, rec, path)

	want := []string{
		"invoke partition isolate-one n2", "ok partition isolate-one n2",
		"invoke heal-partition isolate-one n2", "ok heal-partition isolate-one n2",
		"invoke kill leader n1", "ok kill leader n1",
		"invoke slow latency n3", "ok slow latency n3",
		"invoke heal-kill leader n1", "ok heal-kill leader n1",
		// n1 is back and the fake elects the first running node; n1 hands
		// over to the first candidate that is not the leader.
		"invoke transfer-leader leader n1,n3", "ok transfer-leader leader n1,n3",
		"invoke pause one n3", "ok pause one n3",
		"invoke heal-all all n1,n2,n3", "ok heal-all all n1,n2,n3",
	}
	if got := summary(ops); !slices.Equal(got, want) {
		t.Fatalf("nemesis ops:\n%s\nexpected:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// The partition's ok carries the grudge the mesh enforced, as "hears
	// from" sets: n2 hears nobody, nobody hears n2.
	fv, err := history.Decode[history.FaultValue](ops[1])
	must(t, err)
	wantGrudge := map[string][]string{"n1": {"n2"}, "n3": {"n2"}, "n2": {"n1", "n3"}}
	if !reflect.DeepEqual(fv.Grudge, wantGrudge) {
		t.Fatalf("grudge: expected %v, found %v", wantGrudge, fv.Grudge)
	}

	windows, err := checker.FaultWindows(ops)
	must(t, err)
	at := func(i int) int64 { return ops[i].Time }
	wantWindows := []checker.FaultWindow{
		{F: "partition", Kind: "isolate-one", Targets: []string{"n2"}, Start: at(0), Effective: at(1), End: at(3), Healed: true},
		{F: "kill", Kind: "leader", Targets: []string{"n1"}, Start: at(4), Effective: at(5), End: at(9), Healed: true},
		{F: "slow", Kind: "latency", Targets: []string{"n3"}, Start: at(6), Effective: at(7), End: at(15), Healed: true},
		{F: "transfer-leader", Kind: "leader", Targets: []string{"n1", "n3"}, Start: at(10), Effective: at(11), End: at(11), Healed: true},
		{F: "pause", Kind: "one", Targets: []string{"n3"}, Start: at(12), Effective: at(13), End: at(15), Healed: true},
	}
	if !reflect.DeepEqual(windows, wantWindows) {
		t.Fatalf("windows:\n%v\nexpected:\n%v", windows, wantWindows)
	}
	for _, n := range f.Names() {
		if st := f.State(n); st != cluster.Running {
			t.Errorf("after HealAll: %s is %s", n, st)
		}
	}
}

func TestLeaderFaultWithoutLeaderFails(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	f.healthy, f.leader = false, ""
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	err := r.Inject(ctx, Step{Kind: "kill-leader"})
	if err == nil || !strings.Contains(err.Error(), "resolving the leader") {
		t.Fatalf("expected kill-leader to fail for want of a leader, found %v", err)
	}
	ops := readHistory(t, rec, path)
	if got := summary(ops); !slices.Equal(got, []string{"invoke kill leader", "fail kill leader"}) {
		t.Fatalf("expected invoke then fail, found %v", got)
	}
	if w, _ := checker.FaultWindows(ops); len(w) != 0 {
		t.Fatalf("a failed fault has no window, found %v", w)
	}
	if len(r.Active()) != 0 || len(f.callLog()) != 0 {
		t.Fatalf("nothing should have been done: active %v, calls %v", r.Active(), f.callLog())
	}
}

func TestInjectOnWrongStateFails(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	must(t, f.Kill("n2")) // behind the nemesis's back
	err := r.Inject(ctx, Step{Kind: "pause-one", Targets: []string{"n2"}})
	if err == nil || !IsNotApplied(err) {
		t.Fatalf("pausing a killed node: expected a not-applied error, found %v", err)
	}
	ops := readHistory(t, rec, path)
	if got := summary(ops); !slices.Equal(got, []string{"invoke pause one n2", "fail pause one n2"}) {
		t.Fatalf("expected invoke then fail, found %v", got)
	}
	if ops[1].Error == "" || !strings.Contains(ops[1].Error, "expected node running, found killed") {
		t.Fatalf("expected the fail to say why, found %q", ops[1].Error)
	}
}

func TestSameClassFaultHealsThePreviousFirst(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	must(t, r.Inject(ctx, Step{Kind: "pause-one", Targets: []string{"n2"}}))
	must(t, r.Inject(ctx, Step{Kind: "kill-one", Targets: []string{"n2"}}))
	must(t, r.Inject(ctx, Step{Kind: "partition-halves", Targets: []string{"n3", "n1", "n2"}}))
	must(t, r.Inject(ctx, Step{Kind: "isolate-one", Targets: []string{"n1"}}))
	if got, want := f.callLog(), []string{"pause n2", "resume n2", "kill n2"}; !slices.Equal(got, want) {
		t.Fatalf("calls: expected %v, found %v", want, got)
	}
	if got := f.m.Grudge(); !reflect.DeepEqual(got, mesh.Grudge{"n1": {"n2", "n3"}, "n2": {"n1"}, "n3": {"n1"}}) {
		t.Fatalf("expected only the isolation of n1 in force, found %v", got)
	}
	ops := readHistory(t, rec, path)
	got := summary(ops)
	want := []string{
		"invoke pause one n2", "ok pause one n2",
		"invoke heal-pause one n2", "ok heal-pause one n2",
		"invoke kill one n2", "ok kill one n2",
		"invoke partition halves n3,n1,n2", "ok partition halves n3,n1,n2",
		"invoke heal-partition halves n3,n1,n2", "ok heal-partition halves n3,n1,n2",
		"invoke partition isolate-one n1", "ok partition isolate-one n1",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("nemesis ops:\n%s\nexpected:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestHealAllReaddsRemovedMembers(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	must(t, r.Inject(ctx, Step{Kind: "member-churn", Targets: []string{"n3"}}))
	if st := f.State("n3"); st != cluster.Removed {
		t.Fatalf("after member-churn: expected n3 removed, found %s", st)
	}
	must(t, r.Inject(ctx, Step{Kind: "isolate-one", Targets: []string{"n1"}}))
	f.noAdds = 2 // the first re-adds meet an election
	must(t, r.HealAll(ctx))
	if st := f.State("n3"); st != cluster.Running {
		t.Fatalf("after HealAll: expected n3 running again, found %s", st)
	}
	if g := f.m.Grudge(); len(g) != 0 {
		t.Fatalf("after HealAll: expected no grudge, found %v", g)
	}
	calls := f.callLog()
	if want := []string{"remove n3", "add-refused n3", "add-refused n3", "add n3"}; !slices.Equal(calls, want) {
		t.Fatalf("calls: expected %v, found %v", want, calls)
	}
	ops := readHistory(t, rec, path)
	if w, _ := checker.FaultWindows(ops); len(w) != 2 || !w[0].Healed || !w[1].Healed {
		t.Fatalf("expected both windows closed by heal-all, found %v", w)
	}
}

func TestSlowLinksOnOneNodeTouchOnlyItsLinks(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, _ := newRecorder(t)
	r := NewRunner(f, rec, nil)
	cfg := genConfig().withDefaults()
	must(t, r.Inject(ctx, Step{Kind: "slow-links", Targets: []string{"n2"}, Link: cfg.linkSpec("slow-links")}))
	must(t, r.Inject(ctx, Step{Kind: "isolate-one", Targets: []string{"n2"}}))
	count := func() map[string]int {
		out := map[string]int{}
		for _, a := range f.Names() {
			for _, b := range f.Names() {
				if rl, ok := f.m.PeerRelay(a, b); ok {
					for _, fl := range rl.Faults() {
						out[fl.Name]++
						if fl.Name == "nemesis-latency" && a != "n2" && b != "n2" {
							t.Errorf("latency on %s->%s, which does not touch n2", a, b)
						}
					}
				}
			}
		}
		return out
	}
	if got := count(); got["nemesis-latency"] != 4 || got[mesh.PartitionFault] != 4 {
		t.Fatalf("expected latency and the partition on the 4 links of n2, found %v", got)
	}
	// Healing one class leaves the other's relay faults alone.
	must(t, r.Heal(ctx, "slow-links"))
	if got := count(); got["nemesis-latency"] != 0 || got[mesh.PartitionFault] != 4 {
		t.Fatalf("after healing slow-links: expected only the partition left, found %v", got)
	}
}

func TestRunExecutesScheduleAndHealsWhenCancelled(t *testing.T) {
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	ms := time.Millisecond
	s := Schedule{Seed: 1, Config: ScheduleConfig{Duration: 150 * ms, Nodes: []string{"n1", "n2", "n3"}}, Steps: []Step{
		{At: 10 * ms, Kind: "kill-one", Targets: []string{"n3"}, Duration: 40 * ms},
		{At: 20 * ms, Kind: "partition-halves", Targets: []string{"n1", "n2", "n3"}, Duration: 100 * ms},
		{At: 50 * ms, Kind: "restart-one", Targets: []string{"n2"}}, // same instant as the kill's heal: heal first
		{At: 60 * ms, Kind: "pause-one", Targets: []string{"n1"}, Duration: time.Hour},
	}}
	// The run is cancelled once the schedule's last step before the end
	// (the partition's heal, at 120ms) is done — seen under the runner's
	// op lock, so no op is half done — not at a fixed time: a loaded
	// machine may run the steps late, and a deadline of its own would then
	// cut the run before them (a speed assumption).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx, s) }()
	for ready := false; !ready; {
		select {
		case err := <-errc:
			t.Fatalf("Run returned before it was cancelled: %v", err)
		case <-time.After(5 * ms):
		}
		r.op.Lock()
		ready = f.State("n1") == cluster.Paused && len(f.m.Grudge()) == 0
		r.op.Unlock()
	}
	cancel()
	var err error
	select {
	case err = <-errc:
	case <-time.After(time.Minute): // liveness bound only
		t.Fatal("Run did not return after its context was cancelled")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a schedule longer than its context: expected the context's error, found %v", err)
	}
	ops := readHistory(t, rec, path)
	want := []string{
		"invoke kill one n3", "ok kill one n3",
		"invoke partition halves n1,n2,n3", "ok partition halves n1,n2,n3",
		"invoke heal-kill one n3", "ok heal-kill one n3",
		"invoke restart one n2", "ok restart one n2",
		"invoke pause one n1", "ok pause one n1",
		"invoke heal-partition halves n1,n2,n3", "ok heal-partition halves n1,n2,n3",
		"invoke heal-all all n1,n2,n3", "ok heal-all all n1,n2,n3",
	}
	if got := summary(ops); !slices.Equal(got, want) {
		t.Fatalf("nemesis ops:\n%s\nexpected:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if f.State("n1") != cluster.Running {
		t.Fatalf("the cancelled run must still heal: n1 is %s", f.State("n1"))
	}
}

func TestBadPartitionShapeFailsWithoutTouchingRelays(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	err := r.Inject(ctx, Step{Kind: "bridge", Targets: []string{"n1", "n2"}, Duration: time.Second})
	if !IsNotApplied(err) || !errors.Is(err, mesh.ErrBadShape) {
		t.Fatalf("bridge over 2 of 3 nodes: expected a not-applied bad shape, found %v", err)
	}
	if g := f.m.Grudge(); len(g) != 0 {
		t.Fatalf("expected no grudge, found %v", g)
	}
	ops := readHistory(t, rec, path)
	if got := summary(ops); !slices.Equal(got, []string{"invoke partition bridge n1,n2", "fail partition bridge n1,n2"}) {
		t.Fatalf("expected invoke then fail, found %v", got)
	}
}

// brokenRelay is a standalone relay's control API that answers every
// request 500, as a wedged or misconfigured tcp-relay does; the nemesis
// reaches it through a real cluster.RemoteNetwork.
func brokenRelay(t *testing.T, nodes []string) cluster.Network {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, `{"error":{"code":"internal","message":"%s %s: relay wedged"}}`, r.Method, r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	info := control.MeshInfo{Nodes: map[string]control.MeshNode{}}
	for _, n := range nodes {
		info.Nodes[n] = control.MeshNode{}
	}
	return cluster.NewRemoteNetwork(control.NewClient(srv.URL, srv.Client()), info, nil)
}

// Regression: a heal-all whose relay reset failed (the
// standalone relay answered 500) was recorded ok, closing every fault
// window although the faults may still have been in force. It must be
// recorded as not ok, return the error, and leave the windows open.
func TestHealAllWithAFailedRelayResetIsNotOK(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	r.RecoveryTimeout = 5 * time.Second
	must(t, r.Inject(ctx, Step{Kind: "isolate-one", Targets: []string{"n2"}}))
	f.network = brokenRelay(t, f.Names()) // the relay wedges while the partition is in force
	err := r.HealAll(ctx)
	if err == nil || !strings.Contains(err.Error(), "relay wedged") {
		t.Fatalf("HealAll over a relay whose reset fails: expected its error, found %v", err)
	}
	ops := readHistory(t, rec, path)
	got := summary(ops)
	if last := got[len(got)-1]; !strings.HasPrefix(last, "info heal-all") {
		t.Fatalf("heal-all completion: expected info (not ok), found %q in %v", last, got)
	}
	if !strings.Contains(ops[len(ops)-1].Error, "relay wedged") {
		t.Fatalf("expected the heal-all's error in the history, found %q", ops[len(ops)-1].Error)
	}
	ws, err := checker.FaultWindows(ops)
	must(t, err)
	if len(ws) != 1 || ws[0].Healed {
		t.Fatalf("expected the partition's window to stay open, found %v", ws)
	}
	if res := checker.Faults(ops, []checker.FaultKind{mustKind(t, "isolate-one").Recorded()}); res.Valid != checker.Unknown {
		t.Fatalf("faults checker: expected unknown for a fault never confirmed healed, found %s: %s", res.Valid, res.Summary)
	}
	if len(r.Active()) != 1 {
		t.Fatalf("expected the partition still active for the next HealAll, found %v", r.Active())
	}
}

func mustKind(t *testing.T, name string) Kind {
	t.Helper()
	k, ok := LookupKind(name)
	if !ok {
		t.Fatalf("no kind %q", name)
	}
	return k
}

// Regression: nemesis.Run dropped inject's result, so a
// schedule none of whose faults took effect ran "fine". Its error must
// name each kind that never took effect and was healed, Outcomes must
// count the failures, and the faults checker must say unknown, naming the
// kind.
func TestRunNamesKindsThatNeverTookEffect(t *testing.T) {
	f := newFake(t, 3)
	f.network = brokenRelay(t, f.Names())
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	r.RecoveryTimeout = 5 * time.Second
	ms := time.Millisecond
	s := Schedule{Seed: 1, Config: ScheduleConfig{Duration: 60 * ms, Nodes: []string{"n1", "n2", "n3"}}, Steps: []Step{
		{At: 5 * ms, Kind: "isolate-one", Targets: []string{"n2"}, Duration: 10 * ms},
		{At: 20 * ms, Kind: "kill-one", Targets: []string{"n3"}, Duration: 10 * ms},
		{At: 40 * ms, Kind: "isolate-one", Targets: []string{"n1"}, Duration: 10 * ms},
	}}
	err := r.Run(context.Background(), s)
	if !errors.Is(err, ErrNotExercised) || !strings.Contains(err.Error(), "isolate-one: 2 invoked, 0 took effect") {
		t.Fatalf("expected Run to name isolate-one as never exercised, found %v", err)
	}
	if strings.Contains(err.Error(), "kill-one:") {
		t.Fatalf("kill-one took effect and was healed, yet Run names it: %v", err)
	}
	o := r.Outcomes()
	if o["isolate-one"].TookEffect != 0 || o["isolate-one"].Invoked != 2 || o["kill-one"].Healed != 1 {
		t.Fatalf("outcomes %+v", o)
	}
	ops := readHistory(t, rec, path)
	res := checker.Faults(ops, s.Requested())
	if res.Valid != checker.Unknown || !strings.Contains(res.Summary, "isolate-one never took effect") {
		t.Fatalf("faults checker: expected unknown naming isolate-one, found %s: %s", res.Valid, res.Summary)
	}
}

func TestRecordedMatchesWhatTheRunnerRecords(t *testing.T) {
	ctx := context.Background()
	for _, k := range Kinds() {
		if k.MinNodes > 3 || slices.Contains(k.Needs, CapElectionLog) {
			continue // power-cut-after-election needs node logs: election_test.go
		}
		t.Run(k.Name, func(t *testing.T) {
			f := newFake(t, 3)
			rec, path := newRecorder(t)
			r := NewRunner(f, rec, nil)
			st := Step{Kind: k.Name, Link: genConfig().withDefaults().linkSpec(k.Name), Disk: diskSpec(k.Name, rand.New(rand.NewPCG(1, 2)))}
			if k.pick != nil {
				st.Targets = k.pick(rand.New(rand.NewPCG(1, 2)), f.Names())
			}
			st.Offsets = clockOffsets(rand.New(rand.NewPCG(1, 2)), k.Name, st.Targets)
			must(t, r.Inject(ctx, st))
			must(t, r.HealAll(ctx))
			res := checker.Faults(readHistory(t, rec, path), []checker.FaultKind{k.Recorded()})
			if res.Valid != checker.Valid {
				t.Fatalf("%s: expected the checker to find it took effect and was healed, found %s: %s", k.Name, res.Valid, res.Summary)
			}
		})
	}
}

// unreachableRelay is a standalone relay's control API nothing listens
// on: every request fails to connect.
func unreachableRelay(t *testing.T, nodes []string) cluster.Network {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there any more
	info := control.MeshInfo{Nodes: map[string]control.MeshNode{}}
	for _, n := range nodes {
		info.Nodes[n] = control.MeshNode{}
	}
	return cluster.NewRemoteNetwork(control.NewClient(addr, &http.Client{Timeout: 5 * time.Second}), info, nil)
}

// Regression (found by the audit): a partition whose
// control request could not even connect to the relay was recorded info
// (outcome unknown), so its window stayed open to the end of the run and
// widened the faults the other checkers blame anomalies on. Nothing was
// sent, so nothing happened: it is recorded fail, with no window. A
// relay that answered (500) may have acted, and stays info.
func TestPartitionThatNeverReachedTheRelayFailed(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		network func(*testing.T, []string) cluster.Network
		want    string
		windows int
	}{
		{"unreachable", unreachableRelay, "fail partition", 0},
		{"answers 500", brokenRelay, "info partition", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t, 3)
			f.network = tc.network(t, f.Names())
			rec, path := newRecorder(t)
			r := NewRunner(f, rec, nil)
			if err := r.Inject(ctx, Step{Kind: "isolate-one", Targets: []string{"n2"}}); err == nil {
				t.Fatal("expected the injection to fail")
			}
			ops := readHistory(t, rec, path)
			got := summary(ops)
			if last := got[len(got)-1]; !strings.HasPrefix(last, tc.want) {
				t.Fatalf("expected the partition's completion %q..., found %v", tc.want, got)
			}
			ws, err := checker.FaultWindows(ops)
			must(t, err)
			if len(ws) != tc.windows {
				t.Fatalf("expected %d fault window(s), found %v", tc.windows, ws)
			}
		})
	}
}
