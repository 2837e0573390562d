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

// GET /v1/audit/digest hashed the whole state (every vector, the
// ledger, the embedding write ids) under the state machine's read lock,
// so Apply, which needs the write lock, waited for every digest in
// progress: with 50,000 1536-wide vectors and two readers looping on the
// digest, a node's writes fell from 834 to 12 in 15 s. Digest now pins
// the state under the lock and hashes outside it.
func TestDigestDoesNotBlockApply(t *testing.T) {
	t.Run("Regression: digest does not block apply", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(11, 12))
		cmds := randomCommands(rng, 300)
		opts := ledger.Options{IDsPerGeneration: 100}
		sm := NewStateMachine(testSchema(), opts)
		ref := NewStateMachine(testSchema(), opts) // stops at the pinned index
		for i, c := range cmds {
			sm.Apply(uint64(i+1), 1, c)
			ref.Apply(uint64(i+1), 1, c)
		}
		pinned := uint64(len(cmds))
		_, want := ref.Digest()

		parked, resume := make(chan uint64), make(chan struct{})
		sm.afterLedgerDigest = func(applied uint64) {
			parked <- applied
			<-resume
		}
		type digest struct {
			applied uint64
			hex     string
		}
		got := make(chan digest, 1)
		go func() {
			applied, d := sm.Digest()
			got <- digest{applied, d}
		}()
		select {
		case at := <-parked:
			if at != pinned {
				t.Errorf("digest pinned applied index %d, expected %d", at, pinned)
			}
		case <-time.After(time.Minute): // a deadlock detector, not a timing bound
			t.Fatal("expected Digest to reach its test hook between the ledger and the vectors; it did not within a minute")
		}

		applied := make(chan error, 1)
		go func() {
			index := pinned
			apply := func(data []byte) error {
				index++
				switch r := sm.Apply(index, 1, data).(type) {
				case EmbeddingResult:
					return r.Err
				case SignalsResult:
					if r.Err == nil && r.Applied == 0 {
						return fmt.Errorf("signal batch at index %d applied no event: %+v", index, r)
					}
					return r.Err
				}
				return nil
			}
			err := apply(encodeEmbedding(embeddingPut{ID: "after-pin-1", Entity: 1, Vector: []float32{9, 8, 7, 6}})) // overwrite (randomCommands puts entities 0..4)
			if err == nil {
				err = apply(encodeEmbedding(embeddingPut{ID: "after-pin-2", Entity: 77, Vector: []float32{1, 2, 3, 4}})) // new entity
			}
			if err == nil {
				err = apply(signalsCmd(event("after-pin-s1", 3, 1), event("after-pin-s2", 1000, 2)))
			}
			applied <- err
		}()
		select {
		case err := <-applied:
			if err != nil {
				t.Errorf("apply while the digest is parked: %v", err)
			}
		case <-time.After(time.Minute): // a deadlock detector, not a timing bound
			close(resume)
			t.Fatal("expected Apply of an embedding and a signal batch to complete while a digest is parked half-way; still blocked after a minute (the digest holds the state machine's lock while it hashes)")
		}
		close(resume)
		d := <-got
		if d.applied != pinned || d.hex != want {
			t.Fatalf("expected the digest of the state at the pinned index %d (%s), found index %d digest %s", pinned, want, d.applied, d.hex)
		}
		sm.afterLedgerDigest = nil
		if _, now := sm.Digest(); now == want {
			t.Fatal("the state did not change after the pin: the test proves nothing")
		}
		var store *vectors.Store
		sm.Read(func(_ *ledger.Ledger, v *vectors.Store, _ uint64) { store = v })
		if n := store.PinnedQueries(); n != 0 {
			t.Fatalf("%d vector views still pinned after Digest returned; expected it to release its view", n)
		}
	})
}

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
