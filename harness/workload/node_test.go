package workload

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tidaldb/tidal/buildinfo/gobuild"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// serverBin is the tidal-server binary TestMain builds for the tests that
// run against a real node; buildErr says why there is none. A failed build
// fails those tests only: the ones against fake nodes still run.
var serverBin string
var buildErr error

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "workload-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	serverBin = filepath.Join(dir, "tidal-server")
	// Build from the module root so the test runs from any directory.
	root := filepath.Join("..", "..")
	build := gobuild.Command(context.Background(), root, gobuild.StampOf(root), serverBin, "./tidal-server")
	if out, err := build.CombinedOutput(); err != nil {
		buildErr = fmt.Errorf("building tidal-server: %v\n%s", err, out)
	}
	return m.Run()
}

func needServer(t *testing.T) {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startNode runs a single-node tidal-server in its own directory, waits
// until it is ready and kills it (by pid) when the test ends. It returns
// the node's client address.
func startNode(t *testing.T) string {
	t.Helper()
	needServer(t)
	dir := t.TempDir()
	addr := freeAddr(t)
	cmd := exec.Command(serverBin, "run",
		"--data-dir", filepath.Join(dir, "data"),
		"--client-addr", addr,
		"--peer-addr", freeAddr(t),
		"--log-file", filepath.Join(dir, "node.log"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", serverBin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(dir, "node.log")); err == nil {
				t.Logf("node log:\n%s", tail(log, 4000))
			}
		}
	})

	c := client.New(addr)
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ready(ctx)
		cancel()
		if err == nil {
			return addr
		}
		select {
		case err := <-exited:
			t.Fatalf("tidal-server at %s exited before it was ready: %v", addr, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tidal-server at %s: not ready after 30s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// audit fetches the node's /v1/audit/events as the ledger checker takes it.
func audit(t *testing.T, addr string) []checker.AuditEntry {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/v1/audit/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/audit/events: expected 200, found %s", resp.Status)
	}
	entries, err := checker.ReadAudit(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return entries
}

// runAgainst runs cfg against the node at addr with a fresh history and
// returns the workload and the history as read back from its file.
func runAgainst(t *testing.T, cfg Config, addr string, final bool) (*Workload, []history.Op) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "history.jsonl")
	rec, err := history.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(cfg, Addrs{"n1": addr}, rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if final {
		if err := w.FinalReads(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return w, closeHistory(t, rec, path, w)
}

// checkProgress compares the live counters with the history: they must
// agree exactly once the run is over.
func checkProgress(t *testing.T, p Progress, ops []history.Op) {
	t.Helper()
	want := map[string]Counts{}
	procs := map[history.Process]bool{}
	for _, op := range ops {
		if !op.Process.IsClient() {
			continue
		}
		c := want[op.F]
		switch op.Type {
		case history.Invoke:
			c.Invoked++
			procs[op.Process] = true
		case history.OK:
			c.OK++
		case history.Fail:
			c.Fail++
		case history.Info:
			c.Info++
		}
		want[op.F] = c
	}
	for f, c := range p.ByF {
		if c != want[f] {
			t.Errorf("progress of %s: counters say %+v, the history says %+v", f, c, want[f])
		}
	}
	if p.Processes < int64(len(procs)) {
		t.Errorf("progress: %d processes handed out, the history shows %d", p.Processes, len(procs))
	}
}

func checkOKWrites(t *testing.T, ops []history.Op, node string) {
	t.Helper()
	n := 0
	for _, op := range ops {
		if op.Type != history.OK || (op.F != history.FWrite && op.F != history.FAdd && op.F != history.FPutEmbedding) {
			continue
		}
		n++
		if op.Seq == 0 || op.Term == 0 || op.Node != node {
			t.Errorf("%s: expected an ok write with seq, term and node %s, found seq %d term %d node %q", op, node, op.Seq, op.Term, op.Node)
		}
	}
	if n == 0 {
		t.Errorf("expected ok writes in the history, found none")
	}
}

// counterModel is the aggregates checker's model as the runner builds it.
func counterModel(cfg Config) checker.SignalModel {
	return checker.SignalModel{Signal: CounterSignal, HalfLife: cfg.CounterHalfLife, Windows: cfg.CounterWindows}
}

func mustValid(t *testing.T, r checker.Result) {
	t.Helper()
	if r.Valid != checker.Valid {
		t.Errorf("checker %s: expected valid, found %s: %s", r.Name, r.Valid, r.Summary)
	}
}

func TestLedgerAgainstNode(t *testing.T) {
	addr := startNode(t)
	w, ops := runAgainst(t, Config{Kind: Ledger, Concurrency: 4, Duration: 2 * time.Second, Seed: 1}, addr, false)
	checkOKWrites(t, ops, "n1")
	r := checker.Ledger(ops, map[string][]checker.AuditEntry{"n1": audit(t, addr)}, nil)
	mustValid(t, r)
	d := r.Details.(checker.LedgerDetails)
	if d.Acked == 0 || d.Outcomes[history.OK] != int(w.Progress().ByF[history.FWrite].OK) {
		t.Errorf("ledger checker saw %d acked ids and %d ok writes; the workload counted %d ok writes",
			d.Acked, d.Outcomes[history.OK], w.Progress().ByF[history.FWrite].OK)
	}
	t.Logf("%s; ledger: %s", w.Progress(), r.Summary)
}

func TestCounterAgainstNode(t *testing.T) {
	addr := startNode(t)
	cfg := Config{Kind: Counter, Concurrency: 6, Duration: 2 * time.Second, Seed: 2, Select: LeaderOnly, Keys: 3}
	w, ops := runAgainst(t, cfg, addr, true)
	checkOKWrites(t, ops, "n1")
	mustValid(t, checker.Counter(ops))
	mustValid(t, checker.Linearizable(ops, t.TempDir(), time.Minute))
	// The real node's aggregates agree with the harness's own model.
	mustValid(t, checker.Aggregates(ops, counterModel(w.Config())))
	// Adds carry event ids: the ledger checker accounts for them too.
	mustValid(t, checker.Ledger(ops, map[string][]checker.AuditEntry{"n1": audit(t, addr)}, nil))

	// The final reads come last and saw every acknowledged add.
	acked, unknown := map[uint64]int64{}, map[uint64]int64{}
	pairs, _ := history.Pairs(ops)
	for _, p := range pairs {
		if p.Invoke.F != history.FAdd {
			continue
		}
		v, err := history.Decode[history.AddValue](p.Invoke)
		if err != nil {
			t.Fatal(err)
		}
		switch p.Type() {
		case history.OK:
			acked[v.Key] += v.Delta
		case history.Info:
			unknown[v.Key] += v.Delta
		}
	}
	keys := w.CounterKeys()
	tailReads := pairs[len(pairs)-len(keys):]
	for _, p := range tailReads {
		v, err := history.Decode[history.ReadValue](p.Completion)
		if err != nil || p.Invoke.F != history.FRead || v.Value == nil {
			t.Fatalf("expected the history to end with %d ok final reads, found %s (%v)", len(keys), p.Completion, err)
		}
		if lo, hi := acked[v.Key], acked[v.Key]+unknown[v.Key]; *v.Value < lo || *v.Value > hi {
			t.Errorf("final read of key %d: expected the acked sum %d plus at most %d of adds that ended info, found %d", v.Key, lo, hi-lo, *v.Value)
		}
	}
	t.Logf("%s", w.Progress())
}

func TestEmbeddingsAgainstNode(t *testing.T) {
	addr := startNode(t)
	w, ops := runAgainst(t, Config{Kind: Embeddings, Concurrency: 4, Duration: 2 * time.Second, Seed: 3, Vectors: 4}, addr, true)
	checkOKWrites(t, ops, "n1")
	// Every get returns nothing or the hash of a put that was not failed.
	puts := map[uint64]map[string]bool{}
	pairs, err := history.Pairs(ops)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pairs {
		if p.Invoke.F == history.FPutEmbedding && p.Type() != history.Fail {
			v, _ := history.Decode[history.PutEmbeddingValue](p.Invoke)
			if puts[v.Entity] == nil {
				puts[v.Entity] = map[string]bool{}
			}
			puts[v.Entity][v.Hash] = true
		}
	}
	gets := 0
	for _, p := range pairs {
		if p.Invoke.F != history.FGetEmbedding || p.Type() != history.OK {
			continue
		}
		v, err := history.Decode[history.GetEmbeddingValue](p.Completion)
		if err != nil {
			t.Fatal(err)
		}
		if v.Hash != "" {
			gets++
			if !puts[v.Entity][v.Hash] {
				t.Errorf("%s: read hash %s on entity %d, which no put wrote", p.Completion, v.Hash, v.Entity)
			}
		}
	}
	if gets == 0 {
		t.Errorf("expected gets that found an embedding, found none")
	}
	mustValid(t, checker.Embeddings(ops, []string{"n1"}))
	t.Logf("%s", w.Progress())
}

func TestMixedOpenLoopAgainstNode(t *testing.T) {
	addr := startNode(t)
	cfg := Config{Kind: Mixed, Concurrency: 4, Rate: 150, Duration: 2 * time.Second, Seed: 4, Select: Random, Dim: 1536}
	w, ops := runAgainst(t, cfg, addr, true)
	checkOKWrites(t, ops, "n1")
	mustValid(t, checker.Ledger(ops, map[string][]checker.AuditEntry{"n1": audit(t, addr)}, nil))
	mustValid(t, checker.Counter(ops))
	mustValid(t, checker.Linearizable(ops, t.TempDir(), time.Minute))
	mustValid(t, checker.Aggregates(ops, counterModel(w.Config())))
	mustValid(t, checker.Embeddings(ops, []string{"n1"}))
	p := w.Progress()
	finalReads := len(w.CounterKeys()) + len(w.gen.embeddingEntities())
	offered := p.Total().Invoked + p.Shed - int64(finalReads)
	if most := int64(cfg.Rate*cfg.Duration.Seconds()) + 1; offered > most || offered < 1 {
		t.Errorf("open loop at %g/s for %s: expected 1..%d ops offered (run + shed), found %d", cfg.Rate, cfg.Duration, most, offered)
	}
	for _, f := range []string{history.FWrite, history.FAdd, history.FRead, history.FPutEmbedding, history.FGetEmbedding} {
		if p.ByF[f].OK == 0 {
			t.Errorf("mixed workload: expected ok %s ops, found none (%s)", f, p)
		}
	}
	t.Logf("%s", p)
}
