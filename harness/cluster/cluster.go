// Package cluster runs a tidal cluster for tests and chaos runs: N nodes
// started by a Backend (real OS processes, or Docker containers), every
// peer link and every client link routed through its own relay of a
// tcp-relay mesh (in process, or a standalone tcp-relay process driven
// through its control API: Config.RelayBinary), and the waits a test needs (a leader, all
// nodes caught up, all ready).
//
// Nodes live in slots named n1..nN. A slot keeps its addresses for the
// whole run; the raft id in it changes only when membership churn removes
// its member and adds the slot back as a new one (ids are never reused).
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tcp-relay/mesh"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// Backend starts nodes. The process backend runs tidal-server binaries;
// the container backend runs them in Docker.
type Backend interface {
	Name() string
	// Launch starts one node as spec says and returns its handle.
	Launch(spec NodeSpec) (Handle, error)
	// Host is the address relays and clients use to reach nodes'
	// listeners, and the one nodes bind ("127.0.0.1" for processes).
	Host() string
	Close() error
}

// NodeSpec is what a backend needs to start one node.
type NodeSpec struct {
	Name string
	// Binary is the program to run; empty means the backend's
	// tidal-server. The cluster sets it to start the standalone relay.
	Binary  string
	Dir     string   // the node's directory on the host: data/, node.log
	Args    []string // tidal-server arguments (after the binary)
	LogPath string
}

// ListenerOwner is implemented by handles that can tell whether their own
// process holds a socket listening on addr (the process backend reads
// /proc). New uses it to know a node bound its ports: a dial could be
// answered by another process that took the port, while the node itself
// is about to exit with "address already in use".
type ListenerOwner interface {
	Listening(addr string) (bool, error)
}

// Handle controls one started node.
type Handle interface {
	PID() int
	Terminate(ctx context.Context) error // SIGTERM and wait
	Kill() error                         // SIGKILL and wait
	Pause() error                        // SIGSTOP
	Resume() error                       // SIGCONT
	Exited() <-chan struct{}
	Stats() (any, error)
}

// Config describes a cluster.
type Config struct {
	Nodes int // 3 or 5; any odd number
	// Spares are extra slots (n<Nodes+1>...) wired into the mesh but not
	// members: AddMember brings one in as a new member.
	Spares  int
	Backend Backend
	Dir     string // nodes/<name>/ go here
	// Flags are extra tidal-server flags for every node, e.g.
	// "--snapshot-every=2000".
	Flags  []string
	Logger *slog.Logger
	// StatsInterval samples each process's RSS, CPU and fds into
	// nodes/<name>/stats.jsonl; 0 = 1s, negative = off.
	StatsInterval time.Duration
	// RelayBinary, when set, is a tcp-relay binary: the mesh then runs in
	// that process (started by the backend, log in <Dir>/tcp-relay/) and
	// is driven over its control API, so faults cross a real process
	// boundary as they would against a remote relay. Empty: in-process.
	RelayBinary string
	// WALSegmentSize is every node's --wal-segment-size. 0 means
	// DefaultWALSegmentSize; negative leaves the server's own default
	// (64 MiB, preallocated: a 5-node run then leaves hundreds of MB).
	WALSegmentSize int64
	// StartTimeout bounds how long New waits for every node to bind its
	// listeners; 0 = 60s. A node that exits meanwhile fails New at once.
	StartTimeout time.Duration
	// Insecure runs the nodes without certificates or tokens: plaintext
	// HTTP/1.1, no authentication (to compare). The default is secured:
	// New makes a CA, node and client certificates and a tokens file
	// (see Security), every node runs with --certs-dir and --tokens, and
	// the cluster's clients speak TLS with HTTP/2.
	Insecure bool
	// CertsDir receives the secured cluster's CA, client certificates
	// and tokens; default "certs" beside Dir (Dir/../certs), so that Dir
	// holds only node directories.
	CertsDir string
	// NewNetwork, when set, builds the relay mesh in place of the two above:
	// a backend whose nodes do not share the harness's network namespace
	// (containers) runs the mesh where they can reach it and answers, per
	// link, the address each side dials. nodes are the slots' addresses
	// as allocated on Backend.Host().
	NewNetwork func(nodes map[string]mesh.Node) (Network, error)
	// DiskFaults mounts faultfs over every slot's data dir (see disk.go),
	// so that the nemesis can cut power and fail the disk. The process
	// and docker backends (a container binds the mount through its node
	// directory: diskMountOptions); needs /dev/fuse and root or
	// fusermount3.
	DiskFaults bool
	// GRPC serves every node's gRPC ingest stream (--grpc-addr on a port
	// of its own; Node.GRPCAddr, Cluster.IngestStream). Clients reach it
	// directly, not through the mesh.
	GRPC bool
	// ClockControl runs every node with the test-only
	// --test-clock-offset-file (clock.go), so that SetClockOffset can
	// move its clock: the clock nemesis needs it.
	ClockControl bool
}

