package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/process"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// A stalled disk under the leader, driven directly
// rather than through a run: a chaos run's closed-loop clients each send
// every third write to the stalled node and wait there, so the run shows
// the cluster's writes stop, not whether the others could go on. Here
// writes go to the other nodes only while a write held by the stalled
// leader waits. They are acknowledged: with raft's asynchronous storage
// writes the leader counts itself only once its own WAL synced, so it
// goes on leading and commits with the two followers' fsyncs (or the
// followers elect another); either way the held write is not
// acknowledged while the stall lasts (the leader applies nothing it has
// not synced), and after the heal releases it the stalled node applies
// everything committed meanwhile.
var _ = Describe("slow-disk-stall on the leader", Label("faultfs"), func() {
	BeforeEach(requireFaultFS)

	It("slow-disk-stall: the stalled leader stops acknowledging, the others elect and go on, it catches up after the heal", func(ctx SpecContext) {
		dir, err := fixture.SpecDir("chaos-suite", "stall-leader")
		Expect(err).NotTo(HaveOccurred())
		reg, err := process.NewRegistry(filepath.Join(dir, "pids"))
		Expect(err).NotTo(HaveOccurred())
		be, err := process.NewBackend(bins.TidalServer, reg)
		Expect(err).NotTo(HaveOccurred())
		c, err := cluster.New(cluster.Config{Nodes: 3, Backend: be, Dir: filepath.Join(dir, "nodes"), Flags: fixture.FastFlags, DiskFaults: true})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() {
			c.Close()
			if !CurrentSpecReport().Failed() {
				os.RemoveAll(dir)
			} else {
				GinkgoWriter.Printf("cluster dir (node logs): %s\n", dir)
			}
		})

		n := 0
		write := func(ctx context.Context, node string) (client.Ack, error) {
			n++
			return c.Client(node).WriteSignals(ctx, []client.Event{{ID: fmt.Sprintf("stall-%d", n), Entity: fixture.Entity(int64(n)), Signal: "view"}})
		}
		leader, err := c.WaitLeader(ctx)
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() error { _, err := write(ctx, leader); return err }).WithContext(ctx).WithTimeout(time.Minute).Should(Succeed())

		disk, err := c.Disk(leader)
		Expect(err).NotTo(HaveOccurred())
		// Cleanups run last-in first-out: the stall is released before
		// Close stops the nodes (a process held in a stalled fsync does
		// not exit until it is answered).
		DeferCleanup(func() { disk.Clear() })
		Expect(disk.Set(faultfs.Faults{SlowDisk: []faultfs.SlowDisk{{Ops: []faultfs.Op{faultfs.OpWrite, faultfs.OpFsync}, Stall: true}}})).To(Succeed())
		type outcome struct {
			ack client.Ack
			err error
		}
		held := make(chan outcome, 1)
		go func() {
			hctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ack, err := c.Client(leader).WriteSignals(hctx, []client.Event{{ID: "stall-held", Entity: 1, Signal: "view"}})
			held <- outcome{ack, err}
		}()
		Eventually(func() uint64 { return disk.Stats().Faults.Stalled }).WithContext(ctx).WithTimeout(time.Minute).Should(BeNumerically(">", 0))

		// The others go on: a new leader among them, and writes acked.
		var others []string
		for _, name := range c.Names() {
			if name != leader {
				others = append(others, name)
			}
		}
		acked := 0
		Eventually(func() int {
			for _, o := range others {
				wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				if _, err := write(wctx, o); err == nil {
					acked++
				}
				cancel()
			}
			return acked
		}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(10*time.Millisecond).Should(BeNumerically(">=", 20),
			"the other nodes did not acknowledge writes while %s's disk was stalled", leader)
		var commit uint64
		for _, o := range others {
			st, err := c.Status(ctx, o)
			Expect(err).NotTo(HaveOccurred())
			commit = max(commit, st.Applied)
			GinkgoWriter.Printf("%s under the stall: role %s, leader %d, commit %d, applied %d\n", o, st.Role, st.Leader, st.Commit, st.Applied)
		}
		if st, err := c.Status(ctx, leader); err == nil {
			GinkgoWriter.Printf("%s (stalled): role %s, commit %d, applied %d\n", leader, st.Role, st.Commit, st.Applied)
			Expect(st.Applied).To(BeNumerically("<", commit), "%s applied what the others committed while its disk was stalled", leader)
		}
		select {
		case h := <-held:
			Expect(h.err).To(HaveOccurred(), "%s acknowledged a write (seq %d) while its disk was stalled", leader, h.ack.Seq)
		default: // still held: not acknowledged
		}
		GinkgoWriter.Printf("%d writes acked by %v while %s's disk was stalled; their commit index %d\n", acked, others, leader, commit)

		// The heal releases every held operation at once; the stalled
		// node catches up with what the others committed.
		disk.Clear(faultfs.KindSlowDisk)
		Eventually(func() (uint64, error) {
			st, err := c.Status(ctx, leader)
			if err != nil {
				return 0, err
			}
			return st.Applied, nil
		}).WithContext(ctx).WithTimeout(2*time.Minute).Should(BeNumerically(">=", commit), "%s did not catch up after the heal", leader)
		Eventually(held).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Receive())
		Expect(c.State(leader)).To(Equal(cluster.Running), "%s exited under or after the stall", leader)
	}, SpecTimeout(6*time.Minute))
})
