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

// Commit is the commit the Makefile built from (-X ...buildinfo.Commit=,
// from `git rev-parse`). It names the commit when the binary carries no VCS
// stamp: Go embeds none under GOFLAGS=-buildvcs=false, which some build
// machines set, and `--version` then said "commit unknown". A VCS stamp,
// when present, wins: it also knows about local changes.
var Commit = ""

// Info is what a binary knows about its own build.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"go_version"`
}

// Read returns this binary's build facts. The commit comes from the VCS
// stamp Go embeds when building inside a git checkout, else from Commit;
// "unknown" when the binary has neither (go run, a plain go build with
// -buildvcs=false).
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return read(bi, Commit)
}

func read(bi *debug.BuildInfo, linked string) Info {
	info := Info{Version: Version, Commit: "unknown", GoVersion: runtime.Version()}
	if linked != "" {
		info.Commit = shortCommit(linked)
	}
	if bi == nil {
		return info
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Commit = shortCommit(s.Value)
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

func shortCommit(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}

func (i Info) String() string {
	commit := i.Commit
	if i.Modified {
		commit += "+modified"
	}
	return fmt.Sprintf("%s (commit %s, %s)", i.Version, commit, i.GoVersion)
}

// Line is what `<binary> --version` prints: the binary's name and String.
func Line(binary string) string { return binary + " " + Read().String() }