// DefaultWALSegmentSize is the harness's WAL segment size: small, because
// a test run writes little and every node preallocates whole segments.
const DefaultWALSegmentSize = 4 << 20

// maxStartAttempts bounds New's starts on fresh ports after a node lost a
// port to another process between New choosing it and the node binding it.
const maxStartAttempts = 3

// StartError is a node (or the standalone relay) that did not come up
// while New started the cluster, with its own last words from its log.
type StartError struct {
	Node   string
	PID    int
	Exited bool   // it exited; otherwise it ran but never bound its listeners
	Quote  string // the error the node itself wrote
	Log    string // where Quote came from
	// PortTaken says it could not bind a port ("address already in
	// use"): another process took it after New chose it. New retries on
	// fresh ports.
	PortTaken bool
}

func (e *StartError) Error() string {
	what := "exited during start-up"
	if !e.Exited {
		what = "did not bind its listeners in time"
	}
	return fmt.Sprintf("cluster: %s (pid %d) %s: %s (log %s)", e.Node, e.PID, what, e.Quote, e.Log)
}

// State is what the harness last did to a node.
type State string

const (
	Running State = "running"
	Stopped State = "stopped"
	Killed  State = "killed"
	Paused  State = "paused"
	Removed State = "removed" // removed from the raft membership
)

// Node is one slot of the cluster.
type Node struct {
	Name string
	// ID is the raft id currently in this slot.
	ID uint64
	// PeerAddr and ClientAddr are the node's real listeners; ClientRelay
	// is where workload clients connect (through the mesh).
	PeerAddr, ClientAddr, ClientRelay string
	// GRPCAddr is the node's gRPC ingest listener; "" without Config.GRPC.
	GRPCAddr string
	Dir      string

	joined bool
	state  State
	handle Handle
	// logs are the node's log files and their sizes when it was last
	// started: what it wrote since is what a start-up error quotes.
	logs []logMark
}

// logMark is a log file and its size at a point in time.
type logMark struct {
	path string
	size int64
}

func markLogs(paths ...string) []logMark {
	marks := make([]logMark, len(paths))
	for i, p := range paths {
		marks[i].path = p
		if st, err := os.Stat(p); err == nil {
			marks[i].size = st.Size()
		}
	}
	return marks
}

// Cluster is a running cluster. Its methods are safe for concurrent use.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	mesh  Network
	relay Handle    // the standalone tcp-relay, when Config.RelayBinary is set
	sec   *Security // nil when Config.Insecure

	mu      sync.Mutex
	disks   map[string]*faultfs.FS // by slot, with Config.DiskFaults
	nodes   []*Node
	control map[controlKey]*client.Client
	nextID  uint64
	stopc   chan struct{}
	wg      sync.WaitGroup
}

