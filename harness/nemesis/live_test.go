package nemesis

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidaldb/tidal/buildinfo/gobuild"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/process"
	"github.com/tidaldb/tidal/tcp-relay/mesh"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// serverBin is the tidal-server built for the live tests ("" under -short).
var serverBin string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "nemesis-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	serverBin = filepath.Join(dir, "tidal-server")
	root := "../.." // the repository root
	cmd := gobuild.Command(context.Background(), root, gobuild.StampOf(root), serverBin, "./tidal-server")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build ./tidal-server: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type liveRun struct {
	c    *cluster.Cluster
	r    *Runner
	rec  *history.Recorder
	path string
	ids  atomic.Int64
}

// startLive starts 3 real tidal-server processes behind a relay mesh and a
// runner recording into a fresh history.
func startLive(t *testing.T) *liveRun {
	t.Helper()
	if serverBin == "" {
		t.Skip("live nemesis test: starts real tidal-server processes; skipped under -short")
	}
	// Node logs outlive a failed test, so the failure can be read.
	dir, err := os.MkdirTemp("", "nemesis-"+t.Name()+"-")
	must(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	var c *cluster.Cluster
	for attempt := 1; ; attempt++ {
		var clash bool
		c, clash, err = formCluster(filepath.Join(dir, fmt.Sprint(attempt)))
		if err == nil {
			break
		}
		if !clash || attempt == 3 {
			t.Fatalf("cluster did not form: %v (logs in %s)", err, dir)
		}
		// cluster.New picks ports that are free when asked; on a
		// busy machine another listener can take it before the node binds.
		t.Logf("cluster attempt %d: a node's port was taken (%v); starting a new cluster", attempt, err)
	}
	t.Cleanup(func() { c.Close() })
	rec, path := newRecorder(t)
	r := NewRunner(Live(c), rec, slog.New(slog.NewTextHandler(t.Output(), nil)))
	r.RecoveryTimeout = 20 * time.Second
	return &liveRun{c: c, r: r, rec: rec, path: path}
}

// formCluster starts 3 nodes in dir and waits for them to converge. clash
// reports a node that could not bind its port.
func formCluster(dir string) (c *cluster.Cluster, clash bool, err error) {
	reg, err := process.NewRegistry(filepath.Join(dir, "pids"))
	if err != nil {
		return nil, false, err
	}
	be, err := process.NewBackend(serverBin, reg)
	if err != nil {
		return nil, false, err
	}
	c, err = cluster.New(cluster.Config{Nodes: 3, Backend: be, Dir: filepath.Join(dir, "nodes"),
		Flags: []string{"--tick-interval=50ms", "--election-ticks=10"}, StatsInterval: -1, ClockControl: true})
	if err != nil {
		return nil, false, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.WaitConverged(ctx) }()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err = <-done:
			if err == nil {
				return c, false, nil
			}
			c.Close()
			return nil, portClash(dir), err
		case <-tick.C:
			if portClash(dir) {
				cancel()
				<-done
				c.Close()
				return nil, true, errors.New("a node could not bind its port")
			}
		}
	}
}

func portClash(dir string) bool {
	for _, n := range []string{"n1", "n2", "n3"} {
		for _, log := range []string{"node.log", "stdout.log"} {
			out, _ := os.ReadFile(filepath.Join(dir, "nodes", n, log))
			if strings.Contains(string(out), "address already in use") {
				return true
			}
		}
	}
	return false
}

// write sends one signal through node's client relay, as a workload client
// would, and returns how long it took.
func (l *liveRun) write(ctx context.Context, node string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	begin := time.Now()
	_, err := l.c.Client(node).WriteSignals(ctx, []client.Event{{ID: fmt.Sprintf("w%d", l.ids.Add(1)), Entity: 1, Signal: "view"}})
	return time.Since(begin), err
}

func (l *liveRun) leader(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	name, err := l.c.WaitLeader(ctx)
	must(t, err)
	return name
}

