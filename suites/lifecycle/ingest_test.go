package lifecycle

import (
	"context"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// The gRPC ingest stream (--grpc-addr) on 3 real processes,
// secured as the harness runs them (TLS, the writer's client
// certificate): writes from many goroutines share one stream per node,
// and every write acknowledged on a stream is on every node afterwards,
// exactly once, with one digest across the nodes.
// streamLoad writes from workers goroutines, spread over one stream per
// node, until the returned stop is called.
func streamLoad[S fixture.SignalWriter](w *fixture.Writer, streams map[string]S, names []string, workers int) (stop func()) {
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

	// Streams end at --ingest-stream-max-age (2s here): the client moves
	// to a new stream on the node's notice and resends, with the same
	// ids, what an ended stream did not answer. With no retries allowed,
	// no write may fail or be left unknown because a stream aged, and
	// every acknowledged write is on every node exactly once.
	It("moves to new streams at --ingest-stream-max-age without losing or doubling a write", func(ctx SpecContext) {
		dir := specDir("ingest-stream-age")
		c, err := fixture.NewGRPCCluster(bins, dir, 3, "--ingest-stream-max-age", "2s")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err = c.WaitLeader(wctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(c.WaitReady(wctx)).To(Succeed())
		cancel()
		streams := map[string]*agedWriter{}
		for _, n := range c.Names() {
			s, err := c.IngestStream(n, client.WithRetries(0), client.WithTimeout(10*time.Second))
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(s.Close)
			streams[n] = &agedWriter{s: s}
		}
		w := fixture.NewWriter("grpcage")
		start := time.Now()
		stop := streamLoad(w, streams, c.Names(), 12)
		waitFor("writes acknowledged across several stream ages", 2*time.Minute, func() bool {
			return len(w.Acked()) >= 1000 && time.Since(start) > 8*time.Second
		})
		stop()
		for n, s := range streams {
			Expect(s.aged()).To(BeEmpty(), "writes through %s failed because their stream aged", n)
			// A stream ends a grace (10s) after its age notice.
			Eventually(func() string {
				m, _ := c.AdminClient(n).Metrics(ctx)
				return string(m)
			}).WithTimeout(60*time.Second).WithPolling(time.Second).Should(MatchRegexp(`tidal_ingest_streams_ended_total\{reason="max_age"\} [1-9]`), "%s ended no stream by age", n)
		}
		expectNoAckedLoss(ctx, c, w)
	}, SpecTimeout(5*time.Minute))
})

// agedWriter is an ingest stream that keeps the errors that say a stream
// ended under a write.
type agedWriter struct {
	s    *client.IngestStream
	mu   sync.Mutex
	errs []string
}

func (a *agedWriter) WriteSignals(ctx context.Context, events []client.Event) (client.Ack, error) {
	ack, err := a.s.WriteSignals(ctx, events)
	if err != nil && (strings.Contains(err.Error(), "maximum age") || strings.Contains(err.Error(), "stream ended")) {
		a.mu.Lock()
		a.errs = append(a.errs, err.Error())
		a.mu.Unlock()
	}
	return ack, err
}

func (a *agedWriter) aged() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.errs...)
}
