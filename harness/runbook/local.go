package runbook

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// LocalConfig describes a cluster made by runbooks/local-cluster.sh.
type LocalConfig struct {
	// Script is runbooks/local-cluster.sh.
	Script string
	// Dir holds env.sh and one directory per slot, n<i>/ (data/, logs,
	// pid, events).
	Dir string
	// Bin is the directory holding tidal-server.
	Bin string
	// OldRelease is the directory of the tidal-server nodes run until a
	// page installs another (tidal_install): the release a rolling
	// upgrade starts from. "": Bin.
	OldRelease string
	// Nodes is the initial cluster; Slots (>= Nodes) how many node slots
	// get addresses, for nodes added later.
	Nodes, Slots int
	// Flags are extra `tidal-server run` flags for every node.
	Flags []string
	// Insecure runs the cluster in plaintext (local-cluster.sh
	// --insecure), to compare; by default it is secured: certificates for
	// both planes and every request authenticated.
	Insecure bool
}

// Slot is one node position of a local cluster: its addresses and
// directories stay; the member id in it may change (replace a node).
type Slot struct {
	Index      int    // 1-based, as in $TIDAL_NODE<i>
	Name       string // "n<i>", the node's name in the history
	ClientAddr string // host:port
	PeerAddr   string
	DataDir    string
	Dir        string
}

// LocalCluster is a cluster whose nodes are started and stopped by the
// shell functions of its env.sh — the same way a page does it, and a
// person following the page. The harness only reads pid files and events
// and, for fault injection and cleanup, signals pids it read there.
type LocalCluster struct {
	cfg     LocalConfig
	slots   []Slot
	envFile string

	// certsDir is $TIDAL_CERTS ("" on an insecure cluster); admin and
	// writer present its client certificates and follow its changes.
	certsDir      string
	admin, writer *fileCreds

	// closers run after Close has killed the nodes (unmounting what a
	// scenario mounted under a node), last registered first.
	closers []func() error
}

