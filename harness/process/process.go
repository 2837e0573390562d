// Package process runs programs as real OS processes for the harness: each
// in its own process group (so a kill reaches everything it spawned), with
// stdout and stderr going to a file (a full, undrained pipe once froze a
// node's logging threads and looked like a network fault), and with its pid
// recorded in a registry so a later run can reap what a crashed run left.
package process

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gproc "github.com/shirou/gopsutil/v4/process"
)

// Spec describes one process.
type Spec struct {
	Name    string   // for messages: "n1"
	Binary  string   // absolute path
	Args    []string // arguments after the binary
	Dir     string   // working directory
	LogPath string   // stdout and stderr are appended here
	Env     []string // added to the parent's environment
}

// Process is one started program.
type Process struct {
	spec     Spec
	cmd      *exec.Cmd
	log      *os.File
	registry *Registry
	exited   chan struct{}

	mu      sync.Mutex
	exitErr error
	paused  bool
}

// Start launches spec. The process is registered in reg (if non-nil) until
// it exits.
func Start(spec Spec, reg *Registry) (*Process, error) {
	if err := os.MkdirAll(filepath.Dir(spec.LogPath), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(spec.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log file: %w", spec.Name, err)
	}
	cmd := exec.Command(spec.Binary, spec.Args...)
	cmd.Dir = spec.Dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Env = append(os.Environ(), spec.Env...)
	// Own process group: signals reach the whole tree, and a Ctrl-C meant
	// for the test runner does not reach the nodes before cleanup does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(logf, "=== %s start %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), spec.Binary, strings.Join(spec.Args, " "))
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("%s: start %s: %w", spec.Name, spec.Binary, err)
	}
	p := &Process{spec: spec, cmd: cmd, log: logf, registry: reg, exited: make(chan struct{})}
	if reg != nil {
		reg.add(cmd.Process.Pid, spec)
	}
	go p.wait()
	return p, nil
}

func (p *Process) wait() {
	err := p.cmd.Wait()
	p.mu.Lock()
	p.exitErr = err
	p.mu.Unlock()
	if p.registry != nil {
		p.registry.remove(p.cmd.Process.Pid)
	}
	fmt.Fprintf(p.log, "=== %s exit: %v\n", time.Now().UTC().Format(time.RFC3339Nano), exitDescription(err))
	p.log.Close()
	close(p.exited)
}

func exitDescription(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// PID is the process id (also its process group id).
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Name is the spec's name.
func (p *Process) Name() string { return p.spec.Name }

// Exited is closed once the process has exited and been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr is the exit status once Exited is closed (nil = status 0).
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// Running reports whether the process has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// signalGroup signals the whole process group.
func (p *Process) signalGroup(sig syscall.Signal) error {
	if !p.Running() {
		return nil
	}
	if err := syscall.Kill(-p.PID(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("%s: signal %v to group %d: %w", p.spec.Name, sig, p.PID(), err)
	}
	return nil
}

// Kill sends SIGKILL and waits until the process is gone: no cleanup, no
// flush, exactly what a power cut does to the process (the page cache
// survives; only fsynced data is promised).
func (p *Process) Kill() error {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	if err := p.signalGroup(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.exited
	return nil
}

// Terminate sends SIGTERM and waits for a clean exit; if ctx ends first it
// kills the process and says so.
func (p *Process) Terminate(ctx context.Context) error {
	if p.isPaused() {
		// A stopped process cannot handle SIGTERM until continued.
		p.Resume()
	}
	if err := p.signalGroup(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.exited:
		return nil
	case <-ctx.Done():
		p.Kill()
		return fmt.Errorf("%s: did not exit within the drain deadline after SIGTERM; killed", p.spec.Name)
	}
}

// Pause stops the process (SIGSTOP): it keeps its sockets and memory but
// runs nothing, like a long GC pause or a VM stall.
func (p *Process) Pause() error {
	if err := p.signalGroup(syscall.SIGSTOP); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	return nil
}

// Resume continues a paused process (SIGCONT).
func (p *Process) Resume() error {
	if err := p.signalGroup(syscall.SIGCONT); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	return nil
}

func (p *Process) isPaused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// Stats is a point-in-time sample of a process's resources.
type Stats struct {
	PID        int     `json:"pid"`
	RSSBytes   uint64  `json:"rss_bytes"`
	CPUPercent float64 `json:"cpu_percent"` // since process start
	OpenFDs    int32   `json:"open_fds"`
	Threads    int32   `json:"threads"`
}

// Stats samples the process via gopsutil.
func (p *Process) Stats() (Stats, error) {
	gp, err := gproc.NewProcess(int32(p.PID()))
	if err != nil {
		return Stats{}, err
	}
	s := Stats{PID: p.PID()}
	if mi, err := gp.MemoryInfo(); err == nil {
		s.RSSBytes = mi.RSS
	}
	if c, err := gp.CPUPercent(); err == nil {
		s.CPUPercent = c
	}
	if n, err := gp.NumFDs(); err == nil {
		s.OpenFDs = n
	}
	if n, err := gp.NumThreads(); err == nil {
		s.Threads = n
	}
	return s, nil
}

// Registry records the pids a harness started in a directory (one file
// per pid), so that a run which crashed before its cleanup can be reaped by
// the next one.
type Registry struct {
	dir string
}

// NewRegistry uses dir (created if needed).
func NewRegistry(dir string) (*Registry, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &Registry{dir: dir}, nil
}

func (r *Registry) path(pid int) string { return filepath.Join(r.dir, strconv.Itoa(pid)+".pid") }

func (r *Registry) add(pid int, spec Spec) {
	start := ""
	if gp, err := gproc.NewProcess(int32(pid)); err == nil {
		if t, err := gp.CreateTime(); err == nil {
			start = strconv.FormatInt(t, 10)
		}
	}
	os.WriteFile(r.path(pid), []byte(start+"\n"+spec.Binary+"\n"+spec.Name+"\n"), 0o644)
}

func (r *Registry) remove(pid int) { os.Remove(r.path(pid)) }

// Reap kills every process a previous run registered that is still alive
// and is still the same process (same start time and binary — pids are
// reused), and returns what it killed.
func (r *Registry) Reap() ([]string, error) {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, err
	}
	var killed []string
	for _, e := range entries {
		pidStr, ok := strings.CutSuffix(e.Name(), ".pid")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil {
			continue
		}
		data, _ := os.ReadFile(filepath.Join(r.dir, e.Name()))
		lines := strings.Split(string(data), "\n")
		os.Remove(filepath.Join(r.dir, e.Name()))
		gp, err := gproc.NewProcess(int32(pid))
		if err != nil {
			continue // gone
		}
		if len(lines) >= 2 {
			if t, err := gp.CreateTime(); err != nil || strconv.FormatInt(t, 10) != lines[0] {
				continue // pid reused by something else
			}
		}
		syscall.Kill(-pid, syscall.SIGKILL)
		syscall.Kill(pid, syscall.SIGKILL)
		name := pidStr
		if len(lines) >= 3 {
			name = lines[2] + " (pid " + pidStr + ")"
		}
		killed = append(killed, name)
	}
	return killed, nil
}
