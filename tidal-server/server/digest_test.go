package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// The digest is part of what nodes and runs compare (the convergence
// checker, the harness's digest files), so computing it outside the lock
// must not change one bit of it: this is the digest the whole-state-
// under-the-lock implementation gave for the same state, a seeded mix of
// signals, retries, conflicts and embeddings across several chunks of
// the hashing.
func TestDigestIsUnchangedForTheSameState(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	sm := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 50})
	index := uint64(0)
	for _, c := range randomCommands(rng, 400) {
		index++
		sm.Apply(index, 1, c)
	}
	for i := range 300 {
		vec := []float32{float32(1 + rng.IntN(9)), float32(rng.IntN(9)), float32(rng.IntN(9)), float32(rng.IntN(9))}
		index++
		sm.Apply(index, 1, encodeEmbedding(embeddingPut{ID: fmt.Sprintf("w%d", i), Entity: uint64(rng.IntN(1000)), Vector: vec}))
	}
	const want = "ad6d1dcfc593401e3b4154634608b3d6c55bf33a639e1e93065cac101a669f49"
	if applied, got := sm.Digest(); applied != index || got != want {
		t.Fatalf("expected digest %s at index %d, found %s at %d", want, index, got, applied)
	}

	// Without any embedding (so without embedding ids), empty and not.
	plain := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 50})
	if applied, got := plain.Digest(); applied != 0 || got != wantEmpty {
		t.Fatalf("empty state machine: expected digest %s at index 0, found %s at %d", wantEmpty, got, applied)
	}
	for i := range 40 {
		plain.Apply(uint64(i+1), 1, signalsCmd(event(fmt.Sprintf("p%d", i), uint64(i%6), 1)))
	}
	if applied, got := plain.Digest(); applied != 40 || got != wantSignals {
		t.Fatalf("signals only: expected digest %s at index 40, found %s at %d", wantSignals, got, applied)
	}
}

const (
	wantEmpty   = "f28e0d6193b316a985292796923017d89e94f9aab1e2f953d1b7819ffb51c941"
	wantSignals = "6d4fa02b12b9c0928081ec6f1e23b062219220bd6f1729b88813ca4892061775"
)

// blockingWriter is a client that reads nothing until released: its
// first Write parks.
type blockingWriter struct {
	*httptest.ResponseRecorder
	parked, resume chan struct{}
	once           sync.Once
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	w.once.Do(func() {
		close(w.parked)
		<-w.resume
	})
	return w.ResponseRecorder.Write(p)
}

// GET /v1/audit/events walks a capture of the id memory taken under the
// read lock, outside it: with the stream parked on a client that reads
// nothing, signal batches apply (the id memory rotating meanwhile), and
// the stream still lists exactly the ids remembered at the capture.
func TestAuditEventsStreamsACaptureWhileApplyGoesOn(t *testing.T) {
	sm := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 40})
	index := uint64(0)
	for i := range 60 {
		index++
		sm.Apply(index, 1, signalsCmd(event(fmt.Sprintf("a%d", i), uint64(i%5), 1)))
	}
	var want []string
	sm.Read(func(l *ledger.Ledger, _ *vectors.Store, _ uint64) {
		_ = l.AuditEvents(func(loc ledger.Location) error { want = append(want, loc.ID); return nil })
	})
	h := api.New(smBackend{sm: sm}, api.Options{})
	w := &blockingWriter{ResponseRecorder: httptest.NewRecorder(), parked: make(chan struct{}), resume: make(chan struct{})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/audit/events", nil))
	}()
	<-w.parked
	applied := make(chan struct{})
	go func() {
		defer close(applied)
		for i := range 100 {
			index++
			sm.Apply(index, 1, signalsCmd(event(fmt.Sprintf("b%d", i), uint64(i%5), 1)))
		}
	}()
	select {
	case <-applied:
	case <-time.After(time.Minute): // a deadlock detector, not a timing bound
		close(w.resume)
		t.Fatal("expected Apply to complete while an audit stream is parked on its client; still blocked after a minute")
	}
	close(w.resume)
	<-served
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(w.Body.String()), "\n") {
		var loc struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(line), &loc); err != nil {
			t.Fatalf("audit stream line %q: %v", line, err)
		}
		got = append(got, loc.ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("expected the %d ids remembered at the capture (%v ... ), found %d: %v", len(want), want[:3], len(got), got)
	}
}

// What Digest remembers between calls (the vectors' hash of an unchanged
// store, the encoding of unchanged embedding ids) never outlives the
// state it was computed from: digests taken between applies, with id
// generations rotating and a Restore, equal those of a fresh state
// machine that replays the same commands and remembers nothing.
func TestDigestMemosFollowTheState(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	cmds := randomCommands(rng, 300)
	opts := ledger.Options{IDsPerGeneration: 8}
	sm := NewStateMachine(testSchema(), opts)
	fresh := func(upTo int) string {
		ref := NewStateMachine(testSchema(), opts)
		for i, c := range cmds[:upTo] {
			ref.Apply(uint64(i+1), 1, c)
		}
		_, d := ref.Digest()
		return d
	}
	var snap bytes.Buffer
	for i, c := range cmds {
		sm.Apply(uint64(i+1), 1, c)
		if i == 150 {
			if err := sm.Snapshot(&snap); err != nil {
				t.Fatal(err)
			}
		}
		if i%7 == 0 {
			if _, got := sm.Digest(); got != fresh(i+1) {
				t.Fatalf("after command %d: digest %s, a fresh replay's %s", i+1, got, fresh(i+1))
			}
		}
	}
	if err := sm.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	if _, got := sm.Digest(); got != fresh(151) {
		t.Fatalf("after Restore to index 151: digest %s, a fresh replay's %s", got, fresh(151))
	}
}
