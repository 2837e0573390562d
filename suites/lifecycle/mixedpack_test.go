package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// formatTwoRelease is the last commit whose state machine applies every
// packed entry under entry format 2's position rule (an embedding put
// takes no position, so signals packed right behind it are refused as a
// replay): the release a cluster upgrading to entry format 3 mixes with.
const formatTwoRelease = "f416102ba72868280768044cb0ac2276f828c77d"

// packedLoad writes embedding puts and signal batches concurrently on
// every node, so that every node packs (a follower's proposals are packed
// where they are made), and counts the answers 500.
func packedLoad(ctx context.Context, addrs []string, tag string) (acked, internal, other int) {
	const (
		writers = 6  // goroutines of each kind per node
		ops     = 30 // writes per goroutine
	)
	vec := make([]float32, ledger.DefaultEmbeddingDim)
	for i := range vec {
		vec[i] = float32(1 + i%7)
	}
	var mu sync.Mutex
	note := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		var ae *client.APIError
		switch {
		case err == nil:
			acked++
		case errors.As(err, &ae) && ae.Status == 500:
			internal++
		default:
			other++
		}
	}
	var wg sync.WaitGroup
	for n, addr := range addrs {
		// No retries: a retry with the same id would turn a refused batch
		// into a 204.
		cl := client.New(addr, client.WithRetries(0), client.WithBinaryVectors())
		for w := range writers {
			wg.Add(2)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for i := range ops {
					_, err := cl.PutEmbedding(ctx, uint64(1_000_000*(n+1)+w*ops+i), fmt.Sprintf("%s-v%d-%d-%d", tag, n, w, i), vec)
					note(err)
				}
			}()
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for i := range ops {
					_, err := cl.WriteSignals(ctx, []client.Event{
						{ID: fmt.Sprintf("%s-s%d-%d-%d", tag, n, w, i), Entity: uint64(n*1000 + w), Signal: "view"},
					})
					note(err)
				}
			}()
		}
	}
	wg.Wait()
	return acked, internal, other
}

// expectSameDigests waits until every node has applied the same index and
// expects them to agree on the digest of their state there.
func expectSameDigests(ctx context.Context, addrs []string, when string) {
	var last []client.Digest
	Eventually(func() error {
		last = last[:0]
		for _, addr := range addrs {
			d, err := client.New(addr, client.WithRetries(0)).Digest(ctx)
			if err != nil {
				return err
			}
			last = append(last, d)
		}
		for _, d := range last[1:] {
			if d.AppliedIndex != last[0].AppliedIndex {
				return fmt.Errorf("applied indexes differ: %v", last)
			}
		}
		return nil
	}).WithContext(ctx).WithTimeout(90*time.Second).WithPolling(200*time.Millisecond).Should(Succeed(), when)
	for i, d := range last[1:] {
		Expect(d.Digest).To(Equal(last[0].Digest), "%s: node %d's digest at index %d differs from node 1's", when, i+2, d.AppliedIndex)
	}
	GinkgoWriter.Printf("%s: the 3 nodes agree on digest %.16s at index %d\n", when, last[0].Digest, last[0].AppliedIndex)
}

var _ = Describe("a rolling upgrade across the packed-entry position rule", func() {
	// A cluster mixing this build with the release that applies packed
	// entries under format 2's rule, proposal packing on (the default)
	// on every node: every node packs in format 2's envelope (this build
	// because a member reads format 2 at most), and every node applies
	// those entries under format 2's rule, so the replicas stay equal.
	// Once the old node is upgraded, every member reads format 3: packed
	// entries take format 3's envelope and rule, and no write is answered
	// 500 for it; the log then holds both, and the nodes still agree.
	It("Regression: a mixed-release cluster applies packed entries alike", func(ctx SpecContext) {
		dir := specDir("mixed-packed")
		commit, err := fixture.BuildRef(formatTwoRelease, filepath.Join(dir, "previous"))
		Expect(err).NotTo(HaveOccurred(), "build the format-2 release %s", formatTwoRelease)
		previous := filepath.Join(dir, "previous", "tidal-server")
		GinkgoWriter.Printf("format-2 release: %s\n", commit)

		addrs := freeAddrs(6)
		peers := fmt.Sprintf("1=%s,2=%s,3=%s", addrs[3], addrs[4], addrs[5])
		args := func(i int) []string {
			return runArgs(i+1, addrs[i], addrs[3+i], filepath.Join(dir, fmt.Sprint(i+1)), "--peers", peers)
		}
		nodes := []*node{startNodeOf(bins.TidalServer, args(0)...), startNodeOf(previous, args(1)...), startNodeOf(bins.TidalServer, args(2)...)}
		for i, n := range nodes {
			n.waitReady(addrs[i])
		}
		clusterFormat := func(addr string) func() string {
			return func() string {
				m, err := client.New(addr, client.WithRetries(0)).Metrics(ctx)
				if err != nil {
					return err.Error()
				}
				return string(m)
			}
		}
		Eventually(clusterFormat(addrs[0])).WithContext(ctx).WithTimeout(60*time.Second).WithPolling(200*time.Millisecond).Should(
			MatchRegexp(`(?m)^tidal_cluster_entry_format 2$`), "this build's node 1 learns that node 2 reads entry format 2 at most")

		acked, internal, other := packedLoad(ctx, addrs[:3], "mixed")
		GinkgoWriter.Printf("mixed releases: %d writes acknowledged, %d answered 500 (format 2's rule), %d other failures\n", acked, internal, other)
		Expect(acked).To(BeNumerically(">", 0))
		expectSameDigests(ctx, addrs[:3], "mixed releases")

		// Upgrade node 2 in place: it replays the packed entries it
		// applied under the old release, under the same rule.
		nodes[1].stop()
		nodes[1] = startNodeOf(bins.TidalServer, args(1)...)
		nodes[1].waitReady(addrs[1])
		for _, addr := range addrs[:3] {
			Eventually(clusterFormat(addr)).WithContext(ctx).WithTimeout(60*time.Second).WithPolling(200*time.Millisecond).Should(
				MatchRegexp(`(?m)^tidal_cluster_entry_format 3$`), "every member reads entry format 3 after the upgrade (node at %s)", addr)
		}
		acked, internal, other = packedLoad(ctx, addrs[:3], "upgraded")
		GinkgoWriter.Printf("upgraded: %d writes acknowledged, %d answered 500, %d other failures\n", acked, internal, other)
		Expect(internal).To(BeZero(), "writes answered 500 once every member reads entry format 3")
		expectSameDigests(ctx, addrs[:3], "upgraded")
	}, SpecTimeout(8*time.Minute))
})
