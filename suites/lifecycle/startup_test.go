package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/process"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// node is one tidal-server process a spec runs by hand (not through the
// harness), for what the harness cannot arrange: a resource limit, a busy
// port, a command line that must fail. Its output goes to a buffer the
// spec reads; it is killed by pid in cleanup.
type node struct {
	cmd    *exec.Cmd
	out    *process.Output
	exited chan struct{}
	err    error // valid once exited is closed
}

// startNode runs tidal-server with args; with fileBlocks >= 0 it runs under
// `ulimit -f fileBlocks` (a file-size limit: writes past it fail with
// EFBIG, a real I/O error the node must survive or fence on).
func startNode(fileBlocks int, args ...string) *node {
	if fileBlocks >= 0 {
		script := `ulimit -f "$1" && shift && exec "$@"`
		return startCommand(exec.Command("/bin/sh", append([]string{"-c", script, "sh", fmt.Sprint(fileBlocks), bins.TidalServer}, args...)...))
	}
	return startNodeOf(bins.TidalServer, args...)
}

// startNodeOf runs the tidal-server binary bin (another release's, say)
// with args.
func startNodeOf(bin string, args ...string) *node {
	return startCommand(exec.Command(bin, args...))
}

func startCommand(cmd *exec.Cmd) *node {
	n := &node{cmd: cmd, out: &process.Output{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = n.out, n.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	Expect(cmd.Start()).To(Succeed())
	pid := cmd.Process.Pid
	go func() {
		n.err = cmd.Wait()
		close(n.exited)
	}()
	DeferCleanup(func() {
		select {
		case <-n.exited:
		default:
			syscall.Kill(pid, syscall.SIGKILL)
			<-n.exited
		}
	})
	return n
}

// waitExit waits for the process to exit and returns its exit status.
func (n *node) waitExit(timeout time.Duration) int {
	select {
	case <-n.exited:
	case <-time.After(timeout):
		Fail(fmt.Sprintf("tidal-server (pid %d) still running after %s; output:\n%s", n.cmd.Process.Pid, timeout, n.out))
	}
	var ee *exec.ExitError
	if errors.As(n.err, &ee) {
		return ee.ExitCode()
	}
	Expect(n.err).NotTo(HaveOccurred())
	return 0
}

// waitReady waits until the node at addr answers /readyz, or it exits.
func (n *node) waitReady(addr string) {
	c := client.New(addr, client.WithRetries(0), client.WithTimeout(2*time.Second))
	Eventually(func() error {
		select {
		case <-n.exited:
			return StopTrying(fmt.Sprintf("tidal-server exited (%v) before it was ready; output:\n%s", n.err, n.out))
		default:
		}
		return c.Ready(context.Background())
	}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
}

// stop sends SIGTERM and expects a clean exit.
func (n *node) stop() {
	Expect(n.cmd.Process.Signal(syscall.SIGTERM)).To(Succeed())
	Expect(n.waitExit(30*time.Second)).To(Equal(0), "output:\n%s", n.out)
}

// freeAddrs returns n loopback addresses that were free a moment ago; all
// are held until every one is chosen, so none repeats.
func freeAddrs(n int) []string {
	var held []net.Listener
	var addrs []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		held = append(held, l)
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range held {
		l.Close()
	}
	return addrs
}

// specDir is a fresh directory kept (and printed) if the spec fails.
func specDir(name string) string {
	dir, err := fixture.SpecDir("lifecycle", name)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			GinkgoWriter.Printf("spec store (logs, data): %s\n", dir)
		} else {
			os.RemoveAll(dir)
		}
	})
	return dir
}

func runArgs(id int, clientAddr, peerAddr, dataDir string, extra ...string) []string {
	args := []string{"run", "--id", fmt.Sprint(id), "--client-addr", clientAddr, "--peer-addr", peerAddr, "--data-dir", dataDir}
	return append(append(args, fixture.FastFlags...), extra...)
}

