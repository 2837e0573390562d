package multiproc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// mixedLoad is what a mixed load of embedding puts and signal batches
// saw: every signal id acknowledged, and every answer no retry makes
// right (500) with its message.
type mixedLoad struct {
	mu       sync.Mutex
	acked    []string
	internal []string // the 500 answers, embedding puts and signal batches alike
	other    int      // 503, 504 and transport errors: not acknowledged, not judged
}

func (m *mixedLoad) note(err error, what string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ae *client.APIError
	if errors.As(err, &ae) && ae.Status == 500 {
		m.internal = append(m.internal, what+": "+err.Error())
		return
	}
	m.other++
}

var _ = Describe("packed proposals", func() {
	// With proposal packing on (the default), embedding puts and signal
	// batches proposed concurrently on the leader share entries. Every
	// command of an entry takes its own positions, whatever its kind, so
	// no signal batch packed behind an embedding put is taken for a
	// replay of it (and answered 500 "log index already applied").
	//
	// The load is bounded by operations, not time: writers × ops writes
	// of each kind, sized to finish within seconds on a loaded 2-core
	// machine while keeping dozens of proposals in flight on the leader,
	// which is what packs them.
	It("Regression: no 500 for signals packed behind embeddings", func(ctx SpecContext) {
		const (
			writers = 16 // goroutines of each kind
			ops     = 60 // writes per goroutine
			batch   = 2  // events per signal batch
		)
		c := newCluster("packed-mixed", 3, 0)
		leader, err := c.WaitLeader(ctx)
		Expect(err).NotTo(HaveOccurred())
		// No retries: a retry with the same id would turn a wrongly
		// refused batch into a 204 and hide it.
		signals := c.Client(leader, client.WithRetries(0))
		embeds := c.Client(leader, client.WithRetries(0), client.WithBinaryVectors())
		// The schema's dimension (default 1536) is what a put must carry.
		vec := make([]float32, ledger.DefaultEmbeddingDim)
		for i := range vec {
			vec[i] = float32(1 + i%7)
		}

		var load mixedLoad
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(2)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for i := range ops {
					id := fmt.Sprintf("pm-v%d-%d", w, i)
					if _, err := embeds.PutEmbedding(ctx, uint64(100000+w*ops+i), id, vec); err != nil {
						load.note(err, "embedding "+id)
					}
				}
			}()
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for i := range ops {
					events := make([]client.Event, batch)
					ids := make([]string, batch)
					for j := range events {
						ids[j] = fmt.Sprintf("pm-s%d-%d-%d", w, i, j)
						events[j] = client.Event{ID: ids[j], Entity: uint64(w*ops + i), Signal: "view"}
					}
					if _, err := signals.WriteSignals(ctx, events); err != nil {
						load.note(err, "signals "+ids[0])
						continue
					}
					load.mu.Lock()
					load.acked = append(load.acked, ids...)
					load.mu.Unlock()
				}
			}()
		}
		wg.Wait()
		GinkgoWriter.Printf("mixed load on leader %s: %d signal ids acknowledged, %d answers 500, %d other failures\n",
			leader, len(load.acked), len(load.internal), load.other)
		Expect(len(load.internal)).To(BeZero(), "writes answered 500; the first: %v", load.internal[:min(3, len(load.internal))])
		Expect(load.acked).NotTo(BeEmpty())

		// Every acknowledged id is where it landed on every node. The
		// lookup is linearizable (the default), so a lagging follower
		// waits for the leader's commit index before it answers.
		for _, name := range c.Names() {
			cl := c.Client(name)
			missing := load.acked
			Eventually(func() []string {
				missing = lookupMissing(ctx, cl, missing)
				return missing
			}).WithContext(ctx).WithTimeout(90*time.Second).WithPolling(time.Second).Should(BeEmpty(),
				"acknowledged signal ids not found on %s", name)
		}

		// A follower restarted replays the packed entries from its WAL:
		// the same positions, so the same state as the nodes that applied
		// them live.
		var follower string
		for _, name := range c.Names() {
			if name != leader {
				follower = name
			}
		}
		Expect(c.Kill(follower)).To(Succeed())
		Expect(c.Start(follower)).To(Succeed())
		dctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		digests, err := fixture.DigestsAtOneIndex(dctx, c, fixture.AdminDigests(c))
		Expect(err).NotTo(HaveOccurred())
		Expect(fixture.DigestsDiffer(digests)).To(BeEmpty(), "digests after %s replayed its log: %v", follower, digests)
	}, SpecTimeout(4*time.Minute))
})

// lookupMissing returns the ids of ids that GET /v1/events/{id} on cl
// does not find, asking 8 at a time.
func lookupMissing(ctx context.Context, cl *client.Client, ids []string) []string {
	var (
		mu      sync.Mutex
		missing []string
		wg      sync.WaitGroup
		next    = make(chan string)
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range next {
				if _, err := cl.EventLocation(ctx, id); err != nil {
					mu.Lock()
					missing = append(missing, id)
					mu.Unlock()
				}
			}
		}()
	}
	for _, id := range ids {
		next <- id
	}
	close(next)
	wg.Wait()
	return missing
}
