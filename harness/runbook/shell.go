package runbook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Shell runs page blocks the way a person types them into one shell: each
// block in a fresh `bash -euo pipefail` (so a failing command fails the
// block) that has sourced the cluster's env.sh, with the lowercase
// variables, the lowercase functions (other than env.sh's tidal_*) and
// the working directory earlier blocks left behind.
type Shell struct {
	// EnvFile is the cluster's env.sh (runbooks/local-cluster.sh).
	EnvFile string
	// StateDir holds what blocks hand on to the next (variables, cwd)
	// and the prelude each block sources.
	StateDir string
	// Env is added to the process environment of every block.
	Env []string
	// Timeout bounds each block; 0 means DefaultBlockTimeout.
	Timeout time.Duration
	// OutputGrace is how long a block that has exited may leave its
	// output open (a background process it started without redirecting
	// it) before it counts as failed; 0 means 5s.
	OutputGrace time.Duration
}

// DefaultBlockTimeout bounds a block that sets no timeout of its own: long
// enough for a node to catch up on a loaded 2-core machine.
const DefaultBlockTimeout = 4 * time.Minute

// maxOutput bounds the output kept per block (the tail is kept).
const maxOutput = 256 << 10

// StepResult is the outcome of one block.
type StepResult struct {
	Block    Block
	Start    time.Time
	Duration time.Duration
	// Output is stdout and stderr interleaved, as a terminal shows them.
	Output   string
	ExitCode int
	TimedOut bool
	// Err is nil when the block exited 0.
	Err error
}

// prelude is sourced by every block before its code (through BASH_ENV,
// which keeps the block's own line numbers in bash's error messages). It
// saves the lowercase variables and functions and the working directory
// on exit, for the next block.
const prelude = `# sourced before every runbook block (see harness/runbook/shell.go)
# Only the block's own shell: a bash the block runs must not load the
# state, nor save its own over it when it exits.
unset BASH_ENV
. "$TIDAL_ENV"
[ -f "$TIDAL_STATE/vars.sh" ] && . "$TIDAL_STATE/vars.sh"
__tidal_save() {
	local __v
	{
		for __v in $(compgen -v); do
			case $__v in [a-z]*) declare -p "$__v" ;; esac
		done
		for __v in $(compgen -A function); do
			case $__v in tidal_* | _* ) ;; [a-z]*) declare -f "$__v" ;; esac
		done
		printf 'cd %q\n' "$PWD"
	} >"$TIDAL_STATE/vars.sh.tmp" && mv "$TIDAL_STATE/vars.sh.tmp" "$TIDAL_STATE/vars.sh"
}
trap __tidal_save EXIT
`

// Run executes one block and reports how it went; it never panics on a
// failing block. A block still running at its timeout (or when ctx ends)
// is killed with everything it started in its process group, and so is
// whatever it left running in that group when it ends. Nodes the block
// starts run in their own session (tidal_start uses setsid), so they
// outlive the block as they would outlive a person's shell.
func (s *Shell) Run(ctx context.Context, b Block) StepResult {
	res := StepResult{Block: b, Start: time.Now(), ExitCode: -1}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultBlockTimeout
	}
	if err := os.MkdirAll(s.StateDir, 0o755); err != nil {
		res.Err = err
		return res
	}
	preludePath := filepath.Join(s.StateDir, "prelude.sh")
	if err := os.WriteFile(preludePath, []byte(prelude), 0o644); err != nil {
		res.Err = err
		return res
	}
	bctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(bctx, "bash", "-euo", "pipefail", "-c", b.Code, "runbook-block")
	cmd.Env = append(os.Environ(), s.Env...)
	cmd.Env = append(cmd.Env, "BASH_ENV="+preludePath, "TIDAL_ENV="+s.EnvFile, "TIDAL_STATE="+s.StateDir)
	cmd.Stdin = nil
	var out tailBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A background process that kept the output pipe open must not hold
	// the block forever.
	cmd.WaitDelay = s.OutputGrace
	if cmd.WaitDelay <= 0 {
		cmd.WaitDelay = 5 * time.Second
	}
	err := cmd.Run()
	if cmd.Process != nil {
		// Whatever the block left running in its process group goes with
		// it; nodes run in their own session and are not touched.
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	res.Duration = time.Since(res.Start)
	res.Output = out.String()
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	switch {
	case bctx.Err() == context.DeadlineExceeded && ctx.Err() == nil:
		res.TimedOut = true
		res.Err = fmt.Errorf("%s: still running after %s; killed", b.Label(), timeout)
	case ctx.Err() != nil:
		res.Err = fmt.Errorf("%s: cancelled: %w", b.Label(), ctx.Err())
	case errors.Is(err, exec.ErrWaitDelay):
		res.Err = fmt.Errorf("%s: exited, but left a background process holding its output open for %s (redirect the output of what it starts in the background)", b.Label(), cmd.WaitDelay)
	case err != nil:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			res.Err = fmt.Errorf("%s: exit status %d", b.Label(), res.ExitCode)
		} else {
			res.Err = fmt.Errorf("%s: %w", b.Label(), err)
		}
	}
	return res
}

// Failure describes a failed block for a person: the runbook, the block
// and its code, and what it printed.
func (r StepResult) Failure(page string) string {
	if r.Err == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "runbook %s: block %s failed: %v\n", page, r.Block.Label(), r.Err)
	fmt.Fprintf(&b, "--- block (bash's \"line N\" is page line %d+N-1) ---\n", r.Block.Line)
	b.WriteString(r.Block.Code)
	b.WriteString("--- output ---\n")
	b.WriteString(r.Output)
	if !strings.HasSuffix(r.Output, "\n") {
		b.WriteString("\n")
	}
	return b.String()
}

// tailBuffer keeps the last maxOutput bytes written to it.
type tailBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	dropped int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - maxOutput; over > 0 {
		t.buf.Next(over)
		t.dropped += over
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dropped > 0 {
		return fmt.Sprintf("[... %d bytes dropped ...]\n%s", t.dropped, t.buf.String())
	}
	return t.buf.String()
}
