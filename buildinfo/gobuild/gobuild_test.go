package gobuild

import (
	"os/exec"
	"strings"
	"testing"
)

// In a checkout the stamp names HEAD, as the Makefile's COMMIT does.
func TestStampOfACheckoutNamesHead(t *testing.T) {
	head, err := exec.Command("git", "-C", "../..", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout (or no git): %v", err)
	}
	s := StampOf("../..")
	if want := strings.TrimSpace(string(head)); s.Commit != want {
		t.Errorf("StampOf(repo).Commit = %q, expected %q", s.Commit, want)
	}
	if s.Version == "" || s.Version == "dev" {
		t.Errorf("StampOf(repo).Version = %q, expected git describe's answer", s.Version)
	}
	if f := s.LDFlags(); !strings.Contains(f, "buildinfo.Commit="+s.Commit) || !strings.Contains(f, "buildinfo.Version="+s.Version) {
		t.Errorf("LDFlags() = %q, links in neither version %q nor commit %q", f, s.Version, s.Commit)
	}
}

// Outside a checkout: version "dev" and no commit flag, as `make build`
// outside a checkout (an empty -X Commit= would be harmless but noisy).
func TestStampOutsideACheckoutIsDev(t *testing.T) {
	s := StampOf(t.TempDir())
	if s != (Stamp{Version: "dev"}) {
		t.Errorf("StampOf(empty dir) = %+v, expected {dev, \"\"}", s)
	}
	if f := s.LDFlags(); strings.Contains(f, "Commit") {
		t.Errorf("LDFlags() without a commit = %q, expected no Commit flag", f)
	}
}