// newLeaderOtherThan waits for a leader agreed by a majority that is not old.
func (l *liveRun) newLeaderOtherThan(t *testing.T, old string) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		name, err := l.c.WaitLeader(ctx)
		cancel()
		if err == nil && name != old {
			return name
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("expected the others to elect a leader other than %s within 15s", old)
	return ""
}

// healAndCheck heals everything, checks the cluster converged and takes
// writes on every node, and returns the history's nemesis ops and windows.
func (l *liveRun) healAndCheck(t *testing.T) ([]string, []checker.FaultWindow) {
	t.Helper()
	ctx := context.Background()
	if err := l.r.HealAll(ctx); err != nil {
		t.Fatalf("heal all: %v", err)
	}
	for _, n := range l.c.Names() {
		if st := l.c.State(n); st != cluster.Running {
			t.Fatalf("after heal-all: expected %s running, found %s", n, st)
		}
		if _, err := l.write(ctx, n); err != nil {
			t.Fatalf("after heal-all: write via %s: %v", n, err)
		}
	}
	ops := readHistory(t, l.rec, l.path)
	w, err := checker.FaultWindows(ops)
	must(t, err)
	return summary(ops), w
}

func TestLiveIsolateLeader(t *testing.T) {
	l := startLive(t)
	ctx := context.Background()
	old := l.leader(t)
	must(t, l.r.Inject(ctx, Step{Kind: "isolate-leader"}))
	// The majority side elects a new leader and keeps taking writes.
	now := l.newLeaderOtherThan(t, old)
	if _, err := l.write(ctx, now); err != nil {
		t.Fatalf("write via the new leader %s while %s is isolated: %v", now, old, err)
	}
	got, windows := l.healAndCheck(t)
	want := []string{
		"invoke partition isolate-leader " + old, "ok partition isolate-leader " + old,
		"invoke heal-all all n1,n2,n3", "ok heal-all all n1,n2,n3",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("nemesis ops: expected %v, found %v", want, got)
	}
	if len(windows) != 1 || windows[0].Label() != "partition(isolate-leader)" || !windows[0].Healed || windows[0].Effective < windows[0].Start {
		t.Fatalf("expected one healed isolate-leader window, found %v", windows)
	}
}

func TestLiveKillLeader(t *testing.T) {
	l := startLive(t)
	ctx := context.Background()
	old := l.leader(t)
	must(t, l.r.Inject(ctx, Step{Kind: "kill-leader"}))
	if st := l.c.State(old); st != cluster.Killed {
		t.Fatalf("expected %s killed, found %s", old, st)
	}
	now := l.newLeaderOtherThan(t, old)
	if _, err := l.write(ctx, now); err != nil {
		t.Fatalf("write via the new leader %s while %s is dead: %v", now, old, err)
	}
	must(t, l.r.Heal(ctx, "kill-leader"))
	got, _ := l.healAndCheck(t)
	want := []string{
		"invoke kill leader " + old, "ok kill leader " + old,
		"invoke heal-kill leader " + old, "ok heal-kill leader " + old,
		"invoke heal-all all n1,n2,n3", "ok heal-all all n1,n2,n3",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("nemesis ops: expected %v, found %v", want, got)
	}
}

func TestLivePauseOne(t *testing.T) {
	l := startLive(t)
	ctx := context.Background()
	lead := l.leader(t)
	var follower string
	for _, n := range l.c.Names() {
		if n != lead {
			follower = n
			break
		}
	}
	must(t, l.r.Inject(ctx, Step{Kind: "pause-one", Targets: []string{follower}}))
	if st := l.c.State(follower); st != cluster.Paused {
		t.Fatalf("expected %s paused, found %s", follower, st)
	}
	// The leader and the other follower are a majority.
	if _, err := l.write(ctx, lead); err != nil {
		t.Fatalf("write via %s while %s is paused: %v", lead, follower, err)
	}
	got, windows := l.healAndCheck(t)
	want := []string{
		"invoke pause one " + follower, "ok pause one " + follower,
		"invoke heal-all all n1,n2,n3", "ok heal-all all n1,n2,n3",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("nemesis ops: expected %v, found %v", want, got)
	}
	if len(windows) != 1 || !windows[0].Healed {
		t.Fatalf("expected one healed pause window, found %v", windows)
	}
}

