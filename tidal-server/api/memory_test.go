package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// fakeMemory is a memory reading tests set by hand.
type fakeMemory struct {
	mu    sync.Mutex
	m     Memory
	reads int
}

func (f *fakeMemory) read() Memory {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	return f.m
}

func (f *fakeMemory) set(m Memory) {
	f.mu.Lock()
	f.m = m
	f.mu.Unlock()
}

// TestMemoryBoundRefusesEmbeddingWrites: above the bound an embedding
// write is refused before it reaches the backend, with 503, Retry-After,
// the memory_limit code and a message naming RSS, vector bytes and the
// bound, and is counted as shed for "memory"; signals and reads go on;
// once memory falls below the bound embedding writes are admitted again.
func TestMemoryBoundRefusesEmbeddingWrites(t *testing.T) {
	clock := newFakeClock()
	mem := &fakeMemory{m: Memory{RSS: 100 << 20, VectorBytes: 10 << 20}}
	e := newEnv(t, Options{MaxMemory: 1 << 30, monotonic: clock.now, memory: mem.read})
	put := func(id string) *http.Response {
		rec := e.do(http.MethodPut, "/v1/entities/7/embedding", "application/json", `{"id":"`+id+`","vector":[1,0,0,0]}`)
		return rec.Result()
	}
	if r := put("below"); r.StatusCode != http.StatusNoContent {
		t.Fatalf("RSS 100 MiB + 10 MiB of vectors under a 1 GiB bound: expected 204, found %d", r.StatusCode)
	}

	// RSS 900 MiB + 400 MiB for the next snapshot's copies of the vectors
	// would pass 1 GiB.
	mem.set(Memory{RSS: 900 << 20, VectorBytes: 200 << 20, IndexOverhead: 3 << 20, SnapshotBytesHeld: 150 << 20})
	clock.advance(memoryReadEvery)
	calls := e.fake.writeCalls.Load()
	rec := e.do(http.MethodPut, "/v1/entities/7/embedding", "application/json", `{"id":"above","vector":[1,0,0,0]}`)
	wantError(t, rec, http.StatusServiceUnavailable, CodeMemory, "")
	if ra := rec.Header().Get("Retry-After"); ra != "5" {
		t.Fatalf("Retry-After %q, want 5", ra)
	}
	var body errorBody
	json.Unmarshal(rec.Body.Bytes(), &body)
	for _, want := range []string{"RSS 900 MiB", "200 MiB of vectors", "--max-memory 1 GiB", "signals and reads are still served"} {
		if !strings.Contains(body.Error.Message, want) {
			t.Errorf("refusal message: expected %q in %q", want, body.Error.Message)
		}
	}
	if e.fake.writeCalls.Load() != calls {
		t.Fatal("an embedding write refused by the memory bound reached the backend")
	}
	if got := metricValue(t, e, `tidal_http_shed_total{reason="memory"}`); got != 1 {
		t.Fatalf(`tidal_http_shed_total{reason="memory"} = %v, want 1`, got)
	}

	// Signals and reads are not refused by the memory bound.
	want204(t, e.post("/v1/signals", `{"events":[{"id":"s1","entity":7,"signal":"view"}]}`))
	if rec := e.get("/v1/entities/7?consistency=local"); rec.Code != http.StatusOK {
		t.Fatalf("a read above the memory bound: expected 200, found %d: %s", rec.Code, rec.Body)
	}

	// Memory falls (a snapshot replaced, a GC ran): admitted again.
	mem.set(Memory{RSS: 500 << 20, VectorBytes: 200 << 20})
	clock.advance(memoryReadEvery)
	if r := put("again"); r.StatusCode != http.StatusNoContent {
		t.Fatalf("RSS 500 MiB + 2 × 200 MiB of vectors under 1 GiB: expected 204 again, found %d", r.StatusCode)
	}
}

// TestMemoryBoundChargesWritesBetweenReadings: one reading serves
// memoryReadEvery; the writes admitted meanwhile are charged against it,
// so a burst between two readings cannot pass the bound.
func TestMemoryBoundChargesWritesBetweenReadings(t *testing.T) {
	clock := newFakeClock()
	mem := &fakeMemory{m: Memory{RSS: 1000}}
	g := &memoryGate{limit: 1000 + 3*64, read: mem.read, now: clock.now}
	for i := range 3 {
		if err := g.admit(64); err != nil {
			t.Fatalf("write %d of 64 bytes within the bound: %v", i, err)
		}
	}
	err := g.admit(64)
	if _, ok := err.(*errMemory); !ok {
		t.Fatalf("the fourth 64-byte write since the reading: expected *errMemory, found %v", err)
	}
	if mem.reads != 1 {
		t.Fatalf("expected one reading within %v, found %d", memoryReadEvery, mem.reads)
	}
	clock.advance(memoryReadEvery)
	if err := g.admit(64); err != nil {
		t.Fatalf("after a fresh reading of the same RSS: expected the charges to start over, found %v", err)
	}
	// A snapshot's copies of the vectors are charged ahead, less what an
	// encoding in progress already holds (and RSS counts).
	mem.set(Memory{RSS: 1000, VectorBytes: 50, SnapshotEncoding: 50})
	clock.advance(memoryReadEvery)
	if err := g.admit(128); err != nil {
		t.Fatalf("RSS 1000 + 2×50 − 50 being encoded + 128 within 1192: expected admission, found %v", err)
	}
	mem.set(Memory{RSS: 1000, VectorBytes: 50})
	clock.advance(memoryReadEvery)
	if err := g.admit(128); err == nil {
		t.Fatal("RSS 1000 + 2×50 for the next snapshot + 128 pending past a bound of 1192: expected a refusal")
	}
}

// TestStatusCarriesMemory: /cluster/status adds the node's memory and
// the bound to the replica's status.
func TestStatusCarriesMemory(t *testing.T) {
	mem := &fakeMemory{m: Memory{RSS: 300 << 20, VectorBytes: 100 << 20, IndexOverhead: 4 << 20, SnapshotBytesHeld: 90 << 20}}
	e := newEnv(t, Options{MaxMemory: 2 << 30, memory: mem.read})
	rec := e.get("/cluster/status")
	var st struct {
		Node   uint64  `json:"node"`
		Memory *Memory `json:"memory"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || st.Memory == nil {
		t.Fatalf("expected a memory object in /cluster/status, found %s (%v)", rec.Body, err)
	}
	want := mem.m
	want.MaxMemory = 2 << 30
	if *st.Memory != want {
		t.Fatalf("memory: expected %+v, found %+v", want, *st.Memory)
	}
	// A backend that reports no memory: no memory object.
	e = newEnv(t, Options{})
	if rec := e.get("/cluster/status"); strings.Contains(rec.Body.String(), `"memory"`) {
		t.Fatalf("a backend without memory figures: expected no memory object, found %s", rec.Body)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1 KiB", 1536 << 20: "1.5 GiB", 614 << 20: "614 MiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
