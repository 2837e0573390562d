package multiproc

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// newCluster starts n real processes behind the mesh for one spec.
func newCluster(name string, n, spares int, flags ...string) *cluster.Cluster {
	dir, err := fixture.SpecDir("multiproc", name)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			GinkgoWriter.Printf("spec store (logs, data): %s\n", dir)
		} else {
			os.RemoveAll(dir)
		}
	})
	c, err := fixture.NewClusterWithSpares(bins, dir, n, spares, flags...)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = c.WaitLeader(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(c.WaitReady(ctx)).To(Succeed())
	return c
}

// startLoad runs a writer, each write to the next running node, until the
// returned stop is called.
func startLoad(c *cluster.Cluster, w *fixture.Writer, workers int) (stop func()) {
	return fixture.StartLoad(w, workers, fixture.ToRunning(c, 3*time.Second), GinkgoWriter)
}

// expectAllAcked checks every running node holds every acked write exactly
// once, then that all nodes agree on the digest at the same index.
func expectAllAcked(ctx context.Context, c *cluster.Cluster, w *fixture.Writer) {
	Expect(fixture.CheckNoAckedLoss(ctx, c, w, 60*time.Second, GinkgoWriter)).To(Succeed())
}

var _ = Describe("a 3-node cluster", func() {
	It("accepts writes on every node and converges to one digest", func(ctx SpecContext) {
		c := newCluster("writes-every-node", 3, 0)
		w := fixture.NewWriter("every")
		for i := 0; i < 300; i++ {
			name := c.Names()[i%3]
			w.WriteOne(ctx, name, c.Client(name))
		}
		Expect(w.Acked()).To(HaveLen(300), w.Summary())
		acks := w.Acked()
		byNode := map[string]int{}
		for _, a := range acks {
			byNode[a.Node]++
		}
		Expect(byNode).To(HaveLen(3))
		expectAllAcked(ctx, c, w)
	}, SpecTimeout(2*time.Minute))

	It("serves a linearizable read on one node right after another node acked a write", func(ctx SpecContext) {
		c := newCluster("linearizable-read", 3, 0)
		names := c.Names()
		for i := 0; i < 50; i++ {
			writer, reader := names[i%3], names[(i+1)%3]
			entity := uint64(1000 + i)
			_, err := c.Client(writer).WriteSignals(ctx, []client.Event{{ID: fmt.Sprintf("lin-%d", i), Entity: entity, Signal: "like"}})
			Expect(err).NotTo(HaveOccurred())
			e, err := c.Client(reader).Entity(ctx, entity)
			Expect(err).NotTo(HaveOccurred())
			Expect(e.Signals["like"].Count).To(Equal(uint64(1)), "read on %s after write acked by %s", reader, writer)
		}
	}, SpecTimeout(time.Minute))

	It("elects a new leader when the leader is killed under load, and the killed node catches up", func(ctx SpecContext) {
		c := newCluster("kill-leader", 3, 0)
		w := fixture.NewWriter("kl")
		stop := startLoad(c, w, fixture.Parallelism())
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 1000))
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		old, err := c.WaitLeader(lctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Kill(old)).To(Succeed())
		killedAt := time.Now()
		// Election timeout is 10 ticks of 50ms, randomized up to 2x:
		// "a few election timeouts" is well under 5s.
		newLeader, err := c.WaitLeader(lctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(newLeader).NotTo(Equal(old))
		GinkgoWriter.Printf("leader %s killed; %s leads after %v\n", old, newLeader, time.Since(killedAt))
		before := len(w.Acked())
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(20*time.Second).Should(BeNumerically(">=", before+500), "writes continue through the survivors")
		stop()
		expectAllAcked(ctx, c, w)

		Expect(c.Start(old)).To(Succeed())
		expectAllAcked(ctx, c, w)
	}, SpecTimeout(3*time.Minute))

	It("catches up a follower that was down past a log compaction by snapshot", func(ctx SpecContext) {
		c := newCluster("snapshot-catchup", 3, 0, "--snapshot-every=300", "--snapshot-catch-up=50")
		w := fixture.NewWriter("snap")
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		leader, err := c.WaitLeader(lctx)
		Expect(err).NotTo(HaveOccurred())
		var follower string
		for _, n := range c.Names() {
			if n != leader {
				follower = n
				break
			}
		}
		Expect(c.Kill(follower)).To(Succeed())
		stop := startLoad(c, w, fixture.Parallelism())
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(60 * time.Second).Should(BeNumerically(">=", 2000))
		stop()
		Expect(c.Start(follower)).To(Succeed())
		expectAllAcked(ctx, c, w)
		// It must have come back by snapshot, not by replaying the log.
		log, err := os.ReadFile(c.Nodes()[nodeIndex(c, follower)].Dir + "/node.log")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(log)).To(ContainSubstring("installed snapshot from leader"))
	}, SpecTimeout(3*time.Minute))

	It("adds a 4th member and removes one under load without losing an acknowledged write", func(ctx SpecContext) {
		// Snapshots every 300 entries: the newcomer must catch up from a
		// snapshot taken after it was added (an older one does not list it
		// in its ConfState, and raft makes it refuse that one).
		c := newCluster("membership", 3, 1, "--snapshot-every=300", "--snapshot-catch-up=50")
		w := fixture.NewWriter("mem")
		stop := startLoad(c, w, fixture.Parallelism())
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 500))
		mctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		id, err := c.AddMember(mctx, "n4")
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Printf("added n4 as member %d\n", id)
		// The learner is promoted once caught up.
		Eventually(func() string {
			leader := c.LeaderName(mctx)
			if leader == "" {
				return ""
			}
			st, err := c.Status(mctx, leader)
			if err != nil {
				return err.Error()
			}
			for _, m := range st.Members {
				if m.ID == id {
					return m.Role
				}
			}
			return "absent"
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Or(Equal("follower"), Equal("leader")))
		before := len(w.Acked())
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(20 * time.Second).Should(BeNumerically(">=", before+300))

		Expect(c.RemoveMember(mctx, "n2")).To(Succeed())
		before = len(w.Acked())
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(20 * time.Second).Should(BeNumerically(">=", before+300))
		stop()
		expectAllAcked(ctx, c, w)
		st, err := c.Status(mctx, c.LeaderName(mctx))
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Members).To(HaveLen(3))
	}, SpecTimeout(3*time.Minute))
})

var _ = Describe("an overloaded 3-node cluster", func() {
	It("sheds with 503 and Retry-After, and loses nothing it acknowledged", func(ctx SpecContext) {
		// Two writes in flight per node at most: 48 writers must overflow it.
		c := newCluster("overload", 3, 0, "--max-inflight-writes=2")
		w := fixture.NewWriter("over")
		var next atomic.Int64
		clients := map[string]*client.Client{}
		for _, n := range c.Names() {
			clients[n] = c.Client(n, client.WithRetries(0))
		}
		load, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.Run(load, 48, func(int) (string, *client.Client) {
				name := c.Names()[int(next.Add(1))%3]
				return name, clients[name]
			})
		}()
		Eventually(func() int { return w.Unavailable() }).WithTimeout(30*time.Second).Should(BeNumerically(">", 0), "expected some writes refused with 503")
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 500))
		stop()
		<-done
		GinkgoWriter.Printf("503s: %d\n", w.Unavailable())
		expectAllAcked(ctx, c, w)
	}, SpecTimeout(2*time.Minute))
})

func nodeIndex(c *cluster.Cluster, name string) int {
	for i, n := range c.Nodes() {
		if n.Name == name {
			return i
		}
	}
	return -1
}
