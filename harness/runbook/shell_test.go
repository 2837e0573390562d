package runbook

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newTestShell(t *testing.T) *Shell {
	t.Helper()
	dir := t.TempDir()
	env := filepath.Join(dir, "env.sh")
	if err := os.WriteFile(env, []byte("export TIDAL_GREETING=hello\ntidal_greet() { echo \"$TIDAL_GREETING $1\"; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &Shell{EnvFile: env, StateDir: filepath.Join(dir, "state"), Timeout: 20 * time.Second}
}

func block(code string) Block {
	return Block{Section: "Steps", Heading: "1. Do it", Line: 10, Code: code}
}

// Blocks read like one shell session: the env file's functions, and the
// lowercase variables and working directory an earlier block left.
func TestShellCarriesTheSessionBetweenBlocks(t *testing.T) {
	sh := newTestShell(t)
	ctx := context.Background()
	dir := t.TempDir()
	r := sh.Run(ctx, block("tidal_greet world\nnode=3 list=\"a b\"\nUPPER=not-kept\ncd "+dir+"\n"))
	if r.Err != nil || r.Output != "hello world\n" {
		t.Fatalf("first block: err %v, output %q", r.Err, r.Output)
	}
	r = sh.Run(ctx, block("echo \"$node|$list|${UPPER:-unset}|$PWD\"\n"))
	if want := "3|a b|unset|" + dir + "\n"; r.Err != nil || r.Output != want {
		t.Fatalf("second block: err %v, output %q, expected %q", r.Err, r.Output, want)
	}
}

// A function a block defines is there in the next (rolling-upgrade.md
// defines upgrade_node once and uses it in two steps); env.sh's own are
// sourced afresh, never saved over.
func TestShellCarriesFunctionsBetweenBlocks(t *testing.T) {
	sh := newTestShell(t)
	ctx := context.Background()
	r := sh.Run(ctx, block("twice() { echo \"$1$1\"; }\ntidal_greet() { echo overridden; }\n"))
	if r.Err != nil {
		t.Fatalf("first block: %v", r.Err)
	}
	r = sh.Run(ctx, block("twice ab\n"))
	if r.Err != nil || r.Output != "abab\n" {
		t.Fatalf("second block: err %v, output %q", r.Err, r.Output)
	}
	r = sh.Run(ctx, block("tidal_greet you\n"))
	if r.Err != nil || r.Output != "hello you\n" {
		t.Fatalf("env.sh's function should be sourced afresh: err %v, output %q", r.Err, r.Output)
	}
}

// A block fails on its first failing command (-e), on an unset variable
// (-u) and on a failure inside a pipeline (pipefail), naming the block.
func TestShellFailsABlockLikeBashEuoPipefail(t *testing.T) {
	sh := newTestShell(t)
	for _, code := range []string{"echo before\nfalse\necho after\n", "echo $no_such_variable\n", "false | cat\necho after\n"} {
		r := sh.Run(context.Background(), block(code))
		if r.Err == nil || r.ExitCode == 0 {
			t.Errorf("%q: expected the block to fail, found exit %d, err %v", code, r.ExitCode, r.Err)
			continue
		}
		if strings.Contains(r.Output, "after") {
			t.Errorf("%q: the block went on after the failure: %q", code, r.Output)
		}
		if !strings.Contains(r.Err.Error(), "Steps › 1. Do it (line 10)") {
			t.Errorf("%q: the error does not name the block: %v", code, r.Err)
		}
		if f := r.Failure("p.md"); !strings.Contains(f, "runbook p.md") || !strings.Contains(f, code) {
			t.Errorf("%q: Failure does not show the page and the block:\n%s", code, f)
		}
	}
}

func TestShellKillsABlockAtItsTimeout(t *testing.T) {
	sh := newTestShell(t)
	sh.Timeout = 300 * time.Millisecond
	start := time.Now()
	r := sh.Run(context.Background(), block("echo started\nsleep 60\n"))
	if !r.TimedOut || r.Err == nil || !strings.Contains(r.Err.Error(), "still running after 300ms") {
		t.Fatalf("timed out %v, err %v: expected a timeout", r.TimedOut, r.Err)
	}
	if r.Output != "started\n" {
		t.Errorf("output %q: expected what the block printed before it was killed", r.Output)
	}
	if time.Since(start) > 30*time.Second {
		t.Errorf("the block's sleep was not killed (took %s)", time.Since(start))
	}
}

// A process started in the background with its output left attached holds
// the block's output open: that fails the block instead of hanging it.
func TestShellFailsABlockThatLeavesItsOutputOpen(t *testing.T) {
	sh := newTestShell(t)
	sh.OutputGrace = 200 * time.Millisecond
	r := sh.Run(context.Background(), block("sleep 30 &\necho done\n"))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "background process holding its output open") {
		t.Fatalf("err %v: expected the block to fail for leaving its output open", r.Err)
	}
	// Redirected, the same block is fine.
	pidFile := filepath.Join(t.TempDir(), "pid")
	r = sh.Run(context.Background(), block("sleep 30 >/dev/null 2>&1 &\necho $! >"+pidFile+"\n"))
	if r.Err != nil {
		t.Fatalf("err %v: a background process with redirected output must not fail the block", r.Err)
	}
	// What the block left running in its process group is gone.
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive(strings.TrimSpace(string(b))) {
		if time.Now().After(deadline) {
			t.Fatalf("the block's background sleep (pid %s) still runs after the block ended", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie has no command line).
func alive(pid string) bool {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	return err == nil && len(b) > 0
}

// Regression: a bash that a block starts (the wrapper tidal_start puts
// around a node, in its own session) inherited BASH_ENV: it loaded the
// session's state and, when it exited — long after the block, when its node
// stopped — saved its own over it, or raced the next block's save ("mv:
// cannot stat vars.sh.tmp").
func TestShellChildBashDoesNotTouchTheSession(t *testing.T) {
	sh := newTestShell(t)
	ctx := context.Background()
	pidFile := filepath.Join(t.TempDir(), "child-pid")
	r := sh.Run(ctx, block("x=from-block\nsetsid bash -c 'echo $$ >"+pidFile+"; child=was-here; sleep 0.3' >/dev/null 2>&1 &\n"))
	if r.Err != nil {
		t.Fatalf("%v\n%s", r.Err, r.Output)
	}
	// Wait until the child bash has written its pid and exited (its exit
	// is when it would save).
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(pidFile)
		if err == nil && len(b) > 0 && !alive(strings.TrimSpace(string(b))) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the child bash never finished")
		}
		time.Sleep(20 * time.Millisecond)
	}
	r = sh.Run(ctx, block("echo \"[$x] [${child:-}]\"\n"))
	if r.Err != nil || r.Output != "[from-block] []\n" {
		t.Fatalf("next block: err %v, output %q; expected the block's variable and nothing of the child's", r.Err, r.Output)
	}
}
