package lifecycle

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
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
)

var _ = Describe("the README", func() {
	// Regression (issue 9 item 20): the walkthrough wrote n1/…n4/,
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

		// -e: the first command that fails ends it, naming itself. The
		// nodes are background jobs in bash's process group, which the
		// cleanup kills whatever state the script died in.
		prelude := "set -e\n" +
			"trap 'echo \"walkthrough: exit status $? from: $BASH_COMMAND\" >&2' ERR\n"
		cmd := exec.Command("bash", "-c", prelude+script+"\necho walkthrough-done\n")
		cmd.Dir = root
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		// The nodes inherit the output pipe; do not wait on it for ever
		// once bash has exited.
		cmd.WaitDelay = 10 * time.Second
		Expect(cmd.Start()).To(Succeed())
		pgid := cmd.Process.Pid
		DeferCleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var err error
		select {
		case err = <-done:
		case <-ctx.Done():
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-done
			Fail(fmt.Sprintf("the walkthrough did not finish before the spec's timeout; its output:\n%s", out.String()))
		}
		GinkgoWriter.Println(out.String())
		Expect(err).NotTo(HaveOccurred(), "the walkthrough failed; its output:\n%s", out.String())
		Expect(out.String()).To(ContainSubstring("walkthrough-done"))
		Expect(out.String()).To(ContainSubstring("removed member 4"))
		Expect(checkoutStatus(root)).To(Equal(before), "the walkthrough left files in the checkout")
	}, SpecTimeout(10*time.Minute))
})

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

// freePortBlock returns a four-digit b with the ports b0 … b9 free now.
func freePortBlock() int {
	for range 200 {
		b := 2000 + rand.IntN(4000) // ports 20000-59999
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
	Fail("found no block of ten free ports")
	return 0
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
