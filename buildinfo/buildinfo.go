// Package buildinfo names the build a binary came from, for `--version`
// and for the start-up log line: the release version, the commit and the
// Go toolchain. Every tidal binary prints the same three facts so that a
// bug report (or a runbook's upgrade check) can say exactly what ran.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release this binary was built as. The Makefile sets it
// with -ldflags "-X github.com/tidaldb/tidal/buildinfo.Version=..." from
// `git describe`; a plain `go build` leaves "dev".
var Version = "dev"

// Info is what a binary knows about its own build.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
}

// Read returns this binary's build facts. The commit comes from the VCS
// stamp Go embeds when building inside a git checkout; "unknown" when the
// binary was built without one (go run, -buildvcs=false).
func Read() Info {
	info := Info{Version: Version, Commit: "unknown", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Commit = s.Value
			if len(info.Commit) > 12 {
				info.Commit = info.Commit[:12]
			}
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is the one line `--version` prints, e.g.
// "tidal-server v0.2.0 (commit 1a2b3c4d5e6f, go1.26.8)".
func (i Info) String() string {
	commit := i.Commit
	if i.Modified {
		commit += "+modified"
	}
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, commit, i.GoVersion)
}

// Line is what `<binary> --version` prints: the binary's name and String.
func Line(binary string) string { return binary + " " + Read().String() }
