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
		names := c.Names()
		lctx, stop := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := range 24 {
			wg.Go(func() {
				name := names[i%len(names)]
				for lctx.Err() == nil {
					w.WriteOne(lctx, name, streams[name])
				}
			})
		}
		waitFor("writes acknowledged through the streams", 90*time.Second, func() bool { return len(w.Acked()) >= 1500 })
		stop()
		wg.Wait()
		GinkgoWriter.Printf("ingest stream load: %s\n", w.Summary())
		Expect(w.Acked()).NotTo(BeEmpty())
		expectNoAckedLoss(ctx, c, w)
	}, SpecTimeout(4*time.Minute))
})
