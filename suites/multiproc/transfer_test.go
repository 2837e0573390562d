package multiproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/tidal-server/client"
)

var _ = Describe("membership changes and leader transfers", func() {
	// The cluster is secured (mTLS on the peer plane), so a change a
	// follower forwards must reach the leader under the follower's own
	// identity; each follower forwards one.
	It("adds a member through each follower of a secured cluster", func(ctx SpecContext) {
		c := newCluster("add-through-each-follower", 3, 2)
		Expect(c.Security()).NotTo(BeNil(), "the cluster must run secured")
		leader, followers := leaderAndFollowers(ctx, c)
		for i, f := range followers {
			spare := c.Nodes()[3+i]
			id := uint64(4 + i)
			// Retried after its Retry-After while raft drops it (another
			// change pending), as any client does.
			_, err := c.AdminClientWith(f, client.WithRetries(5), client.WithTimeout(20*time.Second)).
				AddMember(ctx, client.Member{ID: id, PeerAddr: spare.PeerAddr, ClientAddr: spare.ClientAddr})
			Expect(err).NotTo(HaveOccurred(), "add member %d through follower %s (leader %s)", id, f, leader)
			expectListed(ctx, c, leader, id)
		}
	}, SpecTimeout(3*time.Minute))

	// Regression: raft drops every proposal while its leader transfers
	// leadership, and a membership change forwarded by a follower was
	// dropped without a word: with the transfer target killed, the change
	// asked of the other follower answered 504 after the write timeout and
	// was never made. The leader now refuses it at once (503 naming the
	// transfer, with Retry-After), abandons the transfer to the silent
	// target after an election timeout (409), and the change retried then
	// is made.
	It("Regression: membership change during a transfer to a dead node", func(ctx SpecContext) {
		c := newCluster("change-during-transfer-to-dead", 3, 3, "--write-timeout=5s")
		Expect(c.Security()).NotTo(BeNil(), "the cluster must run secured")
		leader, followers := leaderAndFollowers(ctx, c)
		dead, via := followers[0], followers[1]
		deadID := c.Nodes()[nodeIndex(c, dead)].ID
		Expect(c.Kill(dead)).To(Succeed())
		GinkgoWriter.Printf("leader %s, killed %s (%d), changes through %s\n", leader, dead, deadID, via)

		for attempt := 0; ; attempt++ {
			Expect(attempt).To(BeNumerically("<", 5), "no membership change through %s met a transfer to %s under way", via, dead)
			spare := c.Nodes()[3+attempt%3]
			member := client.Member{ID: uint64(10 + attempt), PeerAddr: spare.PeerAddr, ClientAddr: spare.ClientAddr}

			transferred := make(chan error, 1)
			go func() {
				defer GinkgoRecover()
				tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				transferred <- adminOnce(c, leader).TransferLeader(tctx, deadID)
			}()
			// The transfer is under way once the leader refuses its own
			// writes (raft drops them: 503 at once).
			writer := c.ClientAs(leader, cluster.RoleWriter, false, client.WithRetries(0))
			var probe error
			Eventually(func() bool {
				_, probe = writer.WriteSignals(ctx, []client.Event{{ID: fmt.Sprintf("probe-%d-%d", attempt, time.Now().UnixNano()), Entity: 1, Signal: "view"}})
				return client.IsUnavailable(probe)
			}).WithTimeout(30*time.Second).WithPolling(10*time.Millisecond).Should(BeTrue(), "a write on leader %s refused while it transfers to %s", leader, dead)
			GinkgoWriter.Printf("write on the leader: %v\n", probe)

			start := time.Now()
			_, err := adminOnce(c, via).AddMember(ctx, member)
			took := time.Since(start)
			terr := <-transferred
			if err == nil {
				// The transfer ended between the probe and the change
				// (a loaded machine): made. Run it again with a new id.
				GinkgoWriter.Printf("attempt %d: member %d added after the transfer ended (%s); again\n", attempt, member.ID, took)
				continue
			}
			var ae *client.APIError
			Expect(errors.As(err, &ae)).To(BeTrue(), "add through %s during the transfer: %v", via, err)
			Expect(ae.Status).To(Equal(http.StatusServiceUnavailable), "add through %s during the transfer, after %s: %v", via, took, err)
			Expect(ae.RetryAfter).To(BeNumerically(">", 0), "503 without Retry-After: %v", err)
			Expect(ae.Message).To(ContainSubstring(fmt.Sprintf("leader transfer in progress from %d to %d", c.Nodes()[nodeIndex(c, leader)].ID, deadID)))
			GinkgoWriter.Printf("refused after %s: %v\n", took, err)
			// The leader's own write named the transfer too (it said
			// "too many uncommitted proposals").
			Expect(probe.Error()).To(ContainSubstring("leader transfer in progress"))

			// The leader gave up the transfer to the silent member.
			Expect(client.IsConflict(terr)).To(BeTrue(), "transfer to killed %s: %v, expected 409", dead, terr)
			Expect(terr.Error()).To(ContainSubstring("abandoned"))

			// Retried as the Retry-After says, the change is made.
			_, err = c.AdminClientWith(via, client.WithRetries(5), client.WithTimeout(20*time.Second)).AddMember(ctx, member)
			Expect(err).NotTo(HaveOccurred(), "add member %d through %s after the transfer was abandoned", member.ID, via)
			expectListed(ctx, c, leader, member.ID)
			expectListed(ctx, c, via, member.ID)
			return
		}
	}, SpecTimeout(4*time.Minute))
})

// adminOnce is an admin client of name that makes one attempt: the test
// sees each answer as the server gave it.
func adminOnce(c *cluster.Cluster, name string) *client.Client {
	return c.AdminClientWith(name, client.WithRetries(0), client.WithTimeout(20*time.Second))
}

func leaderAndFollowers(ctx context.Context, c *cluster.Cluster) (string, []string) {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	leader, err := c.WaitLeader(lctx)
	Expect(err).NotTo(HaveOccurred())
	var followers []string
	for _, n := range c.Names()[:3] {
		if n != leader {
			followers = append(followers, n)
		}
	}
	// Each voter publishes its client address with a membership change
	// after it starts; until those are applied raft drops other changes
	// (a 503 of its own).
	Eventually(func() (int, error) {
		st, err := c.Status(ctx, leader)
		if err != nil {
			return 0, err
		}
		published := 0
		for _, m := range st.Members {
			if m.ClientAddr != "" {
				published++
			}
		}
		return published, nil
	}).WithTimeout(30*time.Second).WithPolling(100*time.Millisecond).Should(Equal(3), "voters that published their client address, as %s sees them", leader)
	return leader, followers
}

// expectListed waits until name's status lists member id.
func expectListed(ctx context.Context, c *cluster.Cluster, name string, id uint64) {
	Eventually(func() ([]uint64, error) {
		st, err := c.Status(ctx, name)
		if err != nil {
			return nil, err
		}
		var ids []uint64
		for _, m := range st.Members {
			ids = append(ids, m.ID)
		}
		return ids, nil
	}).WithTimeout(30*time.Second).WithPolling(100*time.Millisecond).Should(ContainElement(id), "members as %s sees them", name)
}
