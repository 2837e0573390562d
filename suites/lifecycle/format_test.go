package lifecycle

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/peer"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// dirDigest hashes every file under dir (names and contents), to show a
// refusal changed nothing.
func dirDigest(dir string) string {
	h := sha256.New()
	Expect(filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "LOCK" {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
		return nil
	})).To(Succeed())
	return fmt.Sprintf("%x", h.Sum(nil))
}

func writeOne(addr, id string) {
	c := client.New(addr, client.WithTimeout(10*time.Second))
	Eventually(func() error {
		_, err := c.WriteSignals(context.Background(), []client.Event{{ID: id, Entity: 7, Signal: "view"}})
		return err
	}).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
}

// Format versions. --test-newer-format (hidden, in a tidalbugs build
// only: newerServer) makes a node act as a future release: WAL segments
// and snapshots one version up, a peer protocol that no longer talks to
// this one. Every other node is the normal build.
var _ = Describe("format versions", func() {
	It("Regression: test hooks in a normal build: it has no --test-newer-format, and refuses the flag", func() {
		normal, err := os.ReadFile(bins.TidalServer)
		Expect(err).NotTo(HaveOccurred())
		newer, err := os.ReadFile(newerServer)
		Expect(err).NotTo(HaveOccurred())
		for _, s := range []string{"test-newer-format", "SetTestNewerFormat", "SetTestNewerProtocol"} {
			Expect(bytes.Contains(normal, []byte(s))).To(BeFalse(), "the normal tidal-server binary (%s) should not contain %q", bins.TidalServer, s)
			Expect(bytes.Contains(newer, []byte(s))).To(BeTrue(), "the tidalbugs binary (%s) should contain %q (else this check proves nothing)", newerServer, s)
		}
		out, err := exec.Command(bins.TidalServer, "run", "--test-newer-format", "--data-dir", filepath.Join(specDir("format-no-flag"), "data")).CombinedOutput()
		Expect(err).To(HaveOccurred(), "a normal build should refuse --test-newer-format; output:\n%s", out)
		Expect(string(out)).To(ContainSubstring("unknown flag: --test-newer-format"))
	})

	It("refuses a data dir a newer release wrote (a downgrade), naming the file and both versions, and changes nothing", func() {
		dir := specDir("format-downgrade")
		addrs := freeAddrs(2)
		data := filepath.Join(dir, "data")

		newer := startNodeOf(newerServer, runArgs(1, addrs[0], addrs[1], data, "--test-newer-format")...)
		newer.waitReady(addrs[0])
		writeOne(addrs[0], "fmt-1")
		_, _, err := client.New(addrs[0]).Snapshot(context.Background())
		Expect(err).NotTo(HaveOccurred())
		newer.stop()
		before := dirDigest(data)

		older := startNode(-1, runArgs(1, addrs[0], addrs[1], data)...)
		Expect(older.waitExit(30*time.Second)).To(Equal(1), "this build must refuse a newer data dir; output:\n%s", older.out)
		out := older.out.String()
		Expect(out).To(ContainSubstring(filepath.Join(data, "wal", "0000000000000000.wal")), "the refusal names the file")
		Expect(out).To(ContainSubstring(fmt.Sprintf("WAL segment format version %d is newer than this build reads (versions %d to %d)", wal.FormatVersion+1, wal.MinFormatVersion, wal.FormatVersion)))
		Expect(dirDigest(data)).To(Equal(before), "a refused start changed the data dir")
		// Not damage: wal verify says what it is, with the refusal status,
		// not the damage one (3).
		verify := exec.Command(bins.TidalServer, "wal", "verify", "--data-dir", data)
		vout, err := verify.CombinedOutput()
		Expect(verify.ProcessState.ExitCode()).To(Equal(1), "wal verify on a newer log: %v\n%s", err, vout)
		Expect(string(vout)).To(ContainSubstring(fmt.Sprintf("format version %d is newer than this build reads", wal.FormatVersion+1)))

		// The newer release still opens it, with the write there.
		again := startNodeOf(newerServer, runArgs(1, addrs[0], addrs[1], data, "--test-newer-format")...)
		again.waitReady(addrs[0])
		e, err := client.New(addrs[0]).Entity(context.Background(), 7)
		Expect(err).NotTo(HaveOccurred())
		Expect(e.Signals["view"].Count).To(BeEquivalentTo(1))
		again.stop()
	})

	It("refuses to replicate across an incompatible peer protocol (an upgrade to a release that dropped this one), on both sides, and the compatible majority serves", func() {
		dir := specDir("format-protocol")
		addrs := freeAddrs(6)
		peers := fmt.Sprintf("1=%s,2=%s,3=%s", addrs[3], addrs[4], addrs[5])
		var nodes []*node
		for i := range 3 {
			bin, extra := bins.TidalServer, []string{"--peers", peers, "--log-file", filepath.Join(dir, fmt.Sprintf("n%d.log", i+1))}
			if i == 2 {
				bin, extra = newerServer, append(extra, "--test-newer-format")
			}
			nodes = append(nodes, startNodeOf(bin, runArgs(i+1, addrs[i], addrs[3+i], filepath.Join(dir, fmt.Sprint(i+1)), extra...)...))
		}
		nodes[0].waitReady(addrs[0])
		writeOne(addrs[0], "fmt-mixed")

		logOf := func(i int) string {
			b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("n%d.log", i)))
			return string(b)
		}
		Eventually(func() string { return logOf(1) }).WithTimeout(60*time.Second).WithPolling(200*time.Millisecond).Should(
			And(ContainSubstring("refusing peer stream: incompatible peer protocol"), ContainSubstring(fmt.Sprintf("peer_protocol=%d", peer.ProtocolVersion+1))),
			"node 1 refuses the newer node's streams, naming its protocol")
		Eventually(func() string { return logOf(3) }).WithTimeout(60*time.Second).WithPolling(200*time.Millisecond).Should(
			ContainSubstring(fmt.Sprintf("talks to protocol %d or newer only", peer.ProtocolVersion+1)), "the newer node refuses node 1's, naming why")
		metrics, err := client.New(addrs[0]).Metrics(context.Background())
		Expect(err).NotTo(HaveOccurred())
		Expect(string(metrics)).To(MatchRegexp(`tidal_peer_messages_dropped_total\{reason="protocol_version"\} [1-9]`))
		// The minimum-entry-format rule counts the member it cannot talk
		// to as format 1.
		Expect(string(metrics)).To(MatchRegexp(`(?m)^tidal_cluster_entry_format 1$`))
		leaderSt, err := client.New(addrs[0]).Status(context.Background())
		Expect(err).NotTo(HaveOccurred())
		st, err := client.New(addrs[2]).Status(context.Background())
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Leader).To(BeZero(), "the newer node follows no leader: %+v", st)
		Expect(st.Applied).To(BeNumerically("<", leaderSt.Applied), "the newer node applied nothing of the others' log beyond its bootstrap: %+v", st)
		for _, n := range nodes {
			n.stop()
		}
	})
})

