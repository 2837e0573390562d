package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// fakeTargets serves ops from httptest servers on 127.0.0.1, so a test
// decides exactly how each request is answered.
type fakeTargets struct {
	names  []string
	addrs  map[string]string
	leader atomic.Pointer[string]
}

func newFake(t testing.TB, handlers ...http.HandlerFunc) *fakeTargets {
	f := &fakeTargets{addrs: map[string]string{}}
	for i, h := range handlers {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		name := fmt.Sprintf("n%d", i+1)
		f.names = append(f.names, name)
		f.addrs[name] = srv.URL
	}
	return f
}

func (f *fakeTargets) Names() []string { return f.names }
func (f *fakeTargets) Client(name string, opts ...client.Option) *client.Client {
	return client.New(f.addrs[name], opts...)
}
func (f *fakeTargets) Leader(context.Context) string {
	if l := f.leader.Load(); l != nil {
		return *l
	}
	return ""
}
func (f *fakeTargets) setLeader(n string) { f.leader.Store(&n) }

func ack(w http.ResponseWriter, seq uint64) {
	w.Header().Set("X-Tidal-Seq", fmt.Sprint(seq))
	w.Header().Set("X-Tidal-Term", "7")
	w.Header().Set("X-Tidal-Node", "1")
	w.WriteHeader(http.StatusNoContent)
}

