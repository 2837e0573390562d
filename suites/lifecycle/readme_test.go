package lifecycle

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/process"
)

var _ = Describe("the README", func() {
	// Regression: the walkthrough wrote n1/…n4/,
	// tidal.backup and restored/ into the checkout, and its last line
	// (kill %1 %2 %3 %4) failed because node 4 had stopped itself. It must
	// run as written, every command succeeding, and leave the checkout as
	// it found it. Only its ports are moved (to free ones), so that it
	// cannot meet another run on this machine; its waits are conditions,
	// so a loaded machine only makes it slower.
	It("runs the 3-node walkthrough as written: every command succeeds and nothing lands in the checkout", func(ctx SpecContext) {
		root := repoRoot()
		script := readmeSection(filepath.Join(root, "README.md"), "### A 3-node cluster on one machine", "### A secure cluster")
		Expect(script).To(ContainSubstring("members remove 4"), "the walkthrough's blocks were not found in README.md")
		script = moveReadmePorts(script)
		before := checkoutStatus(root)
		out := runReadmeScript(ctx, root, script)
		Expect(out).To(ContainSubstring("removed member 4"))
		Expect(checkoutStatus(root)).To(Equal(before), "the walkthrough left files in the checkout")
	}, SpecTimeout(10*time.Minute))

	// Regression: the API examples wrote vec.bin into
	// the checkout. Every example must work against a node started with no
	// flags (here: the same node on free ports, its data dir in a
	// temporary directory), answer what the README says it answers, and
	// leave the checkout as it was.
	It("answers the API examples as the README says, leaving nothing in the checkout", func(ctx SpecContext) {
		root := repoRoot()
		script := readmeSection(filepath.Join(root, "README.md"), "### The API, with examples", "### A 3-node cluster on one machine")
		Expect(script).To(ContainSubstring("/v1/query/nearest"), "the API examples were not found in README.md")
		b := freePortBlock()
		client, peer := "127.0.0.1:"+strconv.Itoa(b*10), "127.0.0.1:"+strconv.Itoa(b*10+1)
		script = strings.ReplaceAll(script, "127.0.0.1:7070", client)

		node := exec.Command(bins.TidalServer, "run", "--client-addr", client, "--peer-addr", peer,
			"--data-dir", filepath.Join(GinkgoT().TempDir(), "tidal-data"))
		node.Stdout, node.Stderr = GinkgoWriter, GinkgoWriter
		Expect(node.Start()).To(Succeed())
		exited := make(chan error, 1)
		go func() { exited <- node.Wait() }()
		DeferCleanup(func() {
			_ = node.Process.Kill()
			<-exited
		})
		Eventually(func() (int, error) {
			resp, err := http.Get("http://" + client + "/readyz")
			if err != nil {
				return 0, err
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.StatusCode, nil
		}).WithContext(ctx).WithTimeout(time.Minute).WithPolling(100*time.Millisecond).Should(Equal(http.StatusOK), "the node never became ready")

		before := checkoutStatus(root)
		out := runReadmeScript(ctx, root, script)
		for _, want := range []string{
			"HTTP/1.1 204 No Content",
			`{"results":[{"entity":42,"score":1}]}`,
			`{"results":[{"entity":42,"score":1},{"entity":43,"score":1}]}`,
			`{"id":"ev-1","index":3,"term":2,"entity":42,"signal":"view"}`,
			`{"error":{"code":"invalid_argument","message":"expected a number, found a string","field":"events[1].weight"}}`,
		} {
			Expect(out).To(ContainSubstring(want), "the README promises this answer")
		}
		Expect(checkoutStatus(root)).To(Equal(before), "the API examples left files in the checkout")
	}, SpecTimeout(5*time.Minute))
})

// runReadmeScript runs script in one bash in root, as a reader pasting it
// would, and returns its output. -e: the first command that fails ends it,
// naming itself. Background jobs stay in bash's process group, which is
// killed (by its id) when the spec ends, whatever state the script died in.
// A background node that fails to start prints "error: ..." and exits while
// the script waits for it in an until loop for ever: that line ends the
// script at once.
func runReadmeScript(ctx SpecContext, root, script string) string {
	prelude := "set -e\n" +
		"trap 'echo \"README script: exit status $? from: $BASH_COMMAND\" >&2' ERR\n"
	cmd := exec.Command("bash", "-c", prelude+script+"\necho readme-script-done\n")
	cmd.Dir = root
	out := &process.Output{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Background jobs inherit the output pipe; do not wait on it for ever
	// once bash has exited.
	cmd.WaitDelay = 10 * time.Second
	Expect(cmd.Start()).To(Succeed())
	pgid := cmd.Process.Pid
	DeferCleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	watch := time.NewTicker(250 * time.Millisecond)
	defer watch.Stop()
	var err error
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-watch.C:
			if strings.Contains("\n"+out.String(), "\nerror: ") {
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				<-done
				Fail(fmt.Sprintf("a process of the README script failed; its output:\n%s", out.String()))
			}
		case <-ctx.Done():
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-done
			Fail(fmt.Sprintf("the README script did not finish before the spec's timeout; its output:\n%s", out.String()))
		}
	}
	GinkgoWriter.Println(out.String())
	Expect(err).NotTo(HaveOccurred(), "the README script failed; its output:\n%s", out.String())
	Expect(out.String()).To(ContainSubstring("readme-script-done"))
	return out.String()
}

