// Package process runs programs as real OS processes for the harness: each
// in its own process group (so a kill reaches everything it spawned), with
// stdout and stderr going to a file (a full, undrained pipe once froze a
// node's logging threads and looked like a network fault), and with its pid
// recorded in a registry so a later run can reap what a crashed run left.
package process

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/tidaldb/tidal/harness/procstart"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gnet "github.com/shirou/gopsutil/v4/net"
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

// Listening reports whether the process itself holds a TCP socket
// listening on addr ("127.0.0.1:7071"), from /proc. A dial cannot tell:
// another process that took the port answers it too.
func (p *Process) Listening(addr string) (bool, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return false, fmt.Errorf("%s: port of %q: %w", p.spec.Name, addr, err)
	}
	conns, err := gnet.ConnectionsPid("tcp", int32(p.PID()))
	if err != nil {
		return false, fmt.Errorf("%s: sockets of pid %d: %w", p.spec.Name, p.PID(), err)
	}
	for _, c := range conns {
		if c.Status == "LISTEN" && c.Laddr.Port == uint32(port) &&
			(c.Laddr.IP == host || c.Laddr.IP == "0.0.0.0" || c.Laddr.IP == "::") {
			return true, nil
		}
	}
	return false, nil
}

// Stats is a point-in-time sample of a process's resources.
type Stats struct {
	PID        int     `json:"pid"`
	RSSBytes   uint64  `json:"rss_bytes"`
	CPUPercent float64 `json:"cpu_percent"` // since process start
	OpenFDs    int32   `json:"open_fds"`
	Threads    int32   `json:"threads"`
	// CPUSeconds is the user and system CPU time since the process
	// started; between two samples it is what the process got.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	// RunQueueWaitSeconds is the time the process's live threads spent
	// runnable but waiting for a CPU, since each started (Linux
	// schedstat). Between two samples it tells a node that was starved by
	// the machine's load from one that was idle or blocked: a stall with
	// little CPU and much waiting here is the environment's.
	RunQueueWaitSeconds float64 `json:"run_queue_wait_seconds,omitempty"`
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
	if t, err := gp.Times(); err == nil {
		s.CPUSeconds = t.User + t.System
	}
	if w, err := runQueueWait("/proc", p.PID()); err == nil {
		s.RunQueueWaitSeconds = w.Seconds()
	}
	return s, nil
}

// runQueueWait sums, over the threads of process pid under procRoot, the
// time each spent runnable but not running: the second field of
// task/<tid>/schedstat, in nanoseconds. Threads that already exited are
// not counted.
func runQueueWait(procRoot string, pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(filepath.Join(procRoot, strconv.Itoa(pid), "task", "*", "schedstat"))
	if err != nil {
		return 0, err
	}
	if len(tasks) == 0 {
		return 0, fmt.Errorf("run-queue wait of pid %d: no task/*/schedstat under %s", pid, procRoot)
	}
	var total time.Duration
	for _, path := range tasks {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // the thread exited between the glob and the read
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return 0, fmt.Errorf("run-queue wait: %s: expected \"<run ns> <wait ns> <slices>\", found %q", path, b)
		}
		ns, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("run-queue wait: %s: wait field %q: %w", path, f[1], err)
		}
		total += time.Duration(ns)
	}
	return total, nil
}

// Registry records the pids a run started, one file per pid in a
// directory (a run store's pids/), so that a run which crashed before its
// cleanup can be reaped by a later one.
//
// Runs sharing a store used to kill each other: every run start reaped
// every pid recorded there. Now a Registry holds its directory for the
// run's life — an exclusive flock on dir/lock, which also names the holder
// (pid and start time) for the error a second run gets — and every pid file
// names the run that started it. Reap kills only what this Registry
// started or what a run that is provably dead started (its process is gone,
// or its pid now belongs to a process that started at another time).
type Registry struct {
	dir   string
	me    owner
	token string // tells this Registry's entries from other runs' in the same process
	lock  *os.File
}

// owner identifies a process across pid reuse: its pid and start time
// (clock ticks after boot, as the kernel records it: procstart.Of).
type owner struct {
	PID   int
	Start int64
}

// alive reports whether o is still running: the pid exists and was
// started at o's time. A pid reused by a later process is not o.
func (o owner) alive() bool {
	if o.PID <= 0 {
		return false
	}
	start, err := startTime(o.PID)
	return err == nil && start == o.Start
}

// startTime is the kernel's record of when pid started (see procstart:
// a wall-clock derivation can move between readers).
func startTime(pid int) (int64, error) { return procstart.Of(pid) }

// HeldError is NewRegistry's answer when another live run holds the
// directory.
type HeldError struct {
	Dir     string
	PID     int
	Started time.Time // zero when the holder could not be read
	Command string
}

func (e *HeldError) Error() string {
	who := "another run"
	if e.PID > 0 {
		who = fmt.Sprintf("run pid %d", e.PID)
		if !e.Started.IsZero() {
			who += fmt.Sprintf(" (started %s", e.Started.UTC().Format(time.RFC3339))
			if e.Command != "" {
				who += ": " + e.Command
			}
			who += ")"
		}
	}
	return fmt.Sprintf("process registry %s: held by %s, which is still running; runs sharing a store would kill each other's nodes — give this run another store, or wait for that one to end", e.Dir, who)
}