func TestLiveSlowLinks(t *testing.T) {
	l := startLive(t)
	ctx := context.Background()
	lead := l.leader(t)
	const latency = 150 * time.Millisecond
	cfg := ScheduleConfig{Latency: latency}.withDefaults()
	cfg.Jitter = 0
	must(t, l.r.Inject(ctx, Step{Kind: "slow-links", Link: cfg.linkSpec("slow-links")}))
	// A write commits only once a follower has the entry: the append
	// crosses a slowed link, so the write cannot be faster than the latency.
	took, err := l.write(ctx, lead)
	if err != nil {
		t.Fatalf("write via %s over slow links: %v", lead, err)
	}
	if took < latency {
		t.Fatalf("write over links with %s latency took only %s", latency, took)
	}
	must(t, l.r.Heal(ctx, "slow-links"))
	got, windows := l.healAndCheck(t)
	want := []string{
		"invoke slow latency", "ok slow latency",
		"invoke heal-slow latency", "ok heal-slow latency",
		"invoke heal-all all n1,n2,n3", "ok heal-all all n1,n2,n3",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("nemesis ops: expected %v, found %v", want, got)
	}
	if len(windows) != 1 || windows[0].F != history.FSlow || !windows[0].Healed {
		t.Fatalf("expected one healed slow window, found %v", windows)
	}
	for _, rl := range l.c.Mesh().(*mesh.Mesh).Relays() {
		if fs := rl.Faults(); len(fs) > 0 {
			t.Fatalf("after heal: relay %s still has faults %v", rl.Name(), fs)
		}
	}
}

// A schedule of instant and lasting faults of three classes runs end to end
// against real processes and leaves a converged cluster.
func TestLiveRunSchedule(t *testing.T) {
	l := startLive(t)
	ctx := context.Background()
	s := Schedule{Seed: 5, Config: ScheduleConfig{Duration: 3 * time.Second, Nodes: l.c.Names()}, Steps: []Step{
		{At: 200 * time.Millisecond, Kind: "transfer-leader", Targets: []string{"n3", "n2", "n1"}},
		// member-churn is not here: under heavy load the cluster's 2s admin
		// timeout can expire on a removal that still commits, and
		// cluster.RemoveMember then cannot be told the member is gone.
		{At: 800 * time.Millisecond, Kind: "kill-one", Targets: []string{"n2"}, Duration: 1500 * time.Millisecond},
		{At: 1 * time.Second, Kind: "bridge", Targets: []string{"n1", "n3", "n2"}, Duration: time.Second},
	}}
	must(t, s.Validate())
	if err := l.r.Run(ctx, s); err != nil {
		t.Fatalf("run: %v", err)
	}
	ops := readHistory(t, l.rec, l.path)
	got := summary(ops)
	var oks []string
	for _, line := range got {
		if strings.HasPrefix(line, "ok ") {
			oks = append(oks, strings.Fields(line)[1])
		}
	}
	want := []string{"transfer-leader", "kill", "partition", "heal-partition", "heal-kill", "heal-all"}
	if !slices.Equal(oks, want) {
		t.Fatalf("expected every fault and heal ok in order %v, found:\n%s", want, strings.Join(got, "\n"))
	}
	for _, n := range l.c.Names() {
		if st := l.c.State(n); st != cluster.Running {
			t.Fatalf("after the run: expected %s running, found %s", n, st)
		}
	}
	for _, n := range l.c.Names() {
		if _, err := l.write(ctx, n); err != nil {
			t.Fatalf("after the run: write via %s: %v", n, err)
		}
	}
}