// repoRoot is the checkout this suite runs in.
func repoRoot() string {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	Expect(err).NotTo(HaveOccurred(), "git rev-parse --show-toplevel")
	return strings.TrimSpace(string(out))
}

// readmeSection concatenates the ```sh blocks of path between the headings
// from and to, in order: what a reader pastes into one shell.
func readmeSection(path, from, to string) string {
	b, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	text := string(b)
	start := strings.Index(text, from)
	Expect(start).To(BeNumerically(">=", 0), "README.md has no %q", from)
	end := strings.Index(text[start:], to)
	Expect(end).To(BeNumerically(">", 0), "README.md has no %q after %q", to, from)
	var script strings.Builder
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(text[start:start+end], -1) {
		script.WriteString(m[1])
	}
	return script.String()
}

// moveReadmePorts moves the walkthrough's client ports 707x and peer ports
// 710x to two blocks of ten free ports (the text builds them as
// 127.0.0.1:707$i, so a port's last digit stays where it is).
func moveReadmePorts(script string) string {
	for _, prefix := range []string{"707", "710"} {
		script = strings.ReplaceAll(script, "127.0.0.1:"+prefix, "127.0.0.1:"+strconv.Itoa(freePortBlock()))
	}
	return script
}

// freePortBlock returns a four-digit b with the ports b0 … b9 free now and
// outside the kernel's ephemeral range. The walkthrough binds some of them
// many seconds after this check, and a port inside that range can be taken
// meanwhile as the source port of any outgoing connection (its own nodes'
// connections to each other included): node 4 once failed to start with
// "address already in use" that way.
func freePortBlock() int {
	low, high := ephemeralPorts()
	for range 200 {
		b := 1100 + rand.IntN(5400) // ports 11000-64999
		if b*10+9 >= low && b*10 <= high {
			continue
		}
		var held []net.Listener
		for d := range 10 {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(b*10+d))
			if err != nil {
				break
			}
			held = append(held, l)
		}
		free := len(held) == 10
		for _, l := range held {
			l.Close()
		}
		if free {
			return b
		}
	}
	Fail("found no block of ten free ports outside the ephemeral range")
	return 0
}

// ephemeralPorts is the range the kernel picks source ports from (Linux's
// default when it cannot be read).
func ephemeralPorts() (low, high int) {
	low, high = 32768, 60999
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return low, high
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return low, high
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return low, high
	}
	return l, h
}

// checkoutStatus lists every file in the checkout that git does not track
// or that differs from HEAD, ignored ones included, except bin/ (the
// walkthrough starts with make build).
func checkoutStatus(root string) []string {
	cmd := exec.Command("git", "status", "--porcelain=v1", "--ignored=matching", "--untracked-files=all")
	cmd.Dir = root
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "git status")
	var files []string
	for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if line == "" || strings.HasPrefix(line[3:], "bin/") {
			continue
		}
		files = append(files, line)
	}
	slices.Sort(files)
	return files
}
