package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
)

// A graceful stop moves the fake's node to Stopped and answers the exit
// code set for it in stopCodes (0 by default).
func (f *fakeCluster) StopStatus(_ context.Context, n string) (int, string, error) {
	if err := f.move("stop", n, []cluster.State{cluster.Running, cluster.Paused}, cluster.Stopped); err != nil {
		return -1, "", err
	}
	f.mu.Lock()
	code := f.stopCodes[n]
	f.mu.Unlock()
	return code, fmt.Sprintf("exit status %d", code), nil
}

func (f *fakeCluster) WaitNodeReady(_ context.Context, n string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, "ready "+n)
	return nil
}

func newGracefulFake(t *testing.T, n int) *fakeCluster {
	f := newFake(t, n)
	f.stopCodes = map[string]int{}
	return f
}

// plainCluster hides every method but Cluster's: a cluster without
// graceful stops.
type plainCluster struct{ Cluster }

// recordedParams decodes the params of the last ok of f in ops.
func recordedParams(t *testing.T, ops []history.Op, f string) gracefulParams {
	t.Helper()
	var p gracefulParams
	found := false
	for _, op := range ops {
		if op.F == f && op.Type == history.OK {
			fv, err := history.Decode[history.FaultValue](op)
			must(t, err)
			must(t, json.Unmarshal(fv.Params, &p))
			found = true
		}
	}
	if !found {
		t.Fatalf("no ok of %s in the history", f)
	}
	return p
}

// Each graceful kind's generated step: stop and stop-then-power-cut one
// node (the latter with a seeded power cut spec) and last the fault
// duration; restart-graceful and rolling-restart are instant; a rolling
// restart names every node in a drawn order and draws whether the leader
// goes first. The steps survive schedule.json.
func TestGracefulKindsScheduleEntries(t *testing.T) {
	cfg := ScheduleConfig{Duration: 5 * time.Minute, Interval: 5 * time.Second, FaultDuration: 4 * time.Second,
		Mix: []string{"stop", "restart-graceful", "rolling-restart", "stop-then-power-cut"}, Nodes: []string{"n1", "n2", "n3"}}
	s, err := Generate(7, cfg)
	must(t, err)
	seen := map[string]int{}
	leaderFirst := map[bool]int{}
	for _, st := range s.Steps {
		seen[st.Kind]++
		switch st.Kind {
		case "stop":
			if len(st.Targets) != 1 || st.Duration != cfg.FaultDuration || st.Disk != nil || st.Rolling != nil {
				t.Fatalf("stop step: expected one target lasting %s, found %+v", cfg.FaultDuration, st)
			}
		case "restart-graceful":
			if len(st.Targets) != 1 || st.Duration != 0 {
				t.Fatalf("restart-graceful step: expected one target, instant, found %+v", st)
			}
		case "rolling-restart":
			if st.Duration != 0 || st.Rolling == nil || !slices.Equal(slices.Sorted(slices.Values(st.Targets)), cfg.Nodes) {
				t.Fatalf("rolling-restart step: expected an order of every node, instant, with a leader draw, found %+v", st)
			}
			leaderFirst[st.Rolling.LeaderFirst]++
		case "stop-then-power-cut":
			if len(st.Targets) != 1 || st.Duration != cfg.FaultDuration || st.Disk == nil || st.Disk.PowerCut == nil || st.Disk.PowerCut.Seed == 0 {
				t.Fatalf("stop-then-power-cut step: expected one target and a seeded power cut, found %+v (disk %+v)", st, st.Disk)
			}
		default:
			t.Fatalf("unexpected kind %s", st.Kind)
		}
	}
	for _, k := range cfg.Mix {
		if seen[k] == 0 {
			t.Fatalf("kind %s never drawn in %d steps: %v", k, len(s.Steps), seen)
		}
	}
	if leaderFirst[true] == 0 || leaderFirst[false] == 0 {
		t.Fatalf("rolling restarts: expected the leader both first and last over the run, found %v", leaderFirst)
	}
	b, err := json.Marshal(s)
	must(t, err)
	var back Schedule
	must(t, json.Unmarshal(b, &back))
	must(t, back.Validate())
	b2, _ := json.Marshal(back)
	if string(b) != string(b2) {
		t.Fatalf("schedule.json round trip changed it:\n%s\n%s", b, b2)
	}
	again, _ := Generate(7, cfg)
	if a, _ := json.Marshal(again); string(a) != string(b) {
		t.Fatal("same seed, different schedule")
	}
}

