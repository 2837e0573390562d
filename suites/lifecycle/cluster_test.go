package lifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// newCluster starts n real processes behind the relay mesh for one spec
// and returns it with the spec's directory.
func newCluster(name string, n int) (*cluster.Cluster, string) {
	dir := specDir(name)
	c, err := fixture.NewClusterWithSpares(bins, dir, n, 1)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = c.WaitLeader(ctx)
	Expect(err).NotTo(HaveOccurred())
	Expect(c.WaitReady(ctx)).To(Succeed())
	return c, dir
}

// load writes from workers goroutines, each write to the node pick
// returns, until the returned stop is called.
func load(w *fixture.Writer, workers int, pick func(int) (string, *client.Client)) (stop func()) {
	return fixture.StartLoad(w, workers, pick, GinkgoWriter)
}

// toRunning sends each write to the next running node.
func toRunning(c *cluster.Cluster) func(int) (string, *client.Client) {
	return fixture.ToRunning(c, 5*time.Second)
}

// expectNoAckedLoss checks that every running node holds every write w saw
// acknowledged, exactly once, and that all agree on one digest.
func expectNoAckedLoss(ctx context.Context, c *cluster.Cluster, w *fixture.Writer) {
	Expect(fixture.CheckNoAckedLoss(ctx, c, w, 90*time.Second, GinkgoWriter)).To(Succeed())
}