func apiError(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%q,"message":"test says so"}}`, code)
}

// record runs cfg against targets and returns the workload and its
// history, checked by history.Pairs.
func record(t *testing.T, cfg Config, targets Targets, final bool) (*Workload, []history.Op, error) {
	t.Helper()
	return recordWith(t, cfg, targets, nil, final)
}

// recordWith is record with before(w) called ahead of the run.
func recordWith(t *testing.T, cfg Config, targets Targets, before func(*Workload), final bool) (*Workload, []history.Op, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "history.jsonl")
	rec, err := history.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(cfg, targets, rec)
	if err != nil {
		t.Fatal(err)
	}
	if before != nil {
		before(w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	var finalErr error
	if final {
		finalErr = w.FinalReads(ctx)
	}
	ops := closeHistory(t, rec, path, w)
	return w, ops, finalErr
}

// closeHistory closes rec, reads back the history it wrote to path, and
// checks that it pairs up and agrees with w's live counters.
func closeHistory(t *testing.T, rec *history.Recorder, path string, w *Workload) []history.Op {
	t.Helper()
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	ops, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := history.Pairs(ops); err != nil {
		t.Fatalf("history.Pairs refused the workload's history: %v", err)
	}
	checkProgress(t, w.Progress(), ops)
	return ops
}

// checkGoroutines fails the test if goroutines started after the call
// outlive the test's servers and runs. Call it first: cleanups run last
// in, first out, so its check runs after the servers have closed.
func checkGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() { waitGoroutines(t, before) })
}

func waitGoroutines(t *testing.T, before int) {
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("expected at most %d goroutines after the run, found %d:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestProcessRetirement answers writes in turn ok, 504, 400 and not at
// all (the attempt times out), and checks the Jepsen process rules: 504s
// and timeouts are info and retire the process, 400s are fail and do not,
// ok writes carry the ack.
func TestProcessRetirement(t *testing.T) {
	checkGoroutines(t)
	var n atomic.Uint64
	fake := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch i := n.Add(1) - 1; i % 4 {
		case 0:
			ack(w, 100+i)
		case 1:
			apiError(w, http.StatusGatewayTimeout, client.CodeTimeout)
		case 2:
			apiError(w, http.StatusBadRequest, client.CodeInvalidArgument)
		default:
			<-r.Context().Done() // the client's per-attempt timeout ends it
		}
	})
	cfg := Config{Kind: Ledger, Concurrency: 3, Duration: 600 * time.Millisecond, Timeout: 100 * time.Millisecond, Attempts: 1}
	w, ops, _ := record(t, cfg, fake, false)

	infos, timeouts := 0, 0
	var fails, oks int
	lastOp := map[history.Process]history.Op{}
	for _, op := range ops {
		if prev, ok := lastOp[op.Process]; ok && prev.Type == history.Info {
			t.Fatalf("%s: process %s invoked again after its info op %d", op, op.Process, prev.Index)
		}
		lastOp[op.Process] = op
		switch op.Type {
		case history.OK:
			oks++
			if op.Seq < 100 || op.Term != 7 || op.Node != "n1" {
				t.Errorf("%s: expected the ack's seq (>= 100), term 7 and node n1, found seq %d term %d node %q", op, op.Seq, op.Term, op.Node)
			}
		case history.Fail:
			fails++
			if !strings.Contains(op.Error, "400") {
				t.Errorf("%s: expected fail only for the 400, found error %q", op, op.Error)
			}
		case history.Info:
			infos++
			if strings.Contains(op.Error, "timed out") || strings.Contains(op.Error, "deadline") {
				timeouts++
			} else if !strings.Contains(op.Error, "504") {
				t.Errorf("%s: expected info only for a 504 or a timeout, found error %q", op, op.Error)
			}
		}
		if op.Type != history.OK && (op.Seq != 0 || op.Term != 0) {
			t.Errorf("%s: expected no seq or term on a write that was not acknowledged, found %d/%d", op, op.Seq, op.Term)
		}
	}
	if oks == 0 || fails == 0 || infos == 0 || timeouts == 0 {
		t.Fatalf("expected ok, fail, 504 info and timeout info outcomes, found ok %d fail %d info %d (timeouts %d)", oks, fails, infos, timeouts)
	}
	// Every worker starts with a process and takes a new one per info.
	if got, want := w.Progress().Processes, int64(cfg.Concurrency+infos); got != want {
		t.Errorf("expected %d workers + %d infos = %d process ids, found %d", cfg.Concurrency, infos, want, got)
	}
}

// TestRetryThatSucceedsIsOK answers the first attempt of every write 504
// and its retry 204: with one retry allowed, every op is ok, and the retry
// carried the same ids (the same body).
func TestRetryThatSucceedsIsOK(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	fake := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen[string(body)]++
		first := seen[string(body)] == 1
		mu.Unlock()
		if first {
			apiError(w, http.StatusGatewayTimeout, client.CodeTimeout)
			return
		}
		ack(w, 1)
	})
	cfg := Config{Kind: Ledger, Concurrency: 2, Duration: 300 * time.Millisecond, Attempts: 2, MaxBatch: 3}
	w, _, _ := record(t, cfg, fake, false)
	c := w.Progress().ByF[history.FWrite]
	if c.Invoked == 0 || c.OK != c.Invoked {
		t.Errorf("expected every write ok after its retry, found %+v", c)
	}
	mu.Lock()
	defer mu.Unlock()
	if int64(len(seen)) != c.Invoked {
		t.Errorf("expected %d distinct request bodies (one per op), found %d", c.Invoked, len(seen))
	}
	for body, k := range seen {
		if k != 2 {
			t.Errorf("expected each write sent exactly twice with the same body, found %d sends of %s", k, body)
		}
	}
}

// TestOpenLoopSheds offers 200 ops/s to two workers whose requests take
// 100ms each: the excess is shed, never queued or run concurrently.
func TestOpenLoopSheds(t *testing.T) {
	checkGoroutines(t)
	var inFlight, maxInFlight atomic.Int64
	fake := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-r.Context().Done():
		}
		ack(w, 1)
	})
	cfg := Config{Kind: Ledger, Concurrency: 2, Rate: 200, Duration: 500 * time.Millisecond}
	w, _, _ := record(t, cfg, fake, false)
	p := w.Progress()
	total := p.Total().Invoked
	if m := maxInFlight.Load(); m > int64(cfg.Concurrency) {
		t.Errorf("expected at most %d requests in flight, found %d", cfg.Concurrency, m)
	}
	// Ops are due at 0, 1/Rate, ...; none due at or past the end of
	// Duration is offered (the generator starts after Duration's clock
	// does), so at most Rate·Duration are offered, however late the
	// generator runs (see TestScheduleStopsAtDeadline).
	if most := int64(cfg.Rate * cfg.Duration.Seconds()); p.Shed == 0 || total == 0 || total+p.Shed > most {
		t.Errorf("expected ops and shed ops, at most %d offered in all, found %d invoked and %d shed", most, total, p.Shed)
	}
}

// lateContext has a deadline but never reports it passed until released:
// a context whose deadline timer a loaded runtime has not yet run.
type lateContext struct {
	context.Context
	deadline time.Time
}

func (c lateContext) Deadline() (time.Time, bool) { return c.deadline, true }

// TestScheduleStopsAtDeadline pins the TestOpenLoopSheds flake:
// the open-loop generator offered ops due after the run's deadline while
// the context's own timer had not fired yet, up to 104 in a run allowed
// 100. With a context that never says it is done, the generator must
// stop by itself at the deadline, having offered at most Rate·span ops.
func TestScheduleStopsAtDeadline(t *testing.T) {
	w := &Workload{cfg: Config{Rate: 1000}}
	release, cancel := context.WithCancel(context.Background())
	defer cancel()
	span := 50 * time.Millisecond
	ctx := lateContext{Context: release, deadline: time.Now().Add(span)}
	jobs := make(chan struct{})
	var received atomic.Int64
	go func() {
		for range jobs {
			received.Add(1)
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		schedule(ctx, jobs, w.cfg.Rate, func() { w.progress.shed.Add(1) })
		close(jobs)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // liveness bound only
		cancel()
		<-done
		t.Fatalf("expected the generator to stop at its deadline by itself; it ran until cancelled, offering %d ops (at most %d due before the deadline)",
			received.Load()+w.progress.shed.Load(), int64(span.Seconds()*w.cfg.Rate))
	}
	if offered, most := received.Load()+w.progress.shed.Load(), int64(span.Seconds()*w.cfg.Rate); offered > most {
		t.Fatalf("expected at most %d ops offered before the deadline, found %d", most, offered)
	}
}

func okEverything(hits *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		ack(w, 1)
	}
}

func TestRoundRobin(t *testing.T) {
	var hits [3]atomic.Int64
	fake := newFake(t, okEverything(&hits[0]), okEverything(&hits[1]), okEverything(&hits[2]))
	_, ops, _ := record(t, Config{Kind: Ledger, Concurrency: 1, Duration: 200 * time.Millisecond}, fake, false)
	i := 0
	for _, op := range ops {
		if op.Type != history.Invoke {
			continue
		}
		if want := fake.names[i%3]; op.Node != want {
			t.Fatalf("%s: expected round-robin node %s, found %s", op, want, op.Node)
		}
		i++
	}
	if i < 3 {
		t.Fatalf("expected at least 3 ops in 200ms, found %d", i)
	}
}

func TestRandomSelection(t *testing.T) {
	var hits [3]atomic.Int64
	fake := newFake(t, okEverything(&hits[0]), okEverything(&hits[1]), okEverything(&hits[2]))
	record(t, Config{Kind: Ledger, Concurrency: 2, Duration: 300 * time.Millisecond, Select: Random, Seed: 9}, fake, false)
	for i := range hits {
		if hits[i].Load() == 0 {
			t.Errorf("random selection: expected every node to get ops, n%d got none (%d, %d, %d)", i+1, hits[0].Load(), hits[1].Load(), hits[2].Load())
		}
	}
}

// TestLeaderOnly starts with n2 leading; n2 then starts refusing (503)
// and n3 takes over. Ops follow the hint: none reach n1, and once n2
// fails they move to n3.
func TestLeaderOnly(t *testing.T) {
	checkGoroutines(t)
	var hits [3]atomic.Int64
	var deposed atomic.Bool
	n2 := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		hits[1].Add(1)
		if deposed.Load() {
			apiError(w, http.StatusServiceUnavailable, client.CodeUnavailable)
			return
		}
		ack(w, 1)
	}
	fake := newFake(t, okEverything(&hits[0]), n2, okEverything(&hits[2]))
	fake.setLeader("n2")
	time.AfterFunc(300*time.Millisecond, func() {
		fake.setLeader("n3")
		deposed.Store(true)
	})
	_, ops, _ := record(t, Config{Kind: Ledger, Concurrency: 2, Duration: 900 * time.Millisecond, Select: LeaderOnly, Attempts: 1}, fake, false)
	if hits[0].Load() != 0 || hits[1].Load() == 0 || hits[2].Load() == 0 {
		t.Errorf("expected ops on n2, then n3, never n1; found n1 %d, n2 %d, n3 %d", hits[0].Load(), hits[1].Load(), hits[2].Load())
	}
	if last := ops[len(ops)-1]; last.Node != "n3" {
		t.Errorf("expected the last op to go to the new leader n3, found %s to %s", last, last.Node)
	}
}

// TestFinalReads answers the first read of every path on every node 504
// and the next one with a value. Every counter key handed out ends with an
// ok linearizable read; every embedding entity ends with an ok local read
// from each node (the final reads per node come from each
// node); infos retire the reading process; keys and entities that never
// read ok are named in the error.
func TestFinalReads(t *testing.T) {
	var mu sync.Mutex
	reads := map[string]int{}
	vec := []float32{1, 2, 3}
	handler := func(node string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				_, _ = io.Copy(io.Discard, r.Body)
				ack(w, 1)
				return
			}
			mu.Lock()
			reads[node+r.URL.Path]++
			n := reads[node+r.URL.Path]
			mu.Unlock()
			if n == 1 {
				apiError(w, http.StatusGatewayTimeout, client.CodeTimeout)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			switch r.URL.Query().Get("consistency") {
			case "linearizable":
				json.NewEncoder(w).Encode(map[string]any{"at": 1, "signals": map[string]any{CounterSignal: map[string]any{"weight_sum": 42, "count": 9}}})
			case "local":
				json.NewEncoder(w).Encode(map[string]any{"applied_index": 7, "embedding": vec})
			default:
				apiError(w, http.StatusBadRequest, client.CodeInvalidArgument)
			}
		}
	}
	fake := newFake(t, handler("n1"), handler("n2"))
	cfg := Config{Kind: Mixed, Keys: 3, Vectors: 2, Attempts: 1, Duration: time.Nanosecond}
	handOut := func(w *Workload) {
		for i := range w.cfg.Keys {
			w.gen.keys.take(i)
		}
		w.gen.writeOnce.Store(2)
	}
	w, ops, err := recordWith(t, cfg, fake, handOut, true)
	if err != nil {
		t.Fatal(err)
	}
	okKeys := map[uint64]int64{}
	okEntities := map[string]bool{} // node/entity
	infos := 0
	for _, op := range ops {
		if op.Type == history.Info {
			infos++
		}
		if op.Type != history.OK {
			continue
		}
		switch op.F {
		case history.FRead:
			v, err := history.Decode[history.ReadValue](op)
			if err != nil || v.Value == nil || v.Stats == nil || v.Stats.Count != 9 || v.Stats.ReturnedMS == 0 {
				t.Fatalf("%s: expected a read value with stats, found %s (%v)", op, op.Value, err)
			}
			okKeys[v.Key] = *v.Value
		case history.FGetEmbedding:
			v, err := history.Decode[history.GetEmbeddingValue](op)
			if err != nil || !v.Local || v.AppliedIndex != 7 || v.Hash != VectorHash(vec) {
				t.Fatalf("%s: expected a local read at applied index 7 of the vector's hash, found %s (%v)", op, op.Value, err)
			}
			okEntities[fmt.Sprintf("%s/%d", op.Node, v.Entity)] = true
		}
	}
	keys := w.CounterKeys()
	if len(keys) < cfg.Keys {
		t.Fatalf("expected at least the %d keys handed out, found %v", cfg.Keys, keys)
	}
	for _, k := range keys {
		if v, ok := okKeys[k]; !ok || v != 42 {
			t.Errorf("key %d: expected an ok final read of 42, found %v (present %v)", k, v, ok)
		}
	}
	entities := w.gen.embeddingEntities()
	if len(entities) != cfg.Vectors+2 {
		t.Fatalf("expected %d overwritten and 2 write-once entities, found %v", cfg.Vectors, entities)
	}
	for _, node := range fake.names {
		for _, e := range entities {
			if !okEntities[fmt.Sprintf("%s/%d", node, e)] {
				t.Errorf("entity %d: expected an ok local final read from %s, found none", e, node)
			}
		}
	}
	if want := len(keys) + len(entities)*len(fake.names); infos < want {
		t.Errorf("expected the first read of each of %d paths and nodes to end info, found %d infos", want, infos)
	}

	down := newFake(t, func(w http.ResponseWriter, r *http.Request) {
		apiError(w, http.StatusServiceUnavailable, client.CodeUnavailable)
	})
	_, _, err = recordWith(t, Config{Kind: Mixed, Keys: 2, Vectors: 1, Attempts: 1, Duration: time.Nanosecond}, down, handOut, true)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("counter key %d", CounterBase+1)) || !strings.Contains(err.Error(), fmt.Sprintf("embedding entity %d on n1", EmbeddingBase)) {
		t.Errorf("expected an error naming the keys and entities without an ok read, found %v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, `expected one of ledger, counter, embeddings, mixed, found ""`},
		{Config{Kind: Ledger, Select: "nearest"}, `expected one of round-robin, random, leader, found "nearest"`},
		{Config{Kind: Counter, ReadRatio: 1.5}, "read ratio: expected a share in (0, 1), found 1.5"},
		{Config{Kind: Ledger, Concurrency: -1}, "concurrency: expected at least 1, found -1"},
		{Config{Kind: Ledger, Rate: -3}, "rate: expected 0 (closed loop) or ops/s > 0, found -3"},
	} {
		_, err := c.cfg.WithDefaults()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: expected an error containing %q, found %v", c.cfg, c.want, err)
		}
	}
	cfg, err := Config{Kind: Mixed}.WithDefaults()
	if err != nil || cfg.Timeout != 2*time.Second || cfg.Attempts != 2 || cfg.Select != RoundRobin || cfg.Concurrency != 8 {
		t.Errorf("defaults: expected 2s timeout, 2 attempts, round-robin, 8 workers, found %+v (%v)", cfg, err)
	}
}

func TestVectorHash(t *testing.T) {
	a := []float32{1, 2, 3}
	if VectorHash(a) != VectorHash([]float32{1, 2, 3}) || VectorHash(a) == VectorHash([]float32{1, 2, 3.0000002}) {
		t.Errorf("expected equal vectors to hash equal and a one-ulp change to differ")
	}
	if h := VectorHash(a); len(h) != 16 {
		t.Errorf("expected a 16-hex-digit hash, found %q", h)
	}
}
