package chaos

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// securedPlanes is what a node started with the harness's certificates
// and tokens says about itself on its start-up line: every chaos run
// talks TLS h2 with certificates and tokens, on both planes.
const securedPlanes = "client plane: TLS (h2, http/1.1); peer plane: mutual TLS; authentication: client certificates and"

// startLinesSecured reads every node.log under nodesDir and checks that
// each "tidal-server started" line describes a secured node, and that at
// least `nodes` node logs have one: a run whose nodes ran in plaintext,
// or whose logs cannot be read, is not one.
func startLinesSecured(nodesDir string, nodes int) error {
	logs, err := filepath.Glob(filepath.Join(nodesDir, "*", "node.log"))
	if err != nil {
		return err
	}
	started := 0
	for _, path := range logs {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		seen := false
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, `msg="tidal-server started"`) {
				continue
			}
			seen = true
			if !strings.Contains(line, securedPlanes) {
				f.Close()
				return fmt.Errorf("%s: expected every start to say %q, found: %s", path, securedPlanes, line)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if seen {
			started++
		}
	}
	if started < nodes {
		return fmt.Errorf("expected start-up lines of at least %d nodes under %s, found %d (of %d node logs)", nodes, nodesDir, started, len(logs))
	}
	return nil
}

var _ = Describe("the chaos suite's check that runs were secured", Label("smoke"), func() {
	// The check every chaos run passes (chaosRun) can say false: a
	// plaintext node, a peer plane left plaintext, and too few nodes.
	It("refuses plaintext planes and missing nodes, and accepts secured ones", func() {
		write := func(dir string, lines ...string) {
			Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
			Expect(os.WriteFile(filepath.Join(dir, "node.log"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)).To(Succeed())
		}
		start := func(security string) string {
			return `time=2026-12-01T13:00:00Z level=INFO msg="tidal-server started" id=1 security="` + security + `"`
		}
		secured := start("client plane: TLS (h2, http/1.1); peer plane: mutual TLS; authentication: client certificates and 3 bearer tokens")
		dir := GinkgoT().TempDir()
		write(filepath.Join(dir, "n1"), secured)
		write(filepath.Join(dir, "n2"), secured, "later", secured)
		Expect(startLinesSecured(dir, 2)).To(Succeed())
		Expect(startLinesSecured(dir, 3)).To(MatchError(ContainSubstring("at least 3 nodes")))

		write(filepath.Join(dir, "n3"), secured, start("client plane: plaintext; peer plane: plaintext; insecure: no authentication"))
		Expect(startLinesSecured(dir, 2)).To(MatchError(ContainSubstring("n3")))

		write(filepath.Join(dir, "n3"), start("client plane: TLS (h2, http/1.1); peer plane: plaintext; authentication: client certificates and 3 bearer tokens"))
		Expect(startLinesSecured(dir, 2)).To(MatchError(ContainSubstring("peer plane: mutual TLS")))
	})
})
