package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/process"
)

// Handle controls one started container. It implements cluster.Handle,
// and ExitStatus as the process backend's handle does.
type Handle struct {
	b       *Backend
	node    string
	id      string
	name    string
	pid     int
	started time.Time
	logf    *os.File
	exited  chan struct{}

	mu     sync.Mutex
	status process.ExitStatus
	paused bool
}

var _ cluster.Handle = (*Handle)(nil)

// callTimeout bounds one call to the daemon; waitTimeout bounds how long a
// kill may take to be seen as an exit.
const (
	callTimeout = 30 * time.Second
	waitTimeout = time.Minute
)

// start starts the created container id with its exit wait registered
// first (a node that dies at once is still seen), then streams its output
// into logPath until it exits.
func (b *Backend) start(node, id, name, logPath string, cfg *container.Config) (*Handle, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", node, err)
	}
	wctx, wcancel := context.WithCancel(b.ctx)
	waitc, werrc := b.cli.ContainerWait(wctx, id, container.WaitConditionNextExit)
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	fmt.Fprintf(logf, "=== %s start container %s (%s) %s\n", time.Now().UTC().Format(time.RFC3339Nano), name, cfg.Image, strings.Join(cfg.Cmd, " "))
	if err := b.cli.ContainerStart(ctx, id, container.StartOptions{}); err != nil {
		wcancel()
		fmt.Fprintf(logf, "=== start failed: %v\n", err)
		logf.Close()
		return nil, fmt.Errorf("container backend: start %s: %w", name, err)
	}
	h := &Handle{b: b, node: node, id: id, name: name, started: time.Now(), logf: logf, exited: make(chan struct{})}
	if in, err := b.cli.ContainerInspect(ctx, id); err == nil && in.State != nil {
		h.pid = in.State.Pid
		if t, err := time.Parse(time.RFC3339Nano, in.State.StartedAt); err == nil {
			h.started = t
		}
	}
	logsDone := make(chan struct{})
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		defer close(logsDone)
		h.streamLogs()
	}()
	go func() {
		defer b.wg.Done()
		defer wcancel()
		h.waitExit(waitc, werrc, logsDone)
	}()
	return h, nil
}

// streamLogs copies the container's stdout and stderr into the log file
// until the container stops (the stream ends then) or the backend closes.
func (h *Handle) streamLogs() {
	rc, err := h.b.cli.ContainerLogs(h.b.ctx, h.id, container.LogsOptions{ShowStdout: true, ShowStderr: true, Follow: true})
	if err != nil {
		fmt.Fprintf(h.logf, "=== log stream: %v\n", err)
		return
	}
	defer rc.Close()
	if _, err := stdcopy.StdCopy(h.logf, h.logf, rc); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(h.logf, "=== log stream: %v\n", err)
	}
}