// NewLocalCluster picks free ports and runs local-cluster.sh to write
// env.sh. It starts nothing: see Up.
func NewLocalCluster(ctx context.Context, cfg LocalConfig) (*LocalCluster, error) {
	if cfg.Nodes < 1 || cfg.Slots < cfg.Nodes {
		return nil, fmt.Errorf("runbook: local cluster: expected 1 <= nodes <= slots, found nodes %d, slots %d", cfg.Nodes, cfg.Slots)
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	cfg.Dir = dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := freePorts(2 * cfg.Slots)
	if err != nil {
		return nil, err
	}
	c := &LocalCluster{cfg: cfg, envFile: filepath.Join(dir, "env.sh")}
	for i := 1; i <= cfg.Slots; i++ {
		c.slots = append(c.slots, Slot{
			Index: i, Name: "n" + strconv.Itoa(i),
			ClientAddr: "127.0.0.1:" + strconv.Itoa(ports[2*i-2]),
			PeerAddr:   "127.0.0.1:" + strconv.Itoa(ports[2*i-1]),
			DataDir:    filepath.Join(dir, "n"+strconv.Itoa(i), "data"),
			Dir:        filepath.Join(dir, "n"+strconv.Itoa(i)),
		})
	}
	portList := make([]string, len(ports))
	for i, p := range ports {
		portList[i] = strconv.Itoa(p)
	}
	args := []string{cfg.Script}
	if cfg.Insecure {
		args = append(args, "--insecure")
	}
	args = append(args, dir, strconv.Itoa(cfg.Nodes), strconv.Itoa(cfg.Slots))
	cmd := exec.CommandContext(ctx, "bash", args...)
	old := cfg.OldRelease
	if old == "" {
		old = cfg.Bin
	}
	cmd.Env = append(os.Environ(), "TIDAL_PORTS="+strings.Join(portList, " "), "TIDAL_BIN="+cfg.Bin,
		"TIDAL_FLAGS="+strings.Join(cfg.Flags, " "), "TIDAL_RELEASE_OLD="+old, "TIDAL_RELEASE_NEW="+cfg.Bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("runbook: %s %s: %v\n%s", cfg.Script, dir, err, out)
	}
	if !cfg.Insecure {
		c.certsDir = filepath.Join(dir, "certs")
		if c.admin, err = newFileCreds(c.certsDir, certAdmin); err != nil {
			return nil, err
		}
		if c.writer, err = newFileCreds(c.certsDir, certWriter); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// CertsDir is $TIDAL_CERTS: the client directory of a secured cluster
// (ca.crt, client.NAME.crt/key); "" for an insecure one.
func (c *LocalCluster) CertsDir() string { return c.certsDir }

// URL is slot s's client URL: https:// on a secured cluster.
func (c *LocalCluster) URL(s Slot) string {
	if c.certsDir != "" {
		return "https://" + s.ClientAddr
	}
	return "http://" + s.ClientAddr
}

// AdminClient is a client of slot s presenting client.admin.crt on a
// secured cluster (status, audit, digests, admin routes); opts follow.
func (c *LocalCluster) AdminClient(s Slot, opts ...client.Option) *client.Client {
	return c.clientWith(c.admin, s, opts)
}

// WriterClient is a client of slot s presenting client.writer.crt on a
// secured cluster: the workload's identity.
func (c *LocalCluster) WriterClient(s Slot, opts ...client.Option) *client.Client {
	return c.clientWith(c.writer, s, opts)
}

func (c *LocalCluster) clientWith(creds *fileCreds, s Slot, opts []client.Option) *client.Client {
	var base []client.Option
	if creds != nil {
		base = creds.Options(s.ClientAddr)
	}
	return client.New(c.URL(s), append(base, opts...)...)
}

// HTTPClient is a raw HTTP client of slot s acting as the admin client
// (HTTP/2 over TLS on a secured cluster), for streams copied to files as
// they are.
func (c *LocalCluster) HTTPClient(s Slot, timeout time.Duration) *http.Client {
	if c.admin != nil {
		return c.admin.HTTPClient(s.ClientAddr, timeout)
	}
	return &http.Client{Transport: &http.Transport{Proxy: nil, DisableCompression: true}, Timeout: timeout}
}

// OnClose registers fn to run when Close has stopped the nodes.
func (c *LocalCluster) OnClose(fn func() error) { c.closers = append(c.closers, fn) }

// freePorts finds n distinct free ports on 127.0.0.1, holding every
// listener until all are chosen so that none is handed out twice.
func freePorts(n int) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		held = append(held, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// EnvFile is the cluster's env.sh.
func (c *LocalCluster) EnvFile() string { return c.envFile }

// Dir is the cluster's directory.
func (c *LocalCluster) Dir() string { return c.cfg.Dir }

// Slots returns every slot, n1 first.
func (c *LocalCluster) Slots() []Slot { return append([]Slot(nil), c.slots...) }

// Initial is the number of nodes of the initial cluster.
func (c *LocalCluster) Initial() int { return c.cfg.Nodes }

// Slot finds a slot by name ("n2").
func (c *LocalCluster) Slot(name string) (Slot, error) {
	for _, s := range c.slots {
		if s.Name == name {
			return s, nil
		}
	}
	return Slot{}, fmt.Errorf("runbook: no slot %q", name)
}

// SlotByPeer finds the slot whose peer address is addr.
func (c *LocalCluster) SlotByPeer(addr string) (Slot, bool) {
	for _, s := range c.slots {
		if s.PeerAddr == addr {
			return s, true
		}
	}
	return Slot{}, false
}

// Exec runs shell code in the cluster's environment (env.sh sourced) with
// its own state, apart from any page's.
func (c *LocalCluster) Exec(ctx context.Context, code string, timeout time.Duration) StepResult {
	sh := &Shell{EnvFile: c.envFile, StateDir: filepath.Join(c.cfg.Dir, ".harness-shell"), Timeout: timeout}
	return sh.Run(ctx, Block{Section: "harness", Heading: "harness", Code: code})
}

// Up starts the initial nodes (tidal_cluster_up) and waits until every one
// is ready.
func (c *LocalCluster) Up(ctx context.Context) error {
	r := c.Exec(ctx, "tidal_cluster_up\n", 2*time.Minute)
	if r.Err != nil {
		return fmt.Errorf("runbook: tidal_cluster_up: %v\n%s", r.Err, r.Output)
	}
	return nil
}

// PID returns the pid of slot's tidal-server, if one runs.
func (c *LocalCluster) PID(s Slot) (int, bool) {
	b, err := os.ReadFile(filepath.Join(s.Dir, "pid"))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, isNode(pid, s)
}

// isNode reports whether pid is alive and is slot s's tidal-server (pids
// are reused; a zombie has no command line).
func isNode(pid int, s Slot) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	return strings.Contains(string(b), "\x00--data-dir\x00"+s.DataDir+"\x00")
}

// Alive reports whether slot's tidal-server runs.
func (c *LocalCluster) Alive(s Slot) bool {
	_, ok := c.PID(s)
	return ok
}

func appendEvent(s Slot, format string, args ...any) {
	f, err := os.OpenFile(filepath.Join(s.Dir, "events"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, format+"\n", args...)
}

// Kill SIGKILLs slot's process, as a power cut or OOM kill would, records
// it in the slot's events as asked for, and waits until it is gone.
func (c *LocalCluster) Kill(ctx context.Context, s Slot) error {
	pid, ok := c.PID(s)
	if !ok {
		return fmt.Errorf("runbook: kill %s: no running tidal-server", s.Name)
	}
	appendEvent(s, "kill %d %d", pid, time.Now().UnixNano())
	syscall.Kill(pid, syscall.SIGCONT)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("runbook: kill %s (pid %d): %w", s.Name, pid, err)
	}
	return c.waitGone(ctx, s, pid)
}

// Stop stops slot's process the way a page does (tidal_stop: SIGTERM,
// drain, wait).
func (c *LocalCluster) Stop(ctx context.Context, s Slot) error {
	r := c.Exec(ctx, fmt.Sprintf("tidal_stop %d\n", s.Index), time.Minute)
	if r.Err != nil {
		return fmt.Errorf("runbook: tidal_stop %d: %v\n%s", s.Index, r.Err, r.Output)
	}
	return nil
}

// Pause SIGSTOPs slot's process (a node stuck in a long stall).
func (c *LocalCluster) Pause(s Slot) error {
	pid, ok := c.PID(s)
	if !ok {
		return fmt.Errorf("runbook: pause %s: no running tidal-server", s.Name)
	}
	appendEvent(s, "pause %d %d", pid, time.Now().UnixNano())
	return syscall.Kill(pid, syscall.SIGSTOP)
}

// Resume SIGCONTs slot's process (after Pause).
func (c *LocalCluster) Resume(s Slot) error {
	pid, ok := c.PID(s)
	if !ok {
		return fmt.Errorf("runbook: resume %s: no running tidal-server", s.Name)
	}
	appendEvent(s, "resume %d %d", pid, time.Now().UnixNano())
	return syscall.Kill(pid, syscall.SIGCONT)
}

func (c *LocalCluster) waitGone(ctx context.Context, s Slot, pid int) error {
	for isNode(pid, s) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("runbook: %s (pid %d) still alive: %w", s.Name, pid, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// waitWrapperGone waits for the processes that still name slot's data dir
// on their command line to end: local-cluster.sh's wrapper, which records
// the node's exit in the slot's events and stdout.log after the node is
// gone. Returning before it did let a test's clean-up remove the slot's
// directory while the wrapper was still writing into it ("directory not
// empty", harness/runbook tests under load).
func waitWrapperGone(ctx context.Context, s Slot) error {
	for {
		pids := slotProcesses(s)
		if len(pids) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("runbook: %s: processes %v still name its data dir: %w", s.Name, pids, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// slotProcesses lists the processes whose command line names slot's data
// dir: its node and the node's wrapper.
func slotProcesses(s Slot) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if isNode(pid, s) {
			out = append(out, pid)
		}
	}
	return out
}

// Close kills every node process still running, by the pid in its slot's
// pid file. Nodes a page left running, or paused, go too.
func (c *LocalCluster) Close() error {
	var errs []error
	for _, s := range c.slots {
		pid, ok := c.PID(s)
		if !ok {
			continue
		}
		syscall.Kill(pid, syscall.SIGCONT)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("runbook: kill %s (pid %d): %w", s.Name, pid, err))
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := c.waitGone(ctx, s, pid); err != nil {
			errs = append(errs, err)
		} else if err := waitWrapperGone(ctx, s); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	for i := len(c.closers) - 1; i >= 0; i-- {
		if err := c.closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	c.closers = nil
	return errors.Join(errs...)
}

// NodeExit is one exit of a node process, as the slot's events recorded
// it, with the member id the process ran as.
type NodeExit struct {
	checker.ProcessExit
	ID uint64
	// Caused: a fault the harness injected was to end this process with
	// exactly this exit status (FillFollowerDisk: the fence, status 4).
	Caused bool
}

// Exits reads every recorded exit of every slot's processes, on the
// history clock of start. An exit is asked for when a stop or kill of the
// same pid was recorded before it (tidal_stop, Kill). It is caused when a
// fault the harness injected was to end the process with a given status
// ("expect-exit PID TIME status=N", FillFollowerDisk) and it exited with
// exactly that status: any other exit of that process is judged as usual.
func (c *LocalCluster) Exits(start time.Time) ([]NodeExit, error) {
	var out []NodeExit
	for _, s := range c.slots {
		f, err := os.Open(filepath.Join(s.Dir, "events"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		ids := map[int]uint64{}
		requested := map[int]bool{}
		expected := map[int]int{} // pid -> the exit status a fault was to cause
		starts := 0
		logs := stdoutSegments(filepath.Join(s.Dir, "stdout.log"))
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 3 {
				continue
			}
			pid, _ := strconv.Atoi(fields[1])
			at, _ := strconv.ParseInt(fields[2], 10, 64)
			switch fields[0] {
			case "start":
				starts++
				if len(fields) > 3 {
					id, _ := strconv.ParseUint(strings.TrimPrefix(fields[3], "id="), 10, 64)
					ids[pid] = id
				}
			case "stop", "kill":
				requested[pid] = true
			case "expect-exit":
				if len(fields) > 3 {
					if code, err := strconv.Atoi(strings.TrimPrefix(fields[3], "status=")); err == nil {
						expected[pid] = code
					}
				}
			case "exit":
				code := -1
				if len(fields) > 3 {
					code, _ = strconv.Atoi(strings.TrimPrefix(fields[3], "status="))
				}
				want, faulted := expected[pid]
				e := NodeExit{ID: ids[pid], Caused: faulted && code == want, ProcessExit: checker.ProcessExit{Node: s.Name, PID: pid,
					Time: at - start.UnixNano(), Requested: requested[pid], Status: bashStatus(code)}}
				if starts > 0 && starts <= len(logs) {
					e.Logs = []checker.LogTail{{Path: filepath.Join(s.Dir, "stdout.log"), Lines: logs[starts-1]}}
				}
				out = append(out, e)
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// bashStatus turns the status bash's `wait` reports into an exit status:
// above 128 it is a signal.
func bashStatus(code int) checker.ExitStatus {
	switch {
	case code > 128:
		sig := syscall.Signal(code - 128)
		return checker.ExitStatus{Code: -1, Signal: sig.String(), Text: "signal: " + sig.String()}
	case code >= 0:
		return checker.ExitStatus{Code: code, Text: "exit status " + strconv.Itoa(code)}
	}
	return checker.ExitStatus{Code: -1, Text: "unknown (no exit status recorded)"}
}

// stdoutSegments splits a slot's stdout.log at the wrapper's "=== ...
// start" markers and returns the last lines of each process's output.
func stdoutSegments(path string) [][]string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "=== ") && strings.Contains(line, " start ") {
			out = append(out, nil)
		}
		if len(out) == 0 {
			continue
		}
		seg := append(out[len(out)-1], line)
		if len(seg) > logTail {
			seg = seg[len(seg)-logTail:]
		}
		out[len(out)-1] = seg
	}
	return out
}

// logTail is how many lines of a process's output an exit quotes.
const logTail = 30

// Reap kills the node processes that runs under a store root left behind
// when the process running them was killed before its cleanup: every
// <root>/<test>/<run>/nodes/n<i>/pid whose pid is still that slot's
// tidal-server, in a run whose owner (owner.json) is no longer running;
// then it unmounts the dead FUSE mounts under root. It returns what it
// killed and unmounted.
func Reap(root string) ([]string, error) {
	pidFiles, err := filepath.Glob(filepath.Join(root, "*", "*", "nodes", "n*", "pid"))
	if err != nil {
		return nil, err
	}
	var killed []string
	for _, pf := range pidFiles {
		runDir := filepath.Dir(filepath.Dir(filepath.Dir(pf)))
		if ownerRunning(runDir) {
			continue
		}
		dir := filepath.Dir(pf)
		s := Slot{Name: filepath.Base(dir), Dir: dir, DataDir: filepath.Join(dir, "data")}
		b, err := os.ReadFile(pf)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || !isNode(pid, s) {
			continue
		}
		syscall.Kill(pid, syscall.SIGCONT)
		syscall.Kill(pid, syscall.SIGKILL)
		killed = append(killed, fmt.Sprintf("%s (pid %d)", dir, pid))
	}
	return append(killed, reapMounts(root)...), nil
}

// reapMounts takes down the FUSE mounts under root whose server is gone
// (a run killed while a scenario's faultfs served a node's data
// directory): they fail every access with ENOTCONN until unmounted.
func reapMounts(root string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	root = filepath.Clean(root) + string(filepath.Separator)
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 || !strings.HasPrefix(fields[4]+string(filepath.Separator), root) {
			continue
		}
		mp := strings.ReplaceAll(fields[4], `\040`, " ")
		if _, err := os.Stat(mp); errors.Is(err, syscall.ENOTCONN) {
			if syscall.Unmount(mp, syscall.MNT_DETACH) == nil {
				out = append(out, mp+" (dead FUSE mount)")
			}
		}
	}
	return out
}

// ownerRunning reports whether the process that made the run in dir still
// runs (same pid and start time), per its owner.json.
func ownerRunning(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, report.OwnerFile))
	if err != nil {
		return false
	}
	var o report.Owner
	if json.Unmarshal(b, &o) != nil || o.PID <= 0 {
		return false
	}
	return o.Running()
}