// New allocates addresses, builds the relay mesh, starts every node and
// waits until each has bound its listeners. A node that exits meanwhile
// fails New at once with a *StartError quoting the node's own error; when
// that error is a port another process took after New chose it, New starts
// the whole cluster again on fresh ports (up to maxStartAttempts times),
// first removing the data the failed attempt created.
func New(cfg Config) (*Cluster, error) {
	if cfg.Nodes < 1 {
		return nil, fmt.Errorf("cluster: nodes: expected at least 1, found %d", cfg.Nodes)
	}
	if cfg.Backend == nil {
		return nil, errors.New("cluster: no backend")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StatsInterval == 0 {
		cfg.StatsInterval = time.Second
	}
	if cfg.WALSegmentSize == 0 {
		cfg.WALSegmentSize = DefaultWALSegmentSize
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	var sec *Security
	if !cfg.Insecure {
		if cfg.CertsDir == "" {
			cfg.CertsDir = filepath.Join(filepath.Dir(filepath.Clean(cfg.Dir)), "certs")
		}
		var err error
		if sec, err = newSecurity(cfg.CertsDir, cfg.Backend.Host()); err != nil {
			return nil, err
		}
	}
	// Data a failed attempt creates is removed before the next one (its
	// raft state names the old ports); data that was there before is not.
	var fresh []string
	for i := 1; i <= cfg.Nodes+cfg.Spares; i++ {
		data := filepath.Join(cfg.Dir, "n"+strconv.Itoa(i), "data")
		if _, err := os.Stat(data); errors.Is(err, os.ErrNotExist) {
			fresh = append(fresh, data)
		}
	}
	for attempt := 1; ; attempt++ {
		c, err := newAttempt(cfg, sec)
		if err == nil {
			return c, nil
		}
		var se *StartError
		if !errors.As(err, &se) || !se.PortTaken || attempt == maxStartAttempts {
			if se != nil && se.PortTaken {
				return nil, fmt.Errorf("%w (a port was taken on each of %d attempts)", err, attempt)
			}
			return nil, err
		}
		cfg.Logger.Warn("a port was taken before the node bound it; starting the cluster again on fresh ports",
			"attempt", attempt, "node", se.Node, "error", se.Quote)
		for _, d := range fresh {
			if err := os.RemoveAll(d); err != nil {
				return nil, fmt.Errorf("cluster: remove %s after a failed start: %w", d, err)
			}
		}
	}
}

// newAttempt is one start of the whole cluster on freshly chosen ports.
// On error everything it started is stopped (the backend stays open).
func newAttempt(cfg Config, sec *Security) (*Cluster, error) {
	c := &Cluster{cfg: cfg, log: cfg.Logger, sec: sec, nextID: uint64(cfg.Nodes+cfg.Spares) + 1, stopc: make(chan struct{})}
	host := cfg.Backend.Host()
	meshNodes := map[string]mesh.Node{}
	// Hold every listener until all ports are chosen: closing each one at
	// once let the kernel hand the same port out twice.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	freePort := func() (string, error) {
		l, err := net.Listen("tcp", host+":0")
		if err != nil {
			return "", err
		}
		held = append(held, l)
		return l.Addr().String(), nil
	}
	for i := 1; i <= cfg.Nodes+cfg.Spares; i++ {
		name := "n" + strconv.Itoa(i)
		peer, err := freePort()
		if err != nil {
			return nil, err
		}
		cl, err := freePort()
		if err != nil {
			return nil, err
		}
		var grpcAddr string
		if cfg.GRPC {
			if grpcAddr, err = freePort(); err != nil {
				return nil, err
			}
		}
		dir := filepath.Join(cfg.Dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		st := Stopped
		if i > cfg.Nodes {
			st = Removed
		}
		c.nodes = append(c.nodes, &Node{Name: name, ID: uint64(i), PeerAddr: peer, ClientAddr: cl, GRPCAddr: grpcAddr, Dir: dir, state: st})
		meshNodes[name] = mesh.Node{Peer: peer, Client: cl}
	}
	var controlAddr string
	var controlHeld net.Listener
	if cfg.RelayBinary != "" {
		a, err := freePort()
		if err != nil {
			return nil, err
		}
		controlAddr = a
		controlHeld = held[len(held)-1]
		held = held[:len(held)-1]
	}
	// The nodes' ports stay held while the relays bind theirs on :0, so
	// no relay can take a port a node is about to bind (it happened: a
	// client relay on n3's client port, and n3 exited at start).
	if cfg.Nodes+cfg.Spares >= 2 {
		if cfg.NewNetwork != nil {
			if controlHeld != nil {
				controlHeld.Close()
			}
			m, err := cfg.NewNetwork(meshNodes)
			if err != nil {
				return nil, fmt.Errorf("cluster: relay mesh: %w", err)
			}
			c.mesh = m
		} else if cfg.RelayBinary != "" {
			controlHeld.Close()
			if err := c.startRelay(controlAddr, meshNodes); err != nil {
				c.teardown()
				return nil, err
			}
		} else {
			m, err := mesh.New(mesh.Config{Nodes: meshNodes, Logger: cfg.Logger})
			if err != nil {
				return nil, err
			}
			c.mesh = m
		}
		for _, n := range c.nodes {
			n.ClientRelay, _ = c.mesh.ClientAddr(n.Name)
		}
	} else {
		if controlHeld != nil {
			controlHeld.Close()
		}
		c.nodes[0].ClientRelay = c.nodes[0].ClientAddr
	}
	for _, l := range held {
		l.Close()
	}
	held = nil
	if err := c.mountDisks(); err != nil {
		c.teardown()
		return nil, err
	}
	for _, n := range c.nodes[:cfg.Nodes] {
		if err := c.Start(n.Name); err != nil {
			c.teardown()
			return nil, err
		}
	}
	if err := c.waitBound(c.nodes[:cfg.Nodes]); err != nil {
		c.teardown()
		return nil, err
	}
	if cfg.StatsInterval > 0 {
		c.wg.Add(1)
		go c.sampleStats()
	}
	return c, nil
}

// startRelay runs the standalone tcp-relay with its control API on
// controlAddr, waits for it to answer, and creates the mesh in it.
func (c *Cluster) startRelay(controlAddr string, nodes map[string]mesh.Node) error {
	dir := filepath.Join(c.cfg.Dir, "tcp-relay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(dir, "tcp-relay.log")
	marks := markLogs(logPath)
	h, err := c.cfg.Backend.Launch(NodeSpec{Name: "tcp-relay", Binary: c.cfg.RelayBinary, Dir: dir,
		Args: []string{"--control", controlAddr}, LogPath: logPath})
	if err != nil {
		return fmt.Errorf("cluster: start tcp-relay %s: %w", c.cfg.RelayBinary, err)
	}
	c.relay = h
	api := control.NewClient(controlAddr, &http.Client{Timeout: remoteCallTimeout})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		hctx, hcancel := context.WithTimeout(ctx, time.Second)
		err = api.Healthz(hctx)
		hcancel()
		if err == nil {
			break
		}
		select {
		case <-h.Exited():
			return startError("tcp-relay", h.PID(), true, marks)
		case <-ctx.Done():
			return fmt.Errorf("cluster: tcp-relay control API at %s: expected /healthz to answer within 15s, last error: %w", controlAddr, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	info, err := api.CreateMesh(ctx, control.MeshConfig{Nodes: nodes})
	if err != nil {
		return fmt.Errorf("cluster: tcp-relay at %s: create mesh of %d nodes: %w", controlAddr, len(nodes), err)
	}
	if len(info.Nodes) != len(nodes) {
		return fmt.Errorf("cluster: tcp-relay at %s: expected a mesh of %d nodes, found %d", controlAddr, len(nodes), len(info.Nodes))
	}
	c.mesh = NewRemoteNetwork(api, info, c.log)
	c.log.Info("standalone tcp-relay up", "pid", h.PID(), "control", controlAddr)
	return nil
}

// Mesh is the relay mesh (nil for a single node).
func (c *Cluster) Mesh() Network { return c.mesh }

// Nodes returns the slots in name order.
func (c *Cluster) Nodes() []Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Node, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = *n
	}
	return out
}

// Names returns the slot names.
func (c *Cluster) Names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.Name)
	}
	return out
}

