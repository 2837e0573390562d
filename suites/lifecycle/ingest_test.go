package lifecycle

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// Issue 14: the gRPC ingest stream (--grpc-addr) on 3 real processes,
// secured as the harness runs them (TLS, the writer's client
// certificate): writes from many goroutines share one stream per node,
// and every write acknowledged on a stream is on every node afterwards,
// exactly once, with one digest across the nodes.
// streamLoad writes from workers goroutines, spread over one stream per
// node, until the returned stop is called.
func streamLoad(w *fixture.Writer, streams map[string]*client.IngestStream, names []string, workers int) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			name := names[i%len(names)]
			for ctx.Err() == nil {
				w.WriteOne(ctx, name, streams[name])
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
		GinkgoWriter.Printf("ingest stream load: %s\n", w.Summary())
	}
}

var _ = Describe("the gRPC ingest stream of a 3-node cluster", Label("lifecycle"), func() {
	It("holds every write it acknowledged on every node", func(ctx SpecContext) {
		dir := specDir("ingest-stream")
		c, err := fixture.NewGRPCCluster(bins, dir, 3)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err = c.WaitLeader(wctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(c.WaitReady(wctx)).To(Succeed())
		cancel()

		// One stream per node; writes go to all three (followers forward
		// to the leader, as over HTTP). No retries: every outcome is what
		// the node answered.
		streams := map[string]*client.IngestStream{}
		for _, n := range c.Names() {
			s, err := c.IngestStream(n, client.WithRetries(0), client.WithTimeout(10*time.Second))
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			streams[n] = s
		}
		w := fixture.NewWriter("grpc")
		stop := streamLoad(w, streams, c.Names(), 24)
		waitFor("writes acknowledged through the streams", 90*time.Second, func() bool { return len(w.Acked()) >= 1500 })
		stop()
		Expect(w.Acked()).NotTo(BeEmpty())
		expectNoAckedLoss(ctx, c, w)
	}, SpecTimeout(4*time.Minute))

	// The streams to the killed leader break; those to the others keep
	// going through the election. Whatever a stream acknowledged, before
	// or after, is on every node once the old leader is back; writes cut
	// by the kill are unknown outcomes, never reported as failures.
	It("loses no acknowledged write when the leader is killed under stream load", func(ctx SpecContext) {
		dir := specDir("ingest-stream-kill")
		c, err := fixture.NewGRPCCluster(bins, dir, 3)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		leader, err := c.WaitLeader(wctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(c.WaitReady(wctx)).To(Succeed())
		cancel()
		streams := map[string]*client.IngestStream{}
		for _, n := range c.Names() {
			s, err := c.IngestStream(n, client.WithRetries(2), client.WithTimeout(5*time.Second))
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			streams[n] = s
		}
		w := fixture.NewWriter("grpckill")
		stop := streamLoad(w, streams, c.Names(), 24)
		waitFor("writes acknowledged before the kill", 90*time.Second, func() bool { return len(w.Acked()) >= 500 })
		Expect(c.Kill(leader)).To(Succeed())
		before := len(w.Acked())
		waitFor("writes acknowledged after the kill", 90*time.Second, func() bool { return len(w.Acked()) >= before+500 })
		Expect(c.Start(leader)).To(Succeed())
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		Expect(c.WaitReady(rctx)).To(Succeed())
		cancel()
		stop()
		expectNoAckedLoss(ctx, c, w)
	}, SpecTimeout(5*time.Minute))
})
