package buildinfo

import (
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