func (c *Cluster) node(name string) (*Node, error) {
	for _, n := range c.nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("cluster: no node %q (have %s)", name, strings.Join(c.namesLocked(), ", "))
}

func (c *Cluster) namesLocked() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.Name)
	}
	return out
}

// State reports what the harness last did to name.
func (c *Cluster) State(name string) State {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(name)
	if err != nil {
		return ""
	}
	return n.state
}

// NameOf maps a raft id to its slot name ("" if none).
func (c *Cluster) NameOf(id uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.ID == id {
			return n.Name
		}
	}
	return ""
}

// args builds a node's command line. --peers lists every slot's real peer
// address (what the membership advertises); --peer-dial rewrites each to
// the relay this node must use, so every link crosses the mesh.
func (c *Cluster) args(n *Node) []string {
	var peers, dial []string
	for _, o := range c.nodes {
		if o.state == Removed && o != n {
			continue
		}
		peers = append(peers, fmt.Sprintf("%d=%s", o.ID, o.PeerAddr))
		if o != n && c.mesh != nil {
			r, _ := c.mesh.PeerAddr(n.Name, o.Name)
			dial = append(dial, o.PeerAddr+"="+r)
		}
	}
	args := []string{"run",
		"--id", strconv.FormatUint(n.ID, 10),
		"--client-addr", n.ClientAddr,
		"--peer-addr", n.PeerAddr,
		"--peers", strings.Join(peers, ","),
		"--data-dir", filepath.Join(n.Dir, "data"),
		"--log-file", filepath.Join(n.Dir, "node.log"),
	}
	if len(dial) > 0 {
		args = append(args, "--peer-dial", strings.Join(dial, ","))
	}
	if n.GRPCAddr != "" {
		args = append(args, "--grpc-addr", n.GRPCAddr)
	}
	if n.joined {
		args = append(args, "--join")
	}
	if c.sec != nil {
		args = append(args, nodeArgs(filepath.Join(n.Dir, "certs"))...)
	}
	if c.cfg.WALSegmentSize > 0 {
		// Before Flags, so a flag given there wins.
		args = append(args, "--wal-segment-size", strconv.FormatInt(c.cfg.WALSegmentSize, 10))
	}
	if c.cfg.ClockControl {
		args = append(args, "--test-clock-offset-file", ClockOffsetFile(n.Dir))
	}
	return append(args, c.cfg.Flags...)
}

