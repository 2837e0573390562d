package lifecycle

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
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

	"github.com/tidaldb/tidal/buildinfo/gobuild"
	"github.com/tidaldb/tidal/suites/fixture"
)

// readmeBlock is the first ```sh block after the heading line in readme.
func readmeBlock(readme, heading string) (string, error) {
	sc := bufio.NewScanner(strings.NewReader(readme))
	var out []string
	state := 0 // 0: before the heading, 1: before the block, 2: in it
	for sc.Scan() {
		line := sc.Text()
		switch {
		case state == 0 && line == heading:
			state = 1
		case state == 1 && line == "```sh":
			state = 2
		case state == 2 && line == "```":
			return strings.Join(out, "\n") + "\n", nil
		case state == 2:
			out = append(out, line)
		}
	}
	return "", fmt.Errorf("README.md: expected a ```sh block after %q, found none", heading)
}

// expectedOutputs are the block's comment lines that show what the line
// above printed ("# 2 204", "# {...}"): each becomes a pattern matching
// one whole output line, "..." standing for anything. Comments that
// follow a command on its own line are remarks, not outputs.
func expectedOutputs(block string) []*regexp.Regexp {
	var out []*regexp.Regexp
	for _, line := range strings.Split(block, "\n") {
		rest, ok := strings.CutPrefix(line, "# ")
		if !ok {
			continue
		}
		parts := strings.Split(rest, "...")
		for i, p := range parts {
			parts[i] = regexp.QuoteMeta(p)
		}
		out = append(out, regexp.MustCompile("^"+strings.Join(parts, ".*")+"$"))
	}
	return out
}

// missingOutputs are the expected outputs not found in output, in order:
// each must match a line after the one the previous matched.
func missingOutputs(output string, want []*regexp.Regexp) []string {
	lines := strings.Split(output, "\n")
	var missing []string
	at := 0
	for _, re := range want {
		found := false
		for i := at; i < len(lines); i++ {
			if re.MatchString(lines[i]) {
				at, found = i+1, true
				break
			}
		}
		if !found {
			missing = append(missing, re.String())
		}
	}
	return missing
}

// freePortPrefix picks a prefix P so that the ports P1, P2, P3 (P
// followed by a digit, as the README's `717$i` is) and Q1, Q2, Q3 for
// Q = P+1 are all free now: where a README block's fixed ports move to,
// so that concurrent runs keep apart.
func freePortPrefix() (client, peer string) {
	for range 200 {
		p := 2000 + rand.IntN(4400) // ports 20001..64003
		ok := true
		var held []net.Listener
		for _, prefix := range []int{p, p + 1} {
			for i := 1; i <= 3; i++ {
				l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d%d", prefix, i))
				if err != nil {
					ok = false
					break
				}
				held = append(held, l)
			}
		}
		for _, l := range held {
			l.Close()
		}
		if ok {
			return fmt.Sprint(p), fmt.Sprint(p + 1)
		}
	}
	Fail("no free port prefix found in 200 tries")
	return "", ""
}

