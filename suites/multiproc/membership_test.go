package multiproc

import (
	"context"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tcp-relay/relay"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// followerLag is how late everything the leader sends the lagging follower
// arrives. It must outlast an add and a remove through the leader (a few
// commit rounds), plus one Retry-After (1s) should the leader drop the
// re-add while it finishes applying the removal, and stay under the peer
// transport's keepalive timeout (2s), which the ping crosses once.
const followerLag = 1500 * time.Millisecond

var _ = Describe("membership changes", func() {
	// Regression: a follower that has not yet applied the
	// add and the remove of id 4 accepts a request to add 4 again, and the
	// change reaches the log. Every node used to turn it into an empty
	// ConfChangeV2 at apply, which raft reads as "leave joint config": all
	// of them panicked at that index, and again on every restart.
	It("refuses to re-add a removed id through a lagging follower, and every node stays up and keeps committing", func(ctx SpecContext) {
		c := newCluster("readd-removed-id", 3, 1, "--write-timeout=15s")
		spare := c.Nodes()[3]
		w := fixture.NewWriter("readd")
		var stopOnce sync.Once
		stopLoad := startLoad(c, w, 2)
		stop := func() { stopOnce.Do(stopLoad) }
		DeferCleanup(stop)
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 100))

		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		leader, err := c.WaitLeader(lctx)
		Expect(err).NotTo(HaveOccurred())
		var follower string
		for _, n := range c.Names()[:3] {
			if n != leader {
				follower = n
				break
			}
		}
		leaderID, followerID := c.Nodes()[nodeIndex(c, leader)].ID, c.Nodes()[nodeIndex(c, follower)].ID
		GinkgoWriter.Printf("leader %s (%d), lagging follower %s (%d)\n", leader, leaderID, follower, followerID)

		_, err = c.Mesh().AddLinkFault(leader, follower, relay.Fault{
			Name: "lag", Direction: relay.Upstream, Toxicity: 1, Toxic: relay.Latency{Latency: followerLag},
		})
		Expect(err).NotTo(HaveOccurred())
		// The first late heartbeat may cost the follower its leader for an
		// election timeout; it must know the leader again to forward.
		Eventually(func() uint64 {
			st, err := c.Status(ctx, follower)
			if err != nil {
				return 0
			}
			return st.Leader
		}).WithTimeout(30*time.Second).WithPolling(100*time.Millisecond).Should(Equal(leaderID), "the lagging follower to follow %s again", leader)

		admin := func(name string) *client.Client {
			// 503s (no leader for a moment, a change still pending) are
			// retried after their Retry-After.
			return c.AdminClientWith(name, client.WithRetries(5), client.WithTimeout(20*time.Second))
		}
		member := client.Member{ID: 4, PeerAddr: spare.PeerAddr, ClientAddr: spare.ClientAddr}
		_, err = admin(leader).AddMember(ctx, member)
		Expect(err).NotTo(HaveOccurred(), "add 4 through the leader")
		Expect(admin(leader).RemoveMember(ctx, 4)).To(Succeed(), "remove 4 through the leader")
		lst, err := c.Status(ctx, leader)
		Expect(err).NotTo(HaveOccurred())
		fst, err := c.Status(ctx, follower)
		Expect(err).NotTo(HaveOccurred())
		Expect(fst.Applied).To(BeNumerically("<", lst.Applied),
			"the follower must not have applied the removal yet (it lags by %v); the test did not set up the race", followerLag)

		_, err = admin(follower).AddMember(ctx, member)
		Expect(client.IsConflict(err)).To(BeTrue(), "re-adding removed id 4 through lagging follower %s: %v, expected 409", follower, err)
		Expect(err.Error()).To(ContainSubstring("member id 4 was removed"))
		// Refused at apply, on every node alike — not by the follower's own
		// check, which passed: the change was in the log.
		Expect(err.Error()).To(ContainSubstring("applied as a no-op"))

		_, err = c.Mesh().RemoveLinkFault(leader, follower, "lag")
		Expect(err).NotTo(HaveOccurred())
		expectAllUp(ctx, c, []uint64{1, 2, 3})
		before := len(w.Acked())
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(30*time.Second).Should(BeNumerically(">=", before+200), "writes keep committing after the refused re-add")

		// The refused change is in every log: a restart replays it.
		Expect(c.Kill(follower)).To(Succeed())
		Expect(c.Start(follower)).To(Succeed())
		rctx, rcancel := context.WithTimeout(ctx, 60*time.Second)
		defer rcancel()
		Expect(c.WaitReady(rctx)).To(Succeed())
		before = len(w.Acked())
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(30*time.Second).Should(BeNumerically(">=", before+200), "writes keep committing after the follower replayed the refused change")
		stop()
		expectAllAcked(ctx, c, w)
		expectAllUp(ctx, c, []uint64{1, 2, 3})
	}, SpecTimeout(4*time.Minute))
})

// expectAllUp checks that every original node answers, runs raft, and lists
// exactly the members want.
func expectAllUp(ctx context.Context, c *cluster.Cluster, want []uint64) {
	for _, name := range c.Names()[:len(want)] {
		st, err := c.Status(ctx, name)
		Expect(err).NotTo(HaveOccurred(), "status of %s", name)
		Expect(st.Leader).NotTo(BeZero(), "%s knows no leader", name)
		var ids []uint64
		for _, m := range st.Members {
			ids = append(ids, m.ID)
		}
		Expect(ids).To(Equal(want), "members as %s sees them: %s", name, fmt.Sprint(st.Members))
	}
}
