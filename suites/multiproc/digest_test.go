package multiproc

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
)

var _ = Describe("digests", func() {
	// Regression (flake of "catches up a follower that was down past a
	// log compaction by snapshot": digests 2021 on one node, 2023 on
	// another): expectAllAcked read each node's digest once after the
	// cluster converged and compared them, but a converged cluster can
	// still append (the restarted follower publishing its client
	// address), so reads that straddled an entry failed the spec with no
	// divergence. Here an entry is appended, applied everywhere, between
	// the first node's read and the others': the reads are compared only
	// at one applied index, and a digest that differs there still fails.
	It("are compared at one applied index, and a differing one is still caught", func(ctx SpecContext) {
		c := newCluster("digest-one-index", 3, 0)
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		Expect(c.WaitConverged(wctx)).To(Succeed())
		names := c.RunningNames()
		appended := 0
		between := func(ctx context.Context, node string) (client.Digest, error) {
			d, err := c.AdminClient(node).Digest(ctx)
			if err != nil || node != names[0] || appended > 0 {
				return d, err
			}
			// After the first read, once: an entry lands everywhere.
			appended++
			_, err = c.Client(names[1]).WriteSignals(ctx, []client.Event{{ID: "between-reads", Entity: 42, Signal: "like"}})
			Expect(err).NotTo(HaveOccurred())
			Expect(c.WaitConverged(ctx)).To(Succeed())
			return d, nil
		}
		// What expectAllAcked did: one read per node, compared as read.
		once := map[string]client.Digest{}
		for _, n := range names {
			d, err := between(wctx, n)
			Expect(err).NotTo(HaveOccurred())
			once[n] = d
		}
		Expect(fixture.DigestsDiffer(once)).NotTo(BeEmpty(), "reads straddling an entry: %v", once)

		appended = 0
		digests, err := fixture.DigestsAtOneIndex(wctx, c, between)
		Expect(err).NotTo(HaveOccurred())
		Expect(appended).To(Equal(1), "the entry must have landed between two reads")
		Expect(fixture.DigestsDiffer(digests)).To(BeEmpty(), "%v", digests)
		Expect(digests[names[0]].AppliedIndex).To(BeNumerically(">", once[names[0]].AppliedIndex))

		// The comparison can say false: one node's digest altered at the
		// same index.
		corrupt := func(ctx context.Context, node string) (client.Digest, error) {
			d, err := c.AdminClient(node).Digest(ctx)
			if node == names[2] {
				d.Digest = fmt.Sprintf("%x", "not the state")
			}
			return d, err
		}
		digests, err = fixture.DigestsAtOneIndex(wctx, c, corrupt)
		Expect(err).NotTo(HaveOccurred())
		Expect(fixture.DigestsDiffer(digests)).To(ContainSubstring(names[2]))
	}, SpecTimeout(2*time.Minute))
})