const lockName = "lock"

// NewRegistry takes dir (created if needed) for this run. It fails with a
// *HeldError naming the holder when another live run holds it; a lock
// left by a run that died is taken over (the kernel released its flock).
// Close releases it.
func NewRegistry(dir string) (*Registry, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	me := owner{PID: os.Getpid()}
	start, err := startTime(me.PID)
	if err != nil {
		return nil, fmt.Errorf("process registry %s: own start time: %w", dir, err)
	}
	me.Start = start
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("process registry %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, holder
		}
		return nil, fmt.Errorf("process registry %s: lock %s: %w", dir, path, err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	r := &Registry{dir: dir, me: me, token: hex.EncodeToString(b[:]), lock: f}
	cmd := strings.Join(os.Args, " ")
	if len(cmd) > 300 {
		cmd = cmd[:300] + "..."
	}
	// start_ticks identifies the holder; started (when it took the
	// directory, by the wall clock) is for the person reading the refusal.
	content := fmt.Sprintf("pid %d\nstart_ticks %d\nstarted %s\ncommand %s\n", me.PID, me.Start,
		time.Now().UTC().Format(time.RFC3339), cmd)
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(content), 0)
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("process registry %s: write %s: %w", dir, path, err)
	}
	return r, nil
}

// readHolder reads who holds the lock file f for the refusal's message.
func readHolder(f *os.File) *HeldError {
	e := &HeldError{Dir: filepath.Dir(f.Name())}
	data, _ := io.ReadAll(io.NewSectionReader(f, 0, 4096))
	for _, line := range strings.Split(string(data), "\n") {
		key, val, _ := strings.Cut(line, " ")
		switch key {
		case "pid":
			e.PID, _ = strconv.Atoi(val)
		case "started":
			if t, err := time.Parse(time.RFC3339, val); err == nil {
				e.Started = t
			}
		case "command":
			e.Command = val
		}
	}
	return e
}

// Close releases the directory. Entries stay: what this run started and
// did not stop is reaped by the next run, this one being dead by then or
// done with the store.
func (r *Registry) Close() error {
	if r.lock == nil {
		return nil
	}
	_ = r.lock.Truncate(0)
	err := r.lock.Close() // closing the descriptor releases the flock
	r.lock = nil
	return err
}

func (r *Registry) path(pid int) string { return filepath.Join(r.dir, strconv.Itoa(pid)+".pid") }

// An entry is four lines: the process's start time, binary, name, and its
// run ("pid start_ticks token").
func (r *Registry) add(pid int, spec Spec) {
	start := ""
	if t, err := startTime(pid); err == nil {
		start = strconv.FormatInt(t, 10)
	}
	run := fmt.Sprintf("%d %d %s", r.me.PID, r.me.Start, r.token)
	os.WriteFile(r.path(pid), []byte(start+"\n"+spec.Binary+"\n"+spec.Name+"\n"+run+"\n"), 0o644)
}

func (r *Registry) remove(pid int) { os.Remove(r.path(pid)) }

// entry is one pid file read back.
type entry struct {
	pid   int
	start string // the process's start time as recorded; "" if unknown
	name  string
	run   owner
	token string
	known bool // the file names its run (older files do not)
}

func parseEntry(pid int, data string) entry {
	lines := strings.Split(data, "\n")
	e := entry{pid: pid, name: strconv.Itoa(pid)}
	if len(lines) >= 1 {
		e.start = lines[0]
	}
	if len(lines) >= 3 && lines[2] != "" {
		e.name = lines[2] + " (pid " + strconv.Itoa(pid) + ")"
	}
	if len(lines) >= 4 {
		f := strings.Fields(lines[3])
		if len(f) == 3 {
			p, err1 := strconv.Atoi(f[0])
			st, err2 := strconv.ParseInt(f[1], 10, 64)
			if err1 == nil && err2 == nil {
				e.run, e.token, e.known = owner{PID: p, Start: st}, f[2], true
			}
		}
	}
	return e
}

// Reap kills the registered processes that this Registry started or that
// a run which is provably dead started, if each is still the same process
// (same start time — pids are reused), and returns what it killed. The
// processes of a live run are left alone, and so are entries that do not
// name their run (written before runs were recorded): neither is provably
// abandoned.
func (r *Registry) Reap() ([]string, error) {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, err
	}
	var killed []string
	for _, de := range entries {
		pidStr, ok := strings.CutSuffix(de.Name(), ".pid")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(r.dir, de.Name()))
		if err != nil {
			continue
		}
		e := parseEntry(pid, string(data))
		ours := e.known && e.run == r.me && e.token == r.token
		if !ours && (!e.known || e.run.alive()) {
			continue // another live run's, or of unknown origin
		}
		os.Remove(filepath.Join(r.dir, de.Name()))
		start, err := startTime(pid)
		if err != nil || strconv.FormatInt(start, 10) != e.start {
			continue // gone, or the pid now belongs to something else
		}
		syscall.Kill(-pid, syscall.SIGKILL)
		syscall.Kill(pid, syscall.SIGKILL)
		killed = append(killed, e.name)
	}
	return killed, nil
}
