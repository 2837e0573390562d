package ci

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// earlyExitReader matches a pipeline stage that stops reading before its
// input ends (head, or grep -q/-m): the writer before it then dies of
// SIGPIPE whenever it writes after that, and under `set -o pipefail` the
// pipeline — and the script — fails at random.
var earlyExitReader = regexp.MustCompile(`\|\s*(head\b|grep\s+(-[a-zA-Z]*[qm]))`)

// pipefailHazards lists the lines of a pipefail script that pipe into a
// reader that may exit early.
func pipefailHazards(script string) []string {
	if !strings.Contains(script, "pipefail") {
		return nil
	}
	var out []string
	sc := bufio.NewScanner(strings.NewReader(script))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			continue
		}
		if earlyExitReader.MatchString(line) {
			out = append(out, sc.Text())
		}
	}
	return out
}

// Regression: .ci/run (set -euo pipefail) printed etcd's version with
// `etcd --version | head -n 1`; head exits after one line, etcd died of
// SIGPIPE writing the next, and CI failed before running a single test
// (2 runs in 6 on this machine).
func TestCIScriptsPipeIntoNoEarlyExitingReader(t *testing.T) {
	for _, p := range []string{"../.ci/run", "fuzz", "e2e"} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if bad := pipefailHazards(string(b)); len(bad) > 0 {
			t.Errorf("%s runs under pipefail and pipes into a reader that may exit early (the writer's SIGPIPE fails the script at random); use sed -n 1p or read all input:\n%s", filepath.Clean(p), strings.Join(bad, "\n"))
		}
	}
}

func TestPipefailHazardsSaysFalse(t *testing.T) {
	script := "set -euo pipefail\netcd --version | head -n 1\nls | grep -q x\n# ok | head\nfoo | sed -n 1p\n"
	if got := pipefailHazards(script); len(got) != 2 {
		t.Fatalf("expected the head and grep -q lines, found %q", got)
	}
	if got := pipefailHazards("set -e\nfoo | head -n 1\n"); got != nil {
		t.Fatalf("expected nothing without pipefail, found %q", got)
	}
}