var _ = Describe("starting a node", func() {
	// Regression: a node whose client port was busy
	// wrote a one-member cluster into its data dir before failing.
	It("binds every listener before writing, so a busy port leaves the data dir untouched", func() {
		dir := specDir("busy-port")
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		defer busy.Close()
		addrs := freeAddrs(1)
		data := filepath.Join(dir, "data")

		n := startNode(-1, runArgs(1, busy.Addr().String(), addrs[0], data)...)
		Expect(n.waitExit(30*time.Second)).To(Equal(1), "output:\n%s", n.out)
		Expect(n.out.String()).To(ContainSubstring("client listener on " + busy.Addr().String()))
		entries, err := os.ReadDir(data)
		if !errors.Is(err, os.ErrNotExist) {
			Expect(err).NotTo(HaveOccurred())
			Expect(entries).To(BeEmpty(), "a node that could not listen wrote into its data dir")
		}
	})

	// Regression: restarted with a three-node --peers, a
	// data dir holding a one-member cluster ran as that cluster, answered
	// /readyz and served stale reads.
	It("refuses --peers that disagree with the membership in the data dir, naming both", func() {
		dir := specDir("peers-mismatch")
		addrs := freeAddrs(4)
		client1, peer1, peer2, peer3 := addrs[0], addrs[1], addrs[2], addrs[3]
		data := filepath.Join(dir, "data")

		first := startNode(-1, runArgs(1, client1, peer1, data)...) // a one-member cluster
		first.waitReady(client1)
		first.stop()

		peers := fmt.Sprintf("1=%s,2=%s,3=%s", peer1, peer2, peer3)
		second := startNode(-1, runArgs(1, client1, peer1, data, "--peers", peers)...)
		Expect(second.waitExit(30*time.Second)).To(Equal(1), "a one-member data dir started with a three-member --peers should be refused; output:\n%s", second.out)
		out := second.out.String()
		Expect(out).To(ContainSubstring(peers), "the refusal should name --peers")
		Expect(out).To(ContainSubstring("holds members 1="+peer1+" "), "the refusal should name the stored membership")

		// --peers that match what is stored are accepted.
		third := startNode(-1, runArgs(1, client1, peer1, data, "--peers", "1="+peer1)...)
		third.waitReady(client1)
		third.stop()
	})

	// Regression: schema.fingerprint was written in place
	// without fsync; an I/O error (or a crash) left it empty and the node
	// refused to start ever after.
	It("starts after an I/O error cut the schema fingerprint write short", func() {
		dir := specDir("fingerprint-efbig")
		addrs := freeAddrs(2)
		data := filepath.Join(dir, "data")

		// File size limit 0: every write to a regular file fails (EFBIG).
		failed := startNode(0, runArgs(1, addrs[0], addrs[1], data)...)
		Expect(failed.waitExit(30*time.Second)).NotTo(Equal(0), "output:\n%s", failed.out)
		Expect(failed.out.String()).To(ContainSubstring("file too large"))

		n := startNode(-1, runArgs(1, addrs[0], addrs[1], data)...)
		n.waitReady(addrs[0])
		n.stop()
		got, err := os.ReadFile(filepath.Join(data, "schema.fingerprint"))
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(string(got))).To(HavePrefix("dim="))
	})

	// Regression: temporary files of interrupted writes
	// (snapshots, metadata) survived every restart.
	It("removes the temporary files interrupted writes left, logging each, and logs its build", func() {
		dir := specDir("stale-tmp")
		addrs := freeAddrs(2)
		data := filepath.Join(dir, "data")
		n := startNode(-1, runArgs(1, addrs[0], addrs[1], data)...)
		n.waitReady(addrs[0])
		n.stop()

		stale := []string{
			filepath.Join(data, "schema.fingerprint.tmp"),
			filepath.Join(data, "snap", "0000000000000002-00000000000000ff.snap.tmp"),
			filepath.Join(data, "wal", "00000000000000ff.wal.tmp"),
		}
		for _, f := range stale {
			Expect(os.WriteFile(f, []byte("half written"), 0o644)).To(Succeed())
		}
		logFile := filepath.Join(dir, "node.log")
		n = startNode(-1, runArgs(1, addrs[0], addrs[1], data, "--log-file", logFile)...)
		n.waitReady(addrs[0])
		n.stop()
		log, err := os.ReadFile(logFile)
		Expect(err).NotTo(HaveOccurred())
		for _, f := range stale {
			_, err := os.Stat(f)
			Expect(errors.Is(err, os.ErrNotExist)).To(BeTrue(), "%s should be gone, stat says %v", f, err)
			Expect(string(log)).To(MatchRegexp(`removed a temporary file.*`+regexp.QuoteMeta(f)), "the log should name %s", f)
		}

		// The start-up line names the build, as --version does.
		version, err := exec.Command(bins.TidalServer, "--version").Output()
		Expect(err).NotTo(HaveOccurred())
		line := strings.TrimSpace(string(version))
		Expect(line).To(MatchRegexp(`^tidal-server \S+ \(commit \S+, go\S+\)$`))
		sub, err := exec.Command(bins.TidalServer, "version").Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.TrimSpace(string(sub))).To(Equal(line))
		build := strings.TrimPrefix(line, "tidal-server ")
		Expect(string(log)).To(ContainSubstring(fmt.Sprintf(`"tidal-server started" build=%q`, build)))
	})

	// Regression: a node that fenced itself after a
	// failed write exited 0, like a clean SIGTERM.
	It("exits with status 4 when it fences itself after a failed write", func() {
		dir := specDir("fence-exit")
		addrs := freeAddrs(2)
		data := filepath.Join(dir, "data")
		// Files may not grow past 100 blocks (50 KiB under dash, 100 KiB
		// under bash): WAL segments are preallocated smaller, but a
		// snapshot of 30 embeddings (1536 floats each, ~180 KiB) is not.
		n := startNode(100, runArgs(1, addrs[0], addrs[1], data, "--wal-segment-size", "16384", "--snapshot-every", "30")...)
		n.waitReady(addrs[0])
		c := client.New(addrs[0], client.WithRetries(0))
		vec := make([]float32, 1536)
		for i := range vec {
			vec[i] = 0.5
		}
	writes:
		for i := 1; i <= 60; i++ {
			select {
			case <-n.exited:
				break writes
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c.PutEmbedding(ctx, uint64(i), fmt.Sprintf("emb-%d", i), vec)
			cancel()
		}
		Expect(n.waitExit(60*time.Second)).To(Equal(4), "a fenced node should exit 4; output:\n%s", n.out)
		Expect(n.out.String()).To(ContainSubstring("fenced"))
	})
})
