package lifecycle

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// logSize is the size of name's stdout.log now, so a later read can look
// only at what a restart wrote.
func logSize(c *cluster.Cluster, name string) int64 {
	fi, err := os.Stat(filepath.Join(nodeDir(c, name), "stdout.log"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// logSince is name's stdout.log from offset on.
func logSince(c *cluster.Cluster, name string, offset int64) string {
	b, err := os.ReadFile(filepath.Join(nodeDir(c, name), "stdout.log"))
	if err != nil || int64(len(b)) < offset {
		return ""
	}
	return string(b[offset:])
}

var _ = Describe("a member's start-up checks", func() {
	It("Regression: flipped bit in the last WAL record refuses the start with exit status 1 naming file and offset", func(ctx SpecContext) {
		c, _ := newCluster("wal-last-record-flip", 3)
		w := fixture.NewWriter("flip")
		stop := load(w, 4, toRunning(c))
		waitFor("writes acknowledged", 90*time.Second, func() bool { return len(w.Acked()) >= 200 })
		stop()
		victim := stopFollower(ctx, c)

		// The newest segment's last record was written and fdatasynced
		// whole before the node stopped: a flipped bit in it is damage,
		// not a torn write, whatever record it is (usually the HardState
		// that holds the node's vote).
		walDir := filepath.Join(nodeDir(c, victim), "data", "wal")
		rep, err := wal.Verify(walDir)
		Expect(err).NotTo(HaveOccurred())
		Expect(rep.Problem).To(BeNil())
		newest := rep.Segments[len(rep.Segments)-1]
		spans, err := wal.SegmentRecords(newest.File)
		Expect(err).NotTo(HaveOccurred())
		Expect(spans).NotTo(BeEmpty())
		last := spans[len(spans)-1]
		seg, err := os.ReadFile(newest.File)
		Expect(err).NotTo(HaveOccurred())
		const header = 9 // length, crc, type
		seg[last.Offset+header+last.Length/2] ^= 0x04
		Expect(os.WriteFile(newest.File, seg, 0o644)).To(Succeed())
		before := hashFiles(walDir)

		from := logSize(c, victim)
		Expect(c.Start(victim)).To(Succeed())
		waitFor("the damaged node to exit", 60*time.Second, func() bool {
			return strings.Contains(logSince(c, victim, from), " exit: ")
		})
		out := logSince(c, victim, from)
		GinkgoWriter.Println(out)
		Expect(out).To(ContainSubstring("exit: exit status 1"))
		Expect(out).To(ContainSubstring(fmt.Sprintf("corruption in %s at offset %d", newest.File, last.Offset)))
		Expect(hashFiles(walDir)).To(Equal(before), "a refused start changed the WAL")

		vout, code := tidalServer("wal", "verify", "--data-dir", filepath.Join(nodeDir(c, victim), "data"))
		Expect(code).To(Equal(3), "wal verify must call the same damage corruption:\n%s", vout)
		Expect(vout).To(ContainSubstring(fmt.Sprintf("at offset %d", last.Offset)))
	}, SpecTimeout(3*time.Minute))

	It("Regression: learners do not count in the peers check: a voter restarts with its flags after four learners were added", func(ctx SpecContext) {
		c, _ := newCluster("learners-peers-check", 3)
		lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		leader, err := c.WaitLeader(lctx)
		Expect(err).NotTo(HaveOccurred())
		// Four learners that never start: they stay learners.
		for i, id := range []uint64{401, 402, 403, 404} {
			m := client.Member{ID: id, PeerAddr: fmt.Sprintf("127.0.0.1:%d", 9+i), ClientAddr: fmt.Sprintf("127.0.0.1:%d", 19+i)}
			Eventually(func() error {
				actx, cancel := context.WithTimeout(lctx, 10*time.Second)
				defer cancel()
				_, err := c.AdminClient(leader).AddMember(actx, m)
				return err
			}).WithTimeout(40*time.Second).WithPolling(time.Second).Should(Succeed(), "add learner %d", id)
		}
		var victim string
		for _, n := range c.Names() {
			if n != leader && c.State(n) == cluster.Running {
				victim = n
			}
		}
		// The victim must have applied the learners before it dies, or
		// its data dir would not hold them.
		Eventually(func(g Gomega) {
			sctx, cancel := context.WithTimeout(lctx, 5*time.Second)
			defer cancel()
			st, err := c.AdminClient(victim).Status(sctx)
			g.Expect(err).NotTo(HaveOccurred())
			learners := 0
			for _, m := range st.Members {
				if m.Role == "learner" {
					learners++
				}
			}
			g.Expect(learners).To(Equal(4), "learners %s knows", victim)
		}).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())

		Expect(c.Kill(victim)).To(Succeed())
		from := logSize(c, victim)
		Expect(c.Start(victim)).To(Succeed())
		Expect(c.WaitReady(lctx)).To(Succeed(), "the restarted voter should rejoin:\n%s", logSince(c, victim, from))
		out := logSince(c, victim, from)
		Expect(out).NotTo(ContainSubstring(" exit: "), "the restarted voter exited:\n%s", out)
		Expect(out).NotTo(ContainSubstring("less than a majority"))
		sctx, cancel := context.WithTimeout(lctx, 10*time.Second)
		defer cancel()
		st, err := c.AdminClient(victim).Status(sctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Leader).NotTo(BeZero(), "the restarted voter should know the leader")
	}, SpecTimeout(3*time.Minute))
})