// A stop is SIGTERM and a wait; the history's ok records the exit status
// and the heal starts the node again. restart-graceful starts it at once.
func TestStopRecordsExitStatusAndHealStarts(t *testing.T) {
	ctx := context.Background()
	g := newGracefulFake(t, 3)
	g.stopCodes["n3"] = 4
	rec, path := newRecorder(t)
	r := NewRunner(g, rec, nil)
	must(t, r.Inject(ctx, Step{Kind: "stop", Targets: []string{"n2"}, Duration: time.Second}))
	if st := g.State("n2"); st != cluster.Stopped {
		t.Fatalf("n2 after stop: expected stopped, found %s", st)
	}
	must(t, r.Heal(ctx, "stop"))
	must(t, r.Inject(ctx, Step{Kind: "restart-graceful", Targets: []string{"n3"}}))
	if st := g.State("n3"); st != cluster.Running {
		t.Fatalf("n3 after restart-graceful: expected running, found %s", st)
	}
	if want := []string{"stop n2", "start n2", "stop n3", "start n3"}; !slices.Equal(g.callLog(), want) {
		t.Fatalf("calls: expected %v, found %v", want, g.callLog())
	}
	ops := readHistory(t, rec, path)
	if p := recordedParams(t, ops, FStop); p.Exits["n2"] != (Exit{Code: 0, Text: "exit status 0"}) {
		t.Fatalf("stop's recorded exits: expected n2 exit status 0, found %+v", p.Exits)
	}
	// A non-zero status is recorded as it was: the nodes checker judges it.
	if p := recordedParams(t, ops, history.FRestart); p.Exits["n3"].Code != 4 {
		t.Fatalf("restart-graceful's recorded exits: expected n3 status 4, found %+v", p.Exits)
	}
	var kinds []checker.FaultKind
	for _, n := range []string{"stop", "restart-graceful"} {
		k, _ := LookupKind(n)
		kinds = append(kinds, k.Recorded())
	}
	if res := checker.Faults(ops, kinds); res.Valid != checker.Valid {
		t.Fatalf("faults checker: %s: %s", res.Valid, res.Summary)
	}
}

// A rolling restart takes one member down at a time — stop, start, wait
// until ready — and puts the leader where the step drew it.
func TestRollingRestartOneAtATimeLeaderLastOrFirst(t *testing.T) {
	for _, first := range []bool{false, true} {
		ctx := context.Background()
		g := newGracefulFake(t, 3) // the fake's leader is n1
		rec, path := newRecorder(t)
		r := NewRunner(g, rec, nil)
		must(t, r.Inject(ctx, Step{Kind: "rolling-restart", Targets: []string{"n3", "n1", "n2"}, Rolling: &RollingSpec{LeaderFirst: first}}))
		want := []string{"stop n3", "start n3", "ready n3", "stop n2", "start n2", "ready n2", "stop n1", "start n1", "ready n1"}
		if first {
			want = []string{"stop n1", "start n1", "ready n1", "stop n3", "start n3", "ready n3", "stop n2", "start n2", "ready n2"}
		}
		if got := g.callLog(); !slices.Equal(got, want) {
			t.Fatalf("leader first %t: calls\n%s\nexpected\n%s", first, strings.Join(got, ", "), strings.Join(want, ", "))
		}
		ops := readHistory(t, rec, path)
		p := recordedParams(t, ops, history.FRestart)
		if len(p.Exits) != 3 || p.LeaderFirst == nil || *p.LeaderFirst != first {
			t.Fatalf("recorded: expected 3 exits and leader_first %t, found %+v", first, p)
		}
	}
}