// A follower removed while it could not hear of it (here:
// frozen with SIGSTOP) never applies its removal: the leader stops sending
// to it. Before, it ran on, campaigning in vain; now the first member it
// reaches tells it, and it stops with the removed exit status.
var _ = Describe("a removed member", func() {
	It("that never learned of its removal is told by the peer plane and exits 5", func() {
		dir := specDir("removed-member")
		addrs := freeAddrs(6)
		peers := fmt.Sprintf("1=%s,2=%s,3=%s", addrs[3], addrs[4], addrs[5])
		var nodes []*node
		for i := range 3 {
			nodes = append(nodes, startNode(-1, runArgs(i+1, addrs[i], addrs[3+i], filepath.Join(dir, fmt.Sprint(i+1)), "--peers", peers)...))
		}
		for i := range 3 {
			nodes[i].waitReady(addrs[i])
		}
		writeOne(addrs[0], "rm-1")
		Expect(nodes[2].cmd.Process.Signal(syscall.SIGSTOP)).To(Succeed())
		DeferCleanup(func() { nodes[2].cmd.Process.Signal(syscall.SIGCONT) })

		c := client.New(addrs[0], client.WithTimeout(10*time.Second))
		Eventually(func() error { return c.RemoveMember(context.Background(), 3) }).
			WithTimeout(60 * time.Second).WithPolling(500 * time.Millisecond).Should(Succeed())
		writeOne(addrs[0], "rm-2") // committed by 1 and 2 alone
		Expect(nodes[2].cmd.Process.Signal(syscall.SIGCONT)).To(Succeed())

		Expect(nodes[2].waitExit(90*time.Second)).To(Equal(5), "the removed node should stop with exit status 5; output:\n%s", nodes[2].out)
		Expect(nodes[2].out.String()).To(ContainSubstring("a member says this node was removed from the cluster"))
		for _, n := range nodes[:2] {
			n.stop()
		}
	})
})
