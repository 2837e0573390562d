package lifecycle

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// `tidal-server recover --force-new-cluster` after losing
// a quorum, with the loss it states measured against what was
// acknowledged.
var _ = Describe("recover --force-new-cluster", func() {
	It("makes the survivor a one-member cluster keeping its whole log; exactly the writes acknowledged above its last index are lost; a lost member that comes back is told it was removed", func() {
		dir := specDir("force-new-cluster")
		addrs := freeAddrs(6)
		peers := fmt.Sprintf("1=%s,2=%s,3=%s", addrs[3], addrs[4], addrs[5])
		data := func(i int) string { return filepath.Join(dir, fmt.Sprint(i)) }
		args := func(i int, extra ...string) []string {
			return runArgs(i, addrs[i-1], addrs[2+i], data(i), extra...)
		}
		nodes := map[int]*node{}
		for i := 1; i <= 3; i++ {
			nodes[i] = startNode(-1, args(i, "--peers", peers)...)
		}
		for i := 1; i <= 3; i++ {
			nodes[i].waitReady(addrs[i-1])
		}
		c := client.New(addrs[0], client.WithTimeout(10*time.Second))
		acked := map[string]uint64{}
		write := func(id string) {
			var ack client.Ack
			Eventually(func() (err error) {
				ack, err = c.WriteSignals(context.Background(), []client.Event{{ID: id, Entity: 11, Signal: "view"}})
				return err
			}).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
			acked[id] = ack.Seq
		}
		By("writing with all three members")
		for i := range 10 {
			write(fmt.Sprintf("fnc-a%d", i))
		}
		// The survivor misses what comes next: only 1 and 2 have it.
		Expect(nodes[3].cmd.Process.Signal(syscall.SIGSTOP)).To(Succeed())
		DeferCleanup(func() { nodes[3].cmd.Process.Signal(syscall.SIGCONT) })
		for i := range 10 {
			write(fmt.Sprintf("fnc-b%d", i))
		}
		By("losing members 1 and 2")
		for _, i := range []int{1, 2} {
			Expect(nodes[i].cmd.Process.Signal(syscall.SIGKILL)).To(Succeed())
			nodes[i].waitExit(30 * time.Second)
		}
		// The survivor dies where it stood, still stopped. Let run again
		// (SIGCONT, then a drain) it read the appends of the b writes that
		// its kernel had buffered while it was stopped, and applied them
		// before it exited: the scenario then lost nothing and failed
		// (seen once in a full lifecycle run).
		Expect(nodes[3].cmd.Process.Signal(syscall.SIGKILL)).To(Succeed())
		nodes[3].waitExit(30 * time.Second)

		recoverCmd := func(extra ...string) string {
			out, err := exec.Command(bins.TidalServer, append([]string{"recover", "--force-new-cluster", "--data-dir", data(3), "--id", "3"}, extra...)...).CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "recover:\n%s", out)
			return string(out)
		}
		By("recovering member 3")
		dry := recoverCmd("--dry-run")
		m := regexp.MustCompile(`member=3 last_index=(\d+) last_term=\d+ commit=\d+ snapshot=\d+ members=1,2,3`).FindStringSubmatch(dry)
		Expect(m).NotTo(BeNil(), "dry run:\n%s", dry)
		last, _ := strconv.ParseUint(m[1], 10, 64)
		Expect(dry).To(ContainSubstring(fmt.Sprintf("loses: every write acknowledged at a log index above %d", last)))
		Expect(recoverCmd("--dry-run")).To(Equal(dry), "a dry run changes nothing")
		out := recoverCmd()
		Expect(out).To(ContainSubstring(fmt.Sprintf("at index %d", last)))

		By("starting the new cluster")
		survivor := startNode(-1, args(3, "--peers", "3="+addrs[5])...)
		survivor.waitReady(addrs[2])
		sc := client.New(addrs[2], client.WithTimeout(10*time.Second))
		lost := 0
		for id, seq := range acked {
			_, err := sc.EventLocation(context.Background(), id)
			if seq <= last {
				Expect(err).NotTo(HaveOccurred(), "write %s acknowledged at index %d <= %d must survive", id, seq, last)
			} else {
				Expect(err).To(HaveOccurred(), "write %s acknowledged at index %d > %d is stated lost but is there", id, seq, last)
				lost++
			}
		}
		GinkgoWriter.Printf("last index %d; %d of %d acknowledged writes lost, as stated\n", last, lost, len(acked))
		Expect(lost).To(BeNumerically(">", 0), "the scenario lost nothing: it proves nothing")
		_, err := sc.WriteSignals(context.Background(), []client.Event{{ID: "fnc-after", Entity: 11, Signal: "view"}})
		Expect(err).NotTo(HaveOccurred(), "the new cluster takes writes")

		// A lost member that was not lost after all comes back with its
		// old data: the new cluster tells it it was removed.
		By("bringing old member 1 back")
		back := startNode(-1, args(1, "--peers", peers)...)
		Expect(back.waitExit(90*time.Second)).To(Equal(5), "the old member 1 should be told it was removed; output:\n%s", back.out)
		survivor.stop()
	})
})
