package multiproc

// The memory bound on a real process: with a small --max-memory, a node
// loaded with embeddings refuses them once its memory (RSS plus the next
// snapshot's copies of the vectors) would pass the bound, with 503
// memory_limit, Retry-After and a message naming the figures, while
// signals and reads are still served and every acknowledged embedding
// is still there.

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// memoryVector is entity e's vector: deterministic, so an acknowledged one
// can be checked bit for bit.
func memoryVector(e uint64, dim int) []float32 {
	v := make([]float32, dim)
	for i := range v {
		v[i] = float32(math.Sin(float64(e)*0.7 + float64(i)*0.013))
	}
	v[0] = 1 + float32(e%7) // never the zero vector
	return v
}

var _ = Describe("memory bound", func() {
	It("refuses embedding writes past --max-memory", func(ctx SpecContext) {
		const bound = 192 << 20
		const dim = 1536 // the default schema's
		n := startSingleNode("max-memory", "--max-memory", "192MiB", "--snapshot-every", "1000")
		cl := n.client(client.WithRetries(0), client.WithBinaryVectors(), client.WithTimeout(30*time.Second))
		DeferCleanup(cl.CloseIdleConnections)

		st, err := cl.Status(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Memory).NotTo(BeNil(), "/cluster/status carries the node's memory")
		Expect(st.Memory.MaxMemory).To(Equal(int64(bound)))
		Expect(st.Memory.RSS).To(BeNumerically("<", bound/2), "a fresh node must start well below the bound for the spec to mean anything")

		// Load new entities from 8 writers until the node refuses one.
		var (
			next     atomic.Uint64
			mu       sync.Mutex
			acked    []uint64
			unknown  int // outcome unknown (504 or transport): may or may not have landed
			refusal  *client.APIError
			stopLoad atomic.Bool
		)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for !stopLoad.Load() && ctx.Err() == nil {
					e := next.Add(1)
					if e > 200000 {
						return // 1.2 GB of vectors: the bound never bit
					}
					_, err := cl.PutEmbedding(ctx, e, fmt.Sprintf("mem-%d", e), memoryVector(e, dim))
					mu.Lock()
					var ae *client.APIError
					switch {
					case err == nil:
						acked = append(acked, e)
					case errors.As(err, &ae) && ae.Code == client.CodeMemoryLimit:
						if refusal == nil {
							refusal = ae
						}
						stopLoad.Store(true)
					case client.IsUnavailable(err):
						// Shed by another rule (a loaded machine): certainly not applied.
					default:
						unknown++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		Expect(refusal).NotTo(BeNil(), "no embedding write was refused with %s after %d acknowledged (%d MiB of vectors)",
			client.CodeMemoryLimit, len(acked), len(acked)*dim*4>>20)
		Expect(refusal.Status).To(Equal(http.StatusServiceUnavailable))
		Expect(refusal.RetryAfter).To(BeNumerically(">", 0), "Retry-After on a memory refusal")
		for _, want := range []string{"RSS", "of vectors", "--max-memory 192 MiB", "signals and reads are still served"} {
			Expect(refusal.Message).To(ContainSubstring(want))
		}
		GinkgoWriter.Printf("refused after %d acknowledged embeddings (%d unknown): %s\n", len(acked), unknown, refusal.Message)

		// Signals are still served, and so are reads.
		_, err = cl.WriteSignals(ctx, []client.Event{{ID: "after-refusal", Entity: 1, Signal: "view"}})
		Expect(err).NotTo(HaveOccurred(), "a signal write past the memory bound")
		_, err = cl.Nearest(ctx, memoryVector(1, dim), 5)
		Expect(err).NotTo(HaveOccurred(), "a nearest query past the memory bound")

		// Nothing acknowledged was lost: the store holds at least every
		// acknowledged vector and at most those plus the unknown ones, and
		// a sample of them reads back bit for bit.
		st, err = cl.Status(ctx)
		Expect(err).NotTo(HaveOccurred())
		stored := st.Memory.VectorBytes / (dim * 4)
		Expect(stored).To(BeNumerically(">=", len(acked)), "vectors stored vs acknowledged")
		Expect(stored).To(BeNumerically("<=", len(acked)+unknown), "vectors stored vs acknowledged + unknown outcomes")
		for i, e := range acked {
			if i%97 != 0 && i != len(acked)-1 {
				continue
			}
			got, err := cl.Entity(ctx, e)
			Expect(err).NotTo(HaveOccurred(), "entity %d (acknowledged)", e)
			Expect(got.Embedding).To(Equal(memoryVector(e, dim)), "entity %d's embedding, acknowledged", e)
		}

		// The refusals are counted by rule.
		metrics, err := cl.Metrics(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(metrics)).To(MatchRegexp(`(?m)^tidal_http_shed_total\{reason="memory"\} [1-9]`))
		Expect(strings.Contains(string(metrics), "tidal_vectors_bytes ")).To(BeTrue(), "tidal_vectors_bytes in /metrics")
	})
})
