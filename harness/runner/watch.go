package runner

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/process"
)

// logTailLines is how many lines of each log a crash report quotes.
const logTailLines = 30

// exitWatch stands between the cluster and its backend and sees every
// process the cluster starts end. The cluster only knows what the harness
// last did to a node; a node that panics after a restart still reads as
// "running" there. exitWatch records each exit with whether the harness
// had asked for it (a Kill or Terminate through the handle, which is how
// the nemesis and the cluster stop nodes), the exit status, and the end
// of the node's logs — the evidence the nodes checker judges.
type exitWatch struct {
	cluster.Backend

	mu      sync.Mutex
	exits   []watchedExit
	current map[string]*watchedHandle // the latest handle per node name
	armed   bool                      // the cluster is up: every exit counts
	// launchedBeforeArm holds every handle started while the cluster was
	// coming up, so arm can set aside the ones of abandoned attempts.
	launchedBeforeArm []*watchedHandle
}

type watchedExit struct {
	handle    *watchedHandle
	node      string
	pid       int
	at        time.Time
	requested bool
	graceful  bool
	status    checker.ExitStatus
	logs      []checker.LogTail
}

func newExitWatch(b cluster.Backend) *exitWatch {
	return &exitWatch{Backend: b, current: map[string]*watchedHandle{}}
}

// Launch implements cluster.Backend.
func (w *exitWatch) Launch(spec cluster.NodeSpec) (cluster.Handle, error) {
	h, err := w.Backend.Launch(spec)
	if err != nil {
		return nil, err
	}
	wh := &watchedHandle{Handle: h, spec: spec}
	w.mu.Lock()
	wh.beforeArm = !w.armed
	if wh.beforeArm {
		w.launchedBeforeArm = append(w.launchedBeforeArm, wh)
	}
	w.current[spec.Name] = wh
	w.mu.Unlock()
	go func() {
		<-h.Exited()
		e := watchedExit{handle: wh, node: spec.Name, pid: h.PID(), at: time.Now(), requested: wh.requested.Load(),
			graceful: wh.graceful.Load(), status: exitStatusOf(h), logs: logTails(spec)}
		w.mu.Lock()
		w.exits = append(w.exits, e)
		w.mu.Unlock()
	}()
	return wh, nil
}

// arm is called once the cluster is up. cluster.New may have started the
// nodes more than once (a port taken between picking and binding makes it
// start the whole cluster again on fresh ports); the processes of those
// abandoned attempts ended before the run began, one of them on its own,
// and are not crashes of this run. Every exit of a process started
// before arm whose node has since been started again is set aside; from
// here on every exit counts.
func (w *exitWatch) arm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = true
	latest := map[*watchedHandle]bool{}
	for _, h := range w.current {
		latest[h] = true
	}
	// Exits not recorded yet (their goroutine has not run) are covered
	// too: the mark is on the handle.
	for _, h := range w.launchedBeforeArm {
		if !latest[h] {
			h.abandoned.Store(true)
		}
	}
	w.launchedBeforeArm = nil
}

// alive reports whether node's latest process has not exited.
func (w *exitWatch) alive(node string) bool {
	w.mu.Lock()
	h := w.current[node]
	w.mu.Unlock()
	if h == nil {
		return false
	}
	select {
	case <-h.Exited():
		return false
	default:
		return true
	}
}

// tails returns the end of node's logs (its latest process's).
func (w *exitWatch) tails(node string) []checker.LogTail {
	w.mu.Lock()
	h := w.current[node]
	w.mu.Unlock()
	if h == nil {
		return nil
	}
	return logTails(h.spec)
}

