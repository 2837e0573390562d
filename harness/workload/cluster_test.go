package workload

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/process"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// TestClusterLeaderKill runs the mixed workload through the relay mesh of
// a 3-process cluster, SIGKILLs the leader mid-run and restarts it, then
// checks the history with every checker the workload feeds. It is the
// one place the workload meets real indefinite outcomes.
func TestClusterLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-process cluster")
	}
	needServer(t)
	dir := t.TempDir()
	reg, err := process.NewRegistry(filepath.Join(dir, "pids"))
	if err != nil {
		t.Fatal(err)
	}
	be, err := process.NewBackend(serverBin, reg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.New(cluster.Config{Nodes: 3, Backend: be, Dir: filepath.Join(dir, "nodes"),
		Flags: []string{"--tick-interval=50ms"}, StatsInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatalf("cluster did not form: %v (logs under %s)", err, dir)
	}

	path := filepath.Join(dir, "history.jsonl")
	rec, err := history.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Kind: Mixed, Concurrency: 6, Duration: 5 * time.Second, Seed: 5, Keys: 3, Vectors: 4, Timeout: time.Second},
		FromCluster(c), rec)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	time.Sleep(1500 * time.Millisecond)
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	kill := rec.Invoke(history.Nemesis, history.FKill, history.FaultValue{Kind: "leader", Targets: []string{leader}}, "")
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	rec.Complete(kill, history.OK, nil, nil, 0, 0)
	time.Sleep(1500 * time.Millisecond)
	heal := rec.Invoke(history.Nemesis, history.HealOf(history.FKill), nil, "")
	if err := c.Start(leader); err != nil {
		t.Fatal(err)
	}
	rec.Complete(heal, history.OK, nil, nil, 0, 0)
	t.Logf("killed leader %s for 1.5s; progress %s", leader, w.Progress())

	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatalf("cluster did not converge after the heal: %v", err)
	}
	if err := w.FinalReads(ctx); err != nil {
		t.Fatal(err)
	}
	ops := closeHistory(t, rec, path, w)

	audits := map[string][]checker.AuditEntry{}
	for _, n := range c.Names() {
		var entries []checker.AuditEntry
		err := c.AdminClient(n).AuditEvents(ctx, func(l client.Location) error {
			entries = append(entries, checker.AuditEntry{ID: l.ID, Index: l.Index, Term: l.Term, Entity: l.Entity, Signal: l.Signal})
			return nil
		})
		if err != nil {
			t.Fatalf("audit of %s: %v", n, err)
		}
		audits[n] = entries
	}
	for _, r := range []checker.Result{
		checker.Ledger(ops, audits, nil),
		checker.Counter(ops),
		checker.Linearizable(ops, dir, time.Minute),
	} {
		t.Logf("%s: %s: %s", r.Name, r.Valid, r.Summary)
		mustValid(t, r)
	}
	t.Logf("%s", w.Progress())
}