// Start (re)starts a stopped or killed node with its existing data.
func (c *Cluster) Start(name string) error {
	c.mu.Lock()
	n, err := c.node(name)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if n.state == Running || n.state == Paused {
		c.mu.Unlock()
		return fmt.Errorf("cluster: %s is %s", name, n.state)
	}
	if c.sec != nil {
		// The node certificate names the member in the slot now (a slot
		// added back holds a new id).
		if _, err := c.sec.nodeCerts(n.Dir, n.ID); err != nil {
			c.mu.Unlock()
			return err
		}
	}
	spec := NodeSpec{Name: n.Name, Dir: n.Dir, Args: c.args(n), LogPath: filepath.Join(n.Dir, "stdout.log")}
	marks := markLogs(spec.LogPath, filepath.Join(n.Dir, "node.log"))
	c.mu.Unlock()
	h, err := c.cfg.Backend.Launch(spec)
	if err != nil {
		return fmt.Errorf("cluster: start %s: %w", name, err)
	}
	c.mu.Lock()
	n.handle = h
	n.logs = marks
	n.state = Running
	c.mu.Unlock()
	c.log.Info("node started", "node", name, "id", n.ID, "pid", h.PID())
	return nil
}

func (c *Cluster) handle(name string, want ...State) (*Node, Handle, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(name)
	if err != nil {
		return nil, nil, err
	}
	for _, w := range want {
		if n.state == w {
			return n, n.handle, nil
		}
	}
	return nil, nil, fmt.Errorf("cluster: %s is %s, expected %v", name, n.state, want)
}

func (c *Cluster) setState(n *Node, s State) {
	c.mu.Lock()
	n.state = s
	c.mu.Unlock()
}

// Stop terminates a node gracefully (SIGTERM, drain).
func (c *Cluster) Stop(ctx context.Context, name string) error {
	n, h, err := c.handle(name, Running, Paused)
	if err != nil {
		return err
	}
	err = h.Terminate(ctx)
	c.setState(n, Stopped)
	return err
}

// Kill SIGKILLs a node.
func (c *Cluster) Kill(name string) error {
	n, h, err := c.handle(name, Running, Paused)
	if err != nil {
		return err
	}
	err = h.Kill()
	c.setState(n, Killed)
	c.log.Info("node killed", "node", name)
	return err
}

// Pause SIGSTOPs a node.
func (c *Cluster) Pause(name string) error {
	n, h, err := c.handle(name, Running)
	if err != nil {
		return err
	}
	if err := h.Pause(); err != nil {
		return err
	}
	c.setState(n, Paused)
	return nil
}

