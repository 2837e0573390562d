package ci

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Regression: `make unit` runs the packages listed in
// the Makefile's UNIT_PKGS, so a package with tests outside that list is
// vetted but its tests never run in CI. ci/fuzz_test.go (a regression
// test) was such a package: ./ci was not listed. Every package
// of the module with a _test.go file must be under a UNIT_PKGS pattern or
// under suites/ (run by ginkgo in `make suites` / `make chaos`).
func TestMakeUnitRunsEveryPackageWithTests(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	patterns := unitPackages(t, filepath.Join(root, "Makefile"))
	if len(patterns) == 0 {
		t.Fatal("expected a UNIT_PKGS line in the Makefile, found none")
	}
	cmd := exec.Command("go", "list", "-f", "{{.Dir}} {{len .TestGoFiles}} {{len .XTestGoFiles}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	withTests := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[1] == "0" && f[2] == "0" {
			continue
		}
		withTests++
		rel, err := filepath.Rel(root, f[0])
		if err != nil {
			t.Fatal(err)
		}
		rel = filepath.ToSlash(rel)
		if covered(rel, patterns) || rel == "suites" || strings.HasPrefix(rel, "suites/") {
			continue
		}
		t.Errorf("package ./%s has tests that `make unit` never runs: add it to UNIT_PKGS (now %s)", rel, strings.Join(patterns, " "))
	}
	if withTests == 0 {
		t.Fatal("go list found no package with tests: the check saw nothing")
	}
}

// unitPackages reads the patterns of the Makefile's UNIT_PKGS line.
func unitPackages(t *testing.T, makefile string) []string {
	t.Helper()
	f, err := os.Open(makefile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":=")
		if ok && strings.TrimSpace(name) == "UNIT_PKGS" {
			return strings.Fields(value)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return nil
}

// covered reports whether the package in dir (relative to the module
// root) matches one of the go package patterns ("./x/..." or "./x").
func covered(dir string, patterns []string) bool {
	for _, p := range patterns {
		p = strings.TrimPrefix(p, "./")
		if base, ok := strings.CutSuffix(p, "/..."); ok {
			if dir == base || strings.HasPrefix(dir, base+"/") {
				return true
			}
		} else if p == "..." || dir == p {
			return true
		}
	}
	return false
}