var _ = Describe("README's secure cluster", Label("lifecycle"), func() {
	// The expected-output check can say false: a missing line, lines out
	// of order, and "..." standing for text but not for a line's ends.
	It("checks the block's expected outputs in order, \"...\" standing for anything within a line", func() {
		want := expectedOutputs("curl x\n# 2 204\ncurl y   # a remark\n# {\"error\":{\"code\":\"unauthenticated\",\"message\":\"credentials required: ...\"}}\n")
		Expect(want).To(HaveLen(2))
		good := "x\n2 204\n{\"error\":{\"code\":\"unauthenticated\",\"message\":\"credentials required: a client certificate\"}}\n"
		Expect(missingOutputs(good, want)).To(BeEmpty())
		Expect(missingOutputs("2 204\n", want)).To(HaveLen(1))
		Expect(missingOutputs("{\"error\":{\"code\":\"unauthenticated\",\"message\":\"credentials required: x\"}}\n2 204\n", want)).To(HaveLen(1), "out of order")
		Expect(missingOutputs("1.1 2 204\n", want[:1])).To(HaveLen(1), "a pattern matches a whole line")
	})

	// Requirement: "curl examples in the README that work verbatim
	// with the generated certs". The block runs as written in a directory
	// whose bin/ holds the suite's binaries, with three changes, each for
	// a shared machine: its ports move to free ones; `make build` is not
	// run (the suite built the binaries); and `sleep 1` after SIGHUP
	// becomes a wait until the new token is accepted by the nodes
	// tidal-stress targets. (The block itself waits for /readyz rather
	// than sleeping: a fresh node refuses writes for up to 10 s until it
	// has measured its peers' clocks: a first version of this spec that
	// waited only for `status` to answer got 503s from the block's POST
	// and from tidal-stress, which the README's former `sleep 2` risked
	// on a slow machine too.) Every "# ..."
	// output the block shows must be printed, in order, and the block
	// must exit 0 (bash -e).
	It("runs verbatim over TLS and prints the outputs it shows", func(ctx SpecContext) {
		if _, err := exec.LookPath("curl"); err != nil {
			Skip("curl is not installed: README's secure cluster uses it")
		}
		root, err := fixture.RepoRoot()
		Expect(err).NotTo(HaveOccurred())
		readme, err := os.ReadFile(filepath.Join(root, "README.md"))
		Expect(err).NotTo(HaveOccurred())
		block, err := readmeBlock(string(readme), "### A secure cluster")
		Expect(err).NotTo(HaveOccurred())
		want := expectedOutputs(block)
		Expect(len(want)).To(BeNumerically(">=", 3), "expected outputs shown in the block:\n%s", block)

		dir := specDir("readme-secure")
		binDir := filepath.Join(dir, "bin")
		Expect(os.MkdirAll(binDir, 0o755)).To(Succeed())
		Expect(os.Symlink(bins.TidalServer, filepath.Join(binDir, "tidal-server"))).To(Succeed())
		build := gobuild.Command(ctx, root, gobuild.StampOf(root), filepath.Join(binDir, "tidal-stress"), "./harness/cmd/tidal-stress")
		out, err := build.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "building tidal-stress: %s", out)

		clientPrefix, peerPrefix := freePortPrefix()
		script := block
		for _, r := range []struct{ old, new string }{
			{"make build\n", ": make build  # the suite built bin/\n"},
			{"kill -HUP $pids; sleep 1", "kill -HUP $pids; for a in 127.0.0.1:7171 127.0.0.1:7172; do until [ \"$(curl -s -o /dev/null -w '%{http_code}' --cacert $D/certs/ca.crt -H \"Authorization: Bearer $(cat $D/ci.token)\" https://$a/cluster/status)\" = 200 ]; do sleep 0.1; done; done"},
		} {
			Expect(script).To(ContainSubstring(r.old), "the block no longer has %q: update this spec with README.md", r.old)
			script = strings.Replace(script, r.old, r.new, 1)
		}
		for _, r := range []struct{ old, new string }{
			{"717$i", clientPrefix + "$i"}, {"720$i", peerPrefix + "$i"},
			{":717", ":" + clientPrefix}, {":720", ":" + peerPrefix},
		} {
			Expect(script).To(ContainSubstring(r.old), "the block no longer has %q: update this spec with README.md", r.old)
			script = strings.ReplaceAll(script, r.old, r.new)
		}
		Expect(script).NotTo(MatchRegexp(`:7[12][0-9]{2}\b`), "a port of the block was not moved:\n%s", script)
		Expect(os.WriteFile(filepath.Join(dir, "block.sh"), []byte(script), 0o644)).To(Succeed())

		runCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(runCtx, "bash", "-e", filepath.Join(dir, "block.sh"))
		cmd.Dir = dir
		// Its own process group, so that the nodes it starts in the
		// background are stopped with it whatever happens.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		Expect(cmd.Start()).To(Succeed())
		DeferCleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
		err = cmd.Wait()
		GinkgoWriter.Printf("block.sh (in %s):\n--- stdout\n%s--- stderr\n%s\n", dir, stdout.String(), stderr.String())
		Expect(err).NotTo(HaveOccurred(), "the block failed; its output is above")
		Expect(missingOutputs(stdout.String(), want)).To(BeEmpty(), "outputs the README shows but the block did not print (stdout above)")
	}, SpecTimeout(5*time.Minute))
})