// waitExit records how the container ended, lets the log stream drain,
// writes the exit line and closes Exited.
func (h *Handle) waitExit(waitc <-chan container.WaitResponse, errc <-chan error, logsDone <-chan struct{}) {
	var st process.ExitStatus
	select {
	case r := <-waitc:
		st = exitStatus(r.StatusCode, false)
		if r.Error != nil && r.Error.Message != "" {
			st.Text += " (" + r.Error.Message + ")"
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		if in, err := h.b.cli.ContainerInspect(ctx, h.id); err == nil && in.State != nil && in.State.OOMKilled {
			st = exitStatus(r.StatusCode, true)
		}
		cancel()
	case err := <-errc:
		st = process.ExitStatus{Code: -1, Text: "unknown: waiting for the container failed: " + err.Error()}
	}
	select {
	case <-logsDone:
	case <-time.After(10 * time.Second):
		fmt.Fprintf(h.logf, "=== log stream still open 10s after the exit; closing\n")
	}
	h.mu.Lock()
	h.status = st
	h.paused = false
	h.mu.Unlock()
	fmt.Fprintf(h.logf, "=== %s exit: %s\n", time.Now().UTC().Format(time.RFC3339Nano), st.Text)
	h.logf.Close()
	close(h.exited)
}

// exitStatus describes a container's exit code as os/exec would describe
// the process's end: Docker reports a process ended by signal N as 128+N.
func exitStatus(code int64, oom bool) process.ExitStatus {
	if code > 128 && code < 128+65 {
		sig := syscall.Signal(code - 128)
		st := process.ExitStatus{Code: -1, Signal: sig.String(), Text: "signal: " + sig.String()}
		if oom {
			st.Text += " (out of memory: the kernel's OOM killer)"
		}
		return st
	}
	st := process.ExitStatus{Code: int(code), Text: fmt.Sprintf("exit status %d", code)}
	if oom {
		st.Text += " (out of memory)"
	}
	return st
}

// PID is the host pid of the container's process (as the daemon sees it).
func (h *Handle) PID() int { return h.pid }

// Container is the container's id.
func (h *Handle) Container() string { return h.id }

// Exited is closed once the container has exited and its output is in
// the log file.
func (h *Handle) Exited() <-chan struct{} { return h.exited }

func (h *Handle) running() bool {
	select {
	case <-h.exited:
		return false
	default:
		return true
	}
}

// ExitStatus is how the container's process ended; ok is false while it
// runs.
func (h *Handle) ExitStatus() (process.ExitStatus, bool) {
	if h.running() {
		return process.ExitStatus{}, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.status, true
}

// signal sends sig through the API; a container that has already stopped
// is not an error.
func (h *Handle) signal(sig string) error {
	if !h.running() {
		return nil
	}
	ctx, cancel := context.WithTimeout(h.b.ctx, callTimeout)
	defer cancel()
	err := h.b.cli.ContainerKill(ctx, h.id, sig)
	if err == nil || client.IsErrNotFound(err) || strings.Contains(err.Error(), "is not running") {
		return nil
	}
	return fmt.Errorf("%s: send SIG%s to container %s: %w", h.node, sig, h.name, err)
}

// Kill sends SIGKILL through the API and waits until the container has
// exited: exactly what a power cut does to the process (the page cache
// survives; only fsynced data is promised). A paused container is killed
// too: the freezer lets SIGKILL through.
func (h *Handle) Kill() error {
	if err := h.signal("KILL"); err != nil {
		return err
	}
	select {
	case <-h.exited:
		return nil
	case <-time.After(waitTimeout):
		return fmt.Errorf("%s: container %s did not exit within %s of SIGKILL", h.node, h.name, waitTimeout)
	}
}

// Terminate sends SIGTERM and waits for the exit; if ctx ends first it
// kills the container and says so. A paused container is resumed first:
// a frozen process cannot handle the signal.
func (h *Handle) Terminate(ctx context.Context) error {
	if h.isPaused() {
		if err := h.Resume(); err != nil {
			return err
		}
	}
	if err := h.signal("TERM"); err != nil {
		return err
	}
	select {
	case <-h.exited:
		return nil
	case <-ctx.Done():
		h.Kill()
		return fmt.Errorf("%s: container %s did not exit within the drain deadline after SIGTERM; killed", h.node, h.name)
	}
}

// Pause freezes every process of the container (the cgroup freezer): it
// keeps its sockets and memory but runs nothing, like a VM stall. Unlike
// SIGSTOP, nothing in the container can notice or handle it.
func (h *Handle) Pause() error {
	ctx, cancel := context.WithTimeout(h.b.ctx, callTimeout)
	defer cancel()
	if err := h.b.cli.ContainerPause(ctx, h.id); err != nil {
		return fmt.Errorf("%s: pause container %s: %w", h.node, h.name, err)
	}
	h.mu.Lock()
	h.paused = true
	h.mu.Unlock()
	return nil
}

// Resume thaws a paused container; a container already running is left
// as it is.
func (h *Handle) Resume() error {
	ctx, cancel := context.WithTimeout(h.b.ctx, callTimeout)
	defer cancel()
	if err := h.b.cli.ContainerUnpause(ctx, h.id); err != nil {
		// Resume is idempotent: the daemon refuses to unpause a container
		// its state shows running (seen right after a pause it had
		// acknowledged, on a loaded host), and running is what Resume is
		// for. Anything else is an error.
		in, ierr := h.b.cli.ContainerInspect(ctx, h.id)
		if ierr != nil || in.State == nil || !in.State.Running || in.State.Paused {
			return fmt.Errorf("%s: unpause container %s: %w", h.node, h.name, err)
		}
	}
	h.mu.Lock()
	h.paused = false
	h.mu.Unlock()
	return nil
}

func (h *Handle) isPaused() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.paused
}

// Stats samples the container's cgroup through the API (one shot: no
// second sample is waited for).
func (h *Handle) Stats() (any, error) {
	ctx, cancel := context.WithTimeout(h.b.ctx, callTimeout)
	defer cancel()
	resp, err := h.b.cli.ContainerStatsOneShot(ctx, h.id)
	if err != nil {
		return nil, fmt.Errorf("%s: stats of container %s: %w", h.node, h.name, err)
	}
	defer resp.Body.Close()
	var raw container.StatsResponse
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		return nil, fmt.Errorf("%s: stats of container %s: decode: %w", h.node, h.name, err)
	}
	return statsOf(raw, h.pid, h.started), nil
}