// recorded returns the exits seen so far, on the history's clock (start
// is the history's start; exits before it get negative times), with log
// paths relative to dir.
func (w *exitWatch) recorded(start time.Time, dir string) []checker.ProcessExit {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]checker.ProcessExit, 0, len(w.exits))
	for _, e := range w.exits {
		if e.handle != nil && e.handle.abandoned.Load() {
			continue
		}
		out = append(out, checker.ProcessExit{Node: e.node, PID: e.pid, Time: e.at.Sub(start).Nanoseconds(),
			Requested: e.requested, Graceful: e.graceful, Status: e.status, Logs: relativeLogs(e.logs, dir)})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time < out[j].Time })
	return out
}

// watchedHandle marks an exit as requested when the harness kills or
// stops the process while it still runs. A process that has already
// exited on its own stays unrequested: a nemesis kill that lands on a
// node that had crashed must not hide the crash.
type watchedHandle struct {
	cluster.Handle
	spec      cluster.NodeSpec
	requested atomic.Bool
	// graceful: the request was a SIGTERM (Terminate), after which the
	// process must exit with status 0.
	graceful  atomic.Bool
	beforeArm bool        // started while the cluster was coming up
	abandoned atomic.Bool // of a start attempt cluster.New gave up on
}

func (h *watchedHandle) request() {
	select {
	case <-h.Exited():
	default:
		h.requested.Store(true)
	}
}

func (h *watchedHandle) Kill() error {
	h.request()
	return h.Handle.Kill()
}

func (h *watchedHandle) Terminate(ctx context.Context) error {
	select {
	case <-h.Exited():
	default:
		h.graceful.Store(true)
	}
	h.request()
	return h.Handle.Terminate(ctx)
}

// ExitCode implements cluster.ExitReporter for the wrapped handle, so a
// graceful stop through the watch still learns its exit status.
func (h *watchedHandle) ExitCode() (int, string, bool) {
	select {
	case <-h.Exited():
	default:
		return 0, "", false
	}
	s := exitStatusOf(h.Handle)
	return s.Code, s.Text, s.Code != -1 || s.Signal != ""
}

// exitStatusOf asks the backend's handle how its process ended; a backend
// that cannot say gets an unknown status, never a clean one.
func exitStatusOf(h cluster.Handle) checker.ExitStatus {
	if p, ok := h.(interface {
		ExitStatus() (process.ExitStatus, bool)
	}); ok {
		if s, ok := p.ExitStatus(); ok {
			return checker.ExitStatus{Code: s.Code, Signal: s.Signal, Text: s.Text}
		}
	}
	return checker.ExitStatus{Code: -1, Text: "unknown (the backend does not report exit statuses)"}
}

// logTails reads the end of a node's process output (where a Go panic
// goes) and of its structured log, whichever exist.
func logTails(spec cluster.NodeSpec) []checker.LogTail {
	var out []checker.LogTail
	paths := []string{spec.LogPath}
	if spec.Dir != "" {
		if p := filepath.Join(spec.Dir, "node.log"); p != spec.LogPath {
			paths = append(paths, p)
		}
	}
	for _, p := range paths {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			continue
		}
		lines, err := process.Tail(p, logTailLines)
		if err != nil {
			lines = []string{"(could not read: " + err.Error() + ")"}
		}
		out = append(out, checker.LogTail{Path: p, Lines: lines})
	}
	return out
}

func relativeLogs(logs []checker.LogTail, dir string) []checker.LogTail {
	out := make([]checker.LogTail, len(logs))
	for i, l := range logs {
		out[i] = l
		if rel, err := filepath.Rel(dir, l.Path); err == nil && filepath.IsLocal(rel) {
			out[i].Path = filepath.ToSlash(rel)
		}
	}
	return out
}

// Listening passes cluster.ListenerOwner through the wrapper, so the
// cluster's start-up check still asks the process itself whether it holds
// its port (a dial would be answered by whichever process took the port).
// A backend without it is dialled, as cluster does for such handles.
func (h *watchedHandle) Listening(addr string) (bool, error) {
	if lo, ok := h.Handle.(cluster.ListenerOwner); ok {
		return lo.Listening(addr)
	}
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false, nil
	}
	conn.Close()
	return true, nil
}
