package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestLineNamesBinaryVersionCommitAndGo(t *testing.T) {
	old := Version
	Version = "v9.9.9"
	defer func() { Version = old }()
	line := Line("tidal-server")
	for _, want := range []string{"tidal-server v9.9.9", "(commit ", ", go"} {
		if !strings.Contains(line, want) {
			t.Fatalf("Line() = %q, want it to contain %q", line, want)
		}
	}
}

func TestModifiedCommitIsMarked(t *testing.T) {
	got := Info{Version: "v1", Commit: "abc", Modified: true, GoVersion: "go1.26"}.String()
	if got != "v1 (commit abc+modified, go1.26)" {
		t.Fatalf("String() = %q", got)
	}
}

// Regression: built with -buildvcs=false (GOFLAGS on some
// build machines) a binary has no VCS stamp, and --version said "commit
// unknown" although the Makefile knew the commit. The commit the Makefile
// links in is used then; a VCS stamp, when there is one, still wins.
func TestCommitWithoutAVCSStamp(t *testing.T) {
	noStamp := &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "-buildvcs", Value: "false"}}}
	if got := read(noStamp, "0123456789abcdef0123").Commit; got != "0123456789ab" {
		t.Errorf("no VCS stamp, linked commit 0123456789abcdef0123: commit %q, want 0123456789ab", got)
	}
	if got := read(nil, "abc").Commit; got != "abc" {
		t.Errorf("no build info, linked commit abc: commit %q, want abc", got)
	}
	if got := read(noStamp, "").Commit; got != "unknown" {
		t.Errorf("neither: commit %q, want unknown", got)
	}
	stamped := &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "fedcba9876543210"}, {Key: "vcs.modified", Value: "true"}}}
	if got := read(stamped, "0123456789ab"); got.Commit != "fedcba987654" || !got.Modified {
		t.Errorf("VCS stamp fedcba9876543210 (modified) and linked 0123456789ab: %+v, want the stamp's commit, modified", got)
	}
}
