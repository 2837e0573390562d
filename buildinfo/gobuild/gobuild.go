// Package gobuild builds a tidal binary the way `make build` does, for the
// suites, harness tests and benchmarks that build their own: CGO off, and
// the version and commit linked into package buildinfo with -ldflags.
//
// Without the link flags a binary built under GOFLAGS=-buildvcs=false (set
// on some build machines) carries no VCS stamp, so its `--version` and its
// start-up log line said "commit unknown": a failed
// suite's logs then did not say which commit ran.
package gobuild

import (
	"context"
	"os"
	"os/exec"
	"strings"
)

// Stamp is what gets linked into buildinfo.Version and buildinfo.Commit.
type Stamp struct {
	Version string
	Commit  string // empty: none linked (a VCS stamp, if any, still names it)
}

// StampOf reads the stamp of the checkout at dir as the Makefile does:
// Version from `git describe --tags --always --dirty` ("dev" outside a
// checkout), Commit from `git rev-parse HEAD` (empty outside a checkout).
func StampOf(dir string) Stamp {
	s := Stamp{Version: "dev"}
	if v := git(dir, "describe", "--tags", "--always", "--dirty"); v != "" {
		s.Version = v
	}
	s.Commit = git(dir, "rev-parse", "HEAD")
	return s
}

func git(dir string, args ...string) string {
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// LDFlags is the -ldflags value that links s in: the Makefile's LDFLAGS.
func (s Stamp) LDFlags() string {
	flags := "-X github.com/tidaldb/tidal/buildinfo.Version=" + s.Version
	if s.Commit != "" {
		flags += " -X github.com/tidaldb/tidal/buildinfo.Commit=" + s.Commit
	}
	return flags
}

// Command is `go build -ldflags <s.LDFlags()> [extra...] -o out pkg`, run
// in dir (the module root, or a tree of it) with CGO_ENABLED=0.
func Command(ctx context.Context, dir string, s Stamp, out, pkg string, extra ...string) *exec.Cmd {
	args := append([]string{"build", "-ldflags", s.LDFlags()}, extra...)
	args = append(args, "-o", out, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}
