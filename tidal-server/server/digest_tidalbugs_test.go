//go:build tidalbugs

// Tests that hold a vector scan half-way or count pinned vector views
// need vectors.Store's test hooks (SetAfterChunk, PinnedQueries), which
// only a tidalbugs build has: `make unit` runs them with -tags tidalbugs.

package server

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

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