// Resume SIGCONTs a paused node.
func (c *Cluster) Resume(name string) error {
	n, h, err := c.handle(name, Paused)
	if err != nil {
		return err
	}
	if err := h.Resume(); err != nil {
		return err
	}
	c.setState(n, Running)
	return nil
}

// Restart kills (if running) and starts a node again on the same data.
func (c *Cluster) Restart(name string) error {
	if st := c.State(name); st == Running || st == Paused {
		if err := c.Kill(name); err != nil {
			return err
		}
	}
	return c.Start(name)
}

// Wipe deletes a stopped node's data.
func (c *Cluster) Wipe(name string) error {
	c.mu.Lock()
	n, err := c.node(name)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if st := c.State(name); st == Running || st == Paused {
		return fmt.Errorf("cluster: wipe %s: node is %s", name, st)
	}
	c.mu.Lock()
	disk := c.disks[name]
	c.mu.Unlock()
	if disk != nil {
		return c.wipeDisk(n, disk)
	}
	return os.RemoveAll(filepath.Join(n.Dir, "data"))
}

// voters counts slots holding a member (anything not removed).
func (c *Cluster) voters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, node := range c.nodes {
		if node.state != Removed {
			n++
		}
	}
	return n
}

// running lists nodes the harness believes are running.
func (c *Cluster) running() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range c.nodes {
		if n.state == Running {
			out = append(out, n.Name)
		}
	}
	return out
}

func (c *Cluster) sampleStats() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.StatsInterval)
	defer t.Stop()
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for {
		select {
		case <-c.stopc:
			return
		case <-t.C:
		}
		c.mu.Lock()
		type sample struct {
			name string
			h    Handle
		}
		var hs []sample
		for _, n := range c.nodes {
			if n.state == Running || n.state == Paused {
				hs = append(hs, sample{n.Name, n.handle})
			}
		}
		c.mu.Unlock()
		for _, s := range hs {
			st, err := s.h.Stats()
			if err != nil {
				continue
			}
			f := files[s.name]
			if f == nil {
				f, err = os.OpenFile(filepath.Join(c.cfg.Dir, s.name, "stats.jsonl"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
				if err != nil {
					continue
				}
				files[s.name] = f
			}
			line, _ := json.Marshal(map[string]any{"time": time.Now().UTC().Format(time.RFC3339Nano), "node": s.name, "stats": st})
			f.Write(append(line, '\n'))
		}
	}
}

// Close kills every node, closes the mesh and the backend. Nodes are
// killed, not drained: a test's cleanup must not wait on a wedged node.
func (c *Cluster) Close() error {
	err := c.teardown()
	if berr := c.cfg.Backend.Close(); err == nil {
		err = berr
	}
	return err
}

// teardown is Close without closing the backend, which a retried start
// goes on using.
func (c *Cluster) teardown() error {
	select {
	case <-c.stopc:
	default:
		close(c.stopc)
	}
	c.wg.Wait()
	c.mu.Lock()
	nodes := append([]*Node(nil), c.nodes...)
	for _, cl := range c.control {
		cl.CloseIdleConnections()
	}
	c.mu.Unlock()
	for _, n := range nodes {
		if n.handle != nil {
			n.handle.Kill()
		}
	}
	var err error
	if c.mesh != nil {
		err = c.mesh.Close()
	}
	if c.relay != nil {
		// By pid, after the mesh is closed: nothing else stops it.
		if kerr := c.relay.Kill(); err == nil {
			err = kerr
		}
	}
	// After every node is dead: a node holding a file open on its mount
	// would only get EIO, but its last writes would be lost to the report.
	if derr := c.unmountDisks(); err == nil {
		err = derr
	}
	return err
}

// LeaderName returns the current leader's slot as seen by any running node.
func (c *Cluster) LeaderName(ctx context.Context) string {
	for _, name := range c.running() {
		if st, err := c.Status(ctx, name); err == nil && st.Leader != 0 {
			return c.NameOf(st.Leader)
		}
	}
	return ""
}

// RunningNames lists the nodes the harness believes are running, sorted.
func (c *Cluster) RunningNames() []string {
	r := c.running()
	sort.Strings(r)
	return r
}