// stopFollower stops a node that is not the leader (the first or second
// by name) and returns its name.
func stopFollower(ctx context.Context, c *cluster.Cluster) string {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	leader, err := c.WaitLeader(lctx)
	cancel()
	Expect(err).NotTo(HaveOccurred())
	victim := c.Names()[0]
	if victim == leader {
		victim = c.Names()[1]
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	Expect(c.Stop(sctx, victim)).To(Succeed())
	cancel()
	return victim
}

func nodeDir(c *cluster.Cluster, name string) string {
	for _, n := range c.Nodes() {
		if n.Name == name {
			return n.Dir
		}
	}
	Fail("no node " + name)
	return ""
}

// adminFlags are the flags tidal-server's admin commands need to act as
// the admin of c (none on an insecure cluster).
func adminFlags(c *cluster.Cluster) []string {
	if sec := c.Security(); sec != nil {
		return sec.CLIFlags(cluster.RoleAdmin)
	}
	return nil
}

// tidalServer runs a tidal-server command to completion and returns its
// output and exit status.
func tidalServer(args ...string) (string, int) {
	out, err := exec.Command(bins.TidalServer, args...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	Expect(err).NotTo(HaveOccurred(), string(out))
	return string(out), 0
}

func hashFiles(dir string) string {
	h := sha256.New()
	entries, err := os.ReadDir(dir)
	Expect(err).NotTo(HaveOccurred())
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		Expect(err).NotTo(HaveOccurred())
		fmt.Fprintf(h, "%s:%d:", e.Name(), len(data))
		h.Write(data)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

func waitFor(desc string, timeout time.Duration, cond func() bool) {
	Eventually(cond).WithTimeout(timeout).WithPolling(100*time.Millisecond).Should(BeTrue(), desc)
}

var _ = Describe("a 3-node cluster through its lifecycle", func() {
	// Regression: SIGTERM on a leader stopped raft with
	// writes in flight through it; they ended as 504 (5 in one SIGTERM).
	It("hands leadership off before a leader drains: no write sent to the other nodes ends as 504", func(ctx SpecContext) {
		c, _ := newCluster("handoff", 3)
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		leader, err := c.WaitLeader(lctx)
		cancel()
		Expect(err).NotTo(HaveOccurred())
		var followers []string
		for _, n := range c.Names() {
			if n != leader && c.State(n) == cluster.Running {
				followers = append(followers, n)
			}
		}
		Expect(followers).To(HaveLen(2))
		// No client retries: every 504 the servers send is recorded as
		// an unknown outcome, none is hidden behind a retry.
		clients := map[string]*client.Client{}
		for _, f := range followers {
			clients[f] = c.Client(f, client.WithRetries(0), client.WithTimeout(15*time.Second))
		}
		var next atomic.Int64
		w := fixture.NewWriter("handoff")
		stop := load(w, 8, func(int) (string, *client.Client) {
			f := followers[int(next.Add(1))%len(followers)]
			return f, clients[f]
		})
		waitFor("writes acknowledged before the SIGTERM", 60*time.Second, func() bool { return len(w.Acked()) >= 300 })

		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		Expect(c.Stop(sctx, leader)).To(Succeed())
		cancel()
		before := len(w.Acked())
		waitFor("writes acknowledged after the SIGTERM", 60*time.Second, func() bool { return len(w.Acked()) >= before+300 })
		stop()
		Expect(w.Unknown()).To(BeEmpty(), "writes to the followers with an unknown outcome (504) across the leader's SIGTERM: %s", w.Summary())

		log, err := os.ReadFile(filepath.Join(nodeDir(c, leader), "node.log"))
		Expect(err).NotTo(HaveOccurred())
		handedOff := strings.Index(string(log), "leadership handed off")
		draining := strings.Index(string(log), "draining: no new requests")
		Expect(handedOff).To(BeNumerically(">=", 0), "the old leader's log should say it handed leadership off")
		Expect(handedOff).To(BeNumerically("<", draining), "leadership should move before the drain starts")
		out, err := os.ReadFile(filepath.Join(nodeDir(c, leader), "stdout.log"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).To(ContainSubstring("exit: status 0"))

		Expect(c.Start(leader)).To(Succeed())
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		Expect(c.WaitReady(rctx)).To(Succeed())
		expectNoAckedLoss(ctx, c, w)
	}, SpecTimeout(5*time.Minute))

	// Regression: a rolling restart (SIGTERM, start, wait
	// ready; node by node) ended 12 writes as 504.
	It("rolls through a restart of every node without a 504 among writes to the nodes not restarting", func(ctx SpecContext) {
		c, _ := newCluster("rolling", 3)
		clients := map[string]*client.Client{}
		for _, n := range c.Names() {
			clients[n] = c.Client(n, client.WithRetries(0), client.WithTimeout(15*time.Second))
		}
		var targets atomic.Pointer[[]string]
		setTargets := func(except string) {
			var ts []string
			for _, n := range c.RunningNames() {
				if n != except {
					ts = append(ts, n)
				}
			}
			targets.Store(&ts)
		}
		setTargets("")
		var next atomic.Int64
		// current[i] is the node worker i writes to now: a worker asks for
		// its next node only once its previous write has an outcome.
		const workers = 8
		var current [workers]atomic.Value
		w := fixture.NewWriter("rolling")
		stop := load(w, workers, func(i int) (string, *client.Client) {
			ts := *targets.Load()
			n := ts[int(next.Add(1))%len(ts)]
			current[i].Store(n)
			return n, clients[n]
		})
		// drained waits until no write is in flight to name, so every
		// write in flight during its restart went to another node.
		drained := func(name string) {
			waitFor("writes to "+name+" to finish before it restarts", 30*time.Second, func() bool {
				for i := range current {
					if n, _ := current[i].Load().(string); n == name {
						return false
					}
				}
				return true
			})
		}
		waitFor("writes acknowledged before the restarts", 60*time.Second, func() bool { return len(w.Acked()) >= 300 })
		for _, name := range c.Names() {
			if c.State(name) != cluster.Running {
				continue
			}
			setTargets(name)
			drained(name)
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			Expect(c.Stop(sctx, name)).To(Succeed())
			Expect(c.Start(name)).To(Succeed())
			Expect(c.WaitReady(sctx)).To(Succeed())
			cancel()
			setTargets("")
			before := len(w.Acked())
			waitFor("writes acknowledged after restarting "+name, 60*time.Second, func() bool { return len(w.Acked()) >= before+200 })
		}
		stop()
		for id := range w.Unknown() {
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			loc, err := c.AdminClient(c.RunningNames()[0]).EventLocation(lctx, id)
			cancel()
			GinkgoWriter.Printf("unknown outcome %s: landed %+v (%v)\n", id, loc, err)
		}
		Expect(w.Unknown()).To(BeEmpty(), "writes with an unknown outcome (504) during the rolling restart: %s", w.Summary())
		expectNoAckedLoss(ctx, c, w)
	}, SpecTimeout(5*time.Minute))

	// Regression: `wal verify` exited 0 on corruption,
	// and `wal repair` cut below the commit index, leaving a member that
	// panicked on every start (tocommit(N) is out of range [lastIndex(M)]).
	It("exits 3 from `wal verify` on damage, refuses a repair below the commit index, and the documented way out loses nothing", func(ctx SpecContext) {
		c, _ := newCluster("wal-repair-refused", 3)
		w := fixture.NewWriter("refused")
		stop := load(w, 8, toRunning(c))
		waitFor("writes acknowledged", 90*time.Second, func() bool { return len(w.Acked()) >= 1000 })

		victim := stopFollower(ctx, c)

		data := filepath.Join(nodeDir(c, victim), "data")
		walDir := filepath.Join(data, "wal")
		rep, err := wal.Verify(walDir)
		Expect(err).NotTo(HaveOccurred())
		Expect(rep.Problem).To(BeNil())
		first := rep.Segments[0]
		Expect(first.DataEnd).To(BeNumerically(">", 16384), "the first segment should hold more than 16 KiB of records")
		// Flip bytes well inside the first segment: a record there fails
		// its checksum and thousands of valid ones follow.
		seg, err := os.ReadFile(first.File)
		Expect(err).NotTo(HaveOccurred())
		for i := int64(8192); i < 8192+16; i++ {
			seg[i] ^= 0xff
		}
		Expect(os.WriteFile(first.File, seg, 0o644)).To(Succeed())

		out, code := tidalServer("wal", "verify", "--data-dir", data)
		GinkgoWriter.Println(out)
		Expect(code).To(Equal(3), "wal verify on a damaged WAL:\n%s", out)
		Expect(out).To(ContainSubstring("damaged"))
		Expect(out).To(ContainSubstring(filepath.Base(first.File)))

		before := hashFiles(walDir)
		out, code = tidalServer("wal", "repair", "--data-dir", data)
		GinkgoWriter.Println(out)
		Expect(code).To(Equal(3), "wal repair cutting below the commit index should refuse:\n%s", out)
		Expect(out).To(ContainSubstring("below the commit index"))
		Expect(out).To(ContainSubstring("members remove"))
		Expect(hashFiles(walDir)).To(Equal(before), "a refused repair changed the WAL")

		// The way out the refusal prints: remove the member, wipe its data
		// dir, add it back under a new id (the harness does exactly this).
		mctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		Expect(c.RemoveMember(mctx, victim)).To(Succeed())
		_, err = c.AddMember(mctx, victim)
		Expect(err).NotTo(HaveOccurred())
		Expect(c.WaitReady(mctx)).To(Succeed())
		more := len(w.Acked())
		waitFor("writes acknowledged after the rejoin", 60*time.Second, func() bool { return len(w.Acked()) >= more+300 })
		stop()
		expectNoAckedLoss(ctx, c, w)
	}, SpecTimeout(5*time.Minute))

	It("repairs damage above the commit index, and the node rejoins losing nothing acknowledged", func(ctx SpecContext) {
		c, _ := newCluster("wal-repair-above", 3)
		w := fixture.NewWriter("above")
		stop := load(w, 8, toRunning(c))
		waitFor("writes acknowledged", 90*time.Second, func() bool { return len(w.Acked()) >= 500 })
		victim := stopFollower(ctx, c)

		// After the last good record of the newest segment: junk, then a
		// valid HardState record (commit 1). A valid record after the junk
		// makes it corruption, not a torn tail; nothing committed follows.
		data := filepath.Join(nodeDir(c, victim), "data")
		rep, err := wal.Verify(filepath.Join(data, "wal"))
		Expect(err).NotTo(HaveOccurred())
		newest := rep.Segments[len(rep.Segments)-1]
		f, err := os.OpenFile(newest.File, os.O_WRONLY, 0)
		Expect(err).NotTo(HaveOccurred())
		junk := slices.Repeat([]byte{0xa5}, 32)
		_, err = f.WriteAt(append(junk, hardStateRecord(1, 0, 1)...), newest.LastGoodOffset)
		Expect(err).NotTo(HaveOccurred())
		Expect(f.Close()).To(Succeed())

		out, code := tidalServer("wal", "verify", "--data-dir", data)
		Expect(code).To(Equal(3), "wal verify on a damaged WAL:\n%s", out)
		out, code = tidalServer("wal", "repair", "--data-dir", data)
		GinkgoWriter.Println(out)
		Expect(code).To(Equal(0), "a cut above the commit index should be made:\n%s", out)
		Expect(out).To(ContainSubstring("truncated"))

		Expect(c.Start(victim)).To(Succeed())
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		Expect(c.WaitReady(rctx)).To(Succeed())
		more := len(w.Acked())
		waitFor("writes acknowledged after the repair", 60*time.Second, func() bool { return len(w.Acked()) >= more+300 })
		stop()
		expectNoAckedLoss(ctx, c, w)
		logText, err := os.ReadFile(filepath.Join(nodeDir(c, victim), "node.log"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(logText)).NotTo(ContainSubstring("out of range"))
	}, SpecTimeout(5*time.Minute))

	// Regression: a node that applied its own removal
	// logged at ERROR and exited 0, like a crash report and a clean stop.
	It("stops a removed node with exit status 5 and no error in its log", func(ctx SpecContext) {
		c, _ := newCluster("removed-exit", 3)
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		leader, err := c.WaitLeader(lctx)
		Expect(err).NotTo(HaveOccurred())
		var id uint64
		for _, n := range c.Nodes() {
			if n.Name == leader {
				id = n.ID
			}
		}
		// The leader applies its own removal, so it certainly learns of
		// it; the answer may be cut off as it stops.
		c.AdminClient(leader).RemoveMember(lctx, id)
		stdout := filepath.Join(nodeDir(c, leader), "stdout.log")
		waitFor("the removed node to exit", 60*time.Second, func() bool {
			out, _ := os.ReadFile(stdout)
			return strings.Contains(string(out), " exit: ")
		})
		out, err := os.ReadFile(stdout)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).To(ContainSubstring("exit: exit status 5"))
		Expect(string(out)).To(ContainSubstring("tidal-server: this node was removed from the cluster"))
		log, err := os.ReadFile(filepath.Join(nodeDir(c, leader), "node.log"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(log)).To(ContainSubstring("this node was removed from the cluster; stopping"))
		Expect(string(log)).NotTo(ContainSubstring("level=ERROR"))
	}, SpecTimeout(3*time.Minute))

	// Regression: `status` showed an empty CLIENT column
	// for nodes started from --peers, and, asked on a follower, MATCH 0
	// and unreachable for the leader.
	It("shows every member's client address, and the leader's view of replication when asked on a follower", func(ctx SpecContext) {
		c, _ := newCluster("status", 3)
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		leader, err := c.WaitLeader(lctx)
		Expect(err).NotTo(HaveOccurred())
		var follower cluster.Node
		for _, n := range c.Nodes() {
			if n.Name != leader && c.State(n.Name) == cluster.Running {
				follower = n
			}
		}
		rows := func() map[uint64][]string {
			out, code := tidalServer(append([]string{"status", "--addr", follower.ClientAddr}, adminFlags(c)...)...)
			Expect(code).To(Equal(0), out)
			GinkgoWriter.Println(out)
			got := map[uint64][]string{}
			for _, line := range strings.Split(out, "\n") {
				fields := strings.Fields(line)
				var id uint64
				if len(fields) == 7 {
					if _, err := fmt.Sscan(fields[0], &id); err == nil {
						got[id] = fields
					}
				}
			}
			return got
		}
		Eventually(func(g Gomega) {
			got := rows()
			for _, n := range c.Nodes() {
				if c.State(n.Name) != cluster.Running {
					continue
				}
				row, ok := got[n.ID]
				g.Expect(ok).To(BeTrue(), "status should list member %d", n.ID)
				// ID ROLE PEER CLIENT MATCH LAG REACHABLE
				g.Expect(row[3]).To(Equal(n.ClientAddr), "CLIENT of member %d", n.ID)
				g.Expect(row[4]).NotTo(Or(Equal("0"), Equal("-")), "MATCH of member %d", n.ID)
				g.Expect(row[6]).To(Equal("true"), "REACHABLE of member %d", n.ID)
			}
		}).WithTimeout(30 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
	}, SpecTimeout(2*time.Minute))
})

// hardStateRecord encodes a WAL HardState record by the format documented
// in tidal-server/wal (length | crc32c(type, payload) | type 3 | term, vote,
// commit), little-endian.
func hardStateRecord(term, vote, commit uint64) []byte {
	payload := binary.LittleEndian.AppendUint64(nil, term)
	payload = binary.LittleEndian.AppendUint64(payload, vote)
	payload = binary.LittleEndian.AppendUint64(payload, commit)
	typed := append([]byte{3}, payload...)
	rec := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
	rec = binary.LittleEndian.AppendUint32(rec, crc32.Checksum(typed, crc32.MakeTable(crc32.Castagnoli)))
	return append(rec, typed...)
}