// stop-then-power-cut stops the node gracefully and only then cuts its
// disk; heal starts it on what survived. With a quiet gate the workload
// is held before the cut and let go after, and the history shows the
// spell as a healed "quiet" window.
func TestStopThenPowerCutAfterTheExitWithQuietSpell(t *testing.T) {
	ctx := context.Background()
	g := newGracefulFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(g, rec, nil)
	gate := &fakeGate{}
	r.Quiet, r.QuietBeforeCut = gate, 20*time.Millisecond
	st := stepFor(t, "stop-then-power-cut", "n2")
	must(t, r.Inject(ctx, st))
	if want := []string{"stop n2", "power-cut n2"}; !slices.Equal(g.callLog(), want) {
		t.Fatalf("calls: expected %v, found %v", want, g.callLog())
	}
	must(t, r.Heal(ctx, "stop-then-power-cut"))
	if s := g.State("n2"); s != cluster.Running {
		t.Fatalf("n2 after heal: expected running, found %s", s)
	}
	if gate.log != "close open" {
		t.Fatalf("gate: expected closed then opened, found %q", gate.log)
	}
	ops := readHistory(t, rec, path)
	p := recordedParams(t, ops, history.FStopPowerCut)
	if p.Exits["n2"].Code != 0 || len(p.Reports) != 1 || p.PowerCut == nil || p.PowerCut.Seed != st.Disk.PowerCut.Seed {
		t.Fatalf("recorded: expected n2's exit, its cut report and the drawn options, found %+v", p)
	}
	want := []string{
		"invoke stop-power-cut one n2", "invoke quiet before-cut", "ok quiet before-cut",
		"invoke heal-quiet before-cut", "ok heal-quiet before-cut", "ok stop-power-cut one n2",
		"invoke heal-stop-power-cut one n2", "ok heal-stop-power-cut one n2",
	}
	if got := summary(ops); !slices.Equal(got, want) {
		t.Fatalf("nemesis ops:\n%s\nexpected:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	ws, err := checker.FaultWindows(ops)
	must(t, err)
	if len(ws) != 2 || !ws[0].Healed || !ws[1].Healed {
		t.Fatalf("windows: expected a healed power cut and a healed quiet spell, found %+v", ws)
	}
}

type fakeGate struct{ log string }

func (f *fakeGate) Close() { f.log = strings.TrimSpace(f.log + " close") }
func (f *fakeGate) Open()  { f.log = strings.TrimSpace(f.log + " open") }

// The graceful kinds need graceful stops: a cluster without them is
// refused before anything is done, and a database without CapStop
// cannot take them.
func TestGracefulKindsNeedStops(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, _ := newRecorder(t)
	r := NewRunner(plainCluster{f}, rec, nil)
	err := r.Inject(ctx, Step{Kind: "stop", Targets: []string{"n2"}, Duration: time.Second})
	if err == nil || !strings.Contains(err.Error(), "needs graceful stops") {
		t.Fatalf("expected a refusal naming graceful stops, found %v", err)
	}
	if st := f.State("n2"); st != cluster.Running {
		t.Fatalf("n2: expected untouched, found %s", st)
	}
	caps := Capabilities{DB: "etcd", Has: []Capability{CapKill, CapLeader, CapDisk}}
	err = CheckMix([]string{"stop", "rolling-restart"}, caps)
	if err == nil || !strings.Contains(err.Error(), "stop needs stop") {
		t.Fatalf("CheckMix: expected stop refused for lacking CapStop, found %v", err)
	}
}

// Every graceful kind is listed (tidal-chaos faults), in its group, and
// in "all"; stop-then-power-cut only where faultfs can mount.
func TestGracefulKindsAreListedAndInAll(t *testing.T) {
	help := Help()
	for _, k := range []string{"stop", "restart-graceful", "rolling-restart", "stop-then-power-cut", "graceful"} {
		if !strings.Contains(help, "  "+k+" ") {
			t.Fatalf("help does not list %s:\n%s", k, help)
		}
	}
	all, err := ParseMixWith("all", 3, nil)
	must(t, err)
	g, err := ParseMixWith("graceful", 3, nil)
	must(t, err)
	for _, k := range []string{"stop", "restart-graceful", "rolling-restart", "stop-then-power-cut"} {
		if !slices.Contains(all, k) || !slices.Contains(g, k) {
			t.Fatalf("%s: expected in all %v and in graceful %v", k, all, g)
		}
	}
	noFUSE, err := ParseMixWith("all", 3, errors.New("/dev/fuse not found"))
	must(t, err)
	if slices.Contains(noFUSE, "stop-then-power-cut") || !slices.Contains(noFUSE, "stop") {
		t.Fatalf("all without FUSE: expected stop but not stop-then-power-cut, found %v", noFUSE)
	}
}
