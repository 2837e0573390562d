package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/db/ingress"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/tcp-relay/mesh"
)

// node is one slot of an etcd cluster. Its addresses stay for the run;
// the member id in it changes when churn removes it and adds it back.
type node struct {
	name string
	dir  string
	// peerListen and clientListen are etcd's real listeners; peerURL is
	// what the membership advertises (the slot's ingress), clientRelay
	// what workload clients dial (through the mesh).
	peerListen, clientListen string
	peerURL, clientRelay     string
	memberID                 uint64

	state  cluster.State
	handle cluster.Handle
	// initialCluster and clusterState are the start flags of a node that
	// joins (churn heal); empty for the members of the first start.
	initialCluster, clusterState string
	control                      *api // direct to clientListen: the harness's control plane
}

// Cluster is a running etcd cluster behind the relay mesh. It implements
// nemesis.Cluster and db.Cluster.
type Cluster struct {
	cfg     Config
	log     *slog.Logger
	backend cluster.Backend
	mesh    *mesh.Mesh
	ingress []*ingress.Ingress
	token   string

	mu    sync.Mutex
	nodes []*node
	// disks are the faultfs mounts under the data dirs (nil: none).
	disks map[string]*faultfs.FS
	stops []func() // background work to end at Close (watchers)
}

// startCluster allocates ports, builds the mesh and an ingress per node,
// and starts every node with initial-cluster-state new.
func startCluster(cfg Config, nodes int, dir string, diskFaults bool, backend cluster.Backend, log *slog.Logger) (*Cluster, error) {
	c := &Cluster{cfg: cfg, log: log, backend: backend, token: "tidal-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	free := func() (string, error) {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		held = append(held, l)
		return l.Addr().String(), nil
	}
	meshNodes := map[string]mesh.Node{}
	for i := 1; i <= nodes; i++ {
		n := &node{name: "n" + strconv.Itoa(i), dir: filepath.Join(dir, "n"+strconv.Itoa(i)), state: cluster.Stopped}
		var err error
		if n.peerListen, err = free(); err != nil {
			return nil, err
		}
		if n.clientListen, err = free(); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return nil, err
		}
		n.control = newAPI(n.clientListen, 10*time.Second)
		meshNodes[n.name] = mesh.Node{Peer: n.peerListen, Client: n.clientListen}
		c.nodes = append(c.nodes, n)
	}
	m, err := mesh.New(mesh.Config{Nodes: meshNodes, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("etcd: relay mesh: %w", err)
	}
	c.mesh = m
	for _, n := range c.nodes {
		in, err := ingress.Listen("127.0.0.1:0", n.name, m, c, log)
		if err != nil {
			c.teardown()
			return nil, err
		}
		c.ingress = append(c.ingress, in)
		n.peerURL = "http://" + in.Addr()
		ca, _ := m.ClientAddr(n.name)
		n.clientRelay = ca
	}
	for _, l := range held {
		l.Close()
	}
	held = nil
	if diskFaults {
		if err := c.mountDisks(); err != nil {
			c.teardown()
			return nil, err
		}
	}
	for _, n := range c.nodes {
		if err := c.Start(n.name); err != nil {
			c.teardown()
			return nil, err
		}
	}
	return c, nil
}

// PIDs implements ingress.Owners: the running node processes.
func (c *Cluster) PIDs() map[int]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int]string{}
	for _, n := range c.nodes {
		if n.handle != nil && (n.state == cluster.Running || n.state == cluster.Paused) {
			out[n.handle.PID()] = n.name
		}
	}
	return out
}

func (c *Cluster) node(name string) (*node, error) {
	for _, n := range c.nodes {
		if n.name == name {
			return n, nil
		}
	}
	return nil, fmt.Errorf("etcd: no node %q", name)
}

// Names implements nemesis.Cluster.
func (c *Cluster) Names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.name)
	}
	return out
}

// State implements nemesis.Cluster.
func (c *Cluster) State(name string) cluster.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(name)
	if err != nil {
		return ""
	}
	return n.state
}

// Mesh implements nemesis.Cluster.
func (c *Cluster) Mesh() cluster.Network { return c.mesh }

// initialCluster lists every slot holding a member at its advertised URL.
func (c *Cluster) initialClusterLocked() string {
	var parts []string
	for _, n := range c.nodes {
		if n.state != cluster.Removed {
			parts = append(parts, n.name+"="+n.peerURL)
		}
	}
	return strings.Join(parts, ",")
}

func (c *Cluster) args(n *node) []string {
	initial, state := n.initialCluster, n.clusterState
	if initial == "" {
		initial, state = c.initialClusterLocked(), "new"
	}
	args := []string{
		"--name", n.name,
		"--data-dir", filepath.Join(n.dir, "data"),
		"--listen-peer-urls", "http://" + n.peerListen,
		"--initial-advertise-peer-urls", n.peerURL,
		"--listen-client-urls", "http://" + n.clientListen,
		"--advertise-client-urls", "http://" + n.clientRelay,
		"--initial-cluster", initial,
		"--initial-cluster-state", state,
		"--initial-cluster-token", c.token,
		"--logger", "zap", "--log-outputs", "stderr",
	}
	if c.cfg.SnapshotCount > 0 {
		args = append(args, "--snapshot-count", strconv.Itoa(c.cfg.SnapshotCount))
	}
	return append(args, c.cfg.Flags...)
}

// Start implements nemesis.Cluster: (re)starts a stopped or killed node on
// its data. A node with data ignores the initial-cluster flags; one
// without (a member added back) joins with state existing.
func (c *Cluster) Start(name string) error {
	c.mu.Lock()
	n, err := c.node(name)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	if n.state == cluster.Running || n.state == cluster.Paused || n.state == cluster.Removed {
		c.mu.Unlock()
		return fmt.Errorf("etcd: start %s: node is %s", name, n.state)
	}
	spec := cluster.NodeSpec{Name: n.name, Binary: c.cfg.Binary, Dir: n.dir, Args: c.args(n), LogPath: filepath.Join(n.dir, "stdout.log")}
	c.mu.Unlock()
	h, err := c.backend.Launch(spec)
	if err != nil {
		return fmt.Errorf("etcd: start %s: %w", name, err)
	}
	c.mu.Lock()
	n.handle, n.state = h, cluster.Running
	c.mu.Unlock()
	c.log.Info("etcd node started", "node", name, "pid", h.PID())
	return nil
}

func (c *Cluster) handle(name string, want ...cluster.State) (*node, cluster.Handle, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(name)
	if err != nil {
		return nil, nil, err
	}
	if !slices.Contains(want, n.state) {
		return nil, nil, fmt.Errorf("etcd: %s is %s, expected %v", name, n.state, want)
	}
	return n, n.handle, nil
}

func (c *Cluster) set(n *node, s cluster.State) {
	c.mu.Lock()
	n.state = s
	c.mu.Unlock()
}

// Kill implements nemesis.Cluster (SIGKILL).
func (c *Cluster) Kill(name string) error {
	n, h, err := c.handle(name, cluster.Running, cluster.Paused)
	if err != nil {
		return err
	}
	err = h.Kill()
	c.set(n, cluster.Killed)
	return err
}

// Pause implements nemesis.Cluster (SIGSTOP).
func (c *Cluster) Pause(name string) error {
	n, h, err := c.handle(name, cluster.Running)
	if err != nil {
		return err
	}
	if err := h.Pause(); err != nil {
		return err
	}
	c.set(n, cluster.Paused)
	return nil
}

// Resume implements nemesis.Cluster (SIGCONT).
func (c *Cluster) Resume(name string) error {
	n, h, err := c.handle(name, cluster.Paused)
	if err != nil {
		return err
	}
	if err := h.Resume(); err != nil {
		return err
	}
	c.set(n, cluster.Running)
	return nil
}

// Restart implements nemesis.Cluster: kill, then start on the same data.
func (c *Cluster) Restart(name string) error {
	if st := c.State(name); st == cluster.Running || st == cluster.Paused {
		if err := c.Kill(name); err != nil {
			return err
		}
	}
	return c.Start(name)
}

// via picks the node to send an admin change through: the leader if it
// is running and not `not`, else any other running node.
func (c *Cluster) via(ctx context.Context, not string) (*node, error) {
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	leader, _ := c.leader(lctx)
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.name == leader && n.name != not && n.state == cluster.Running {
			return n, nil
		}
	}
	for _, n := range c.nodes {
		if n.name != not && n.state == cluster.Running {
			return n, nil
		}
	}
	return nil, fmt.Errorf("etcd: no running node other than %s", not)
}

// RemoveMember implements nemesis.Cluster: the member API removes the
// slot's member (through the leader), then the node is killed and wiped.
func (c *Cluster) RemoveMember(ctx context.Context, name string) error {
	c.mu.Lock()
	n, err := c.node(name)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	id, err := c.memberID(ctx, n)
	if err != nil {
		return fmt.Errorf("etcd: remove %s: %w", name, err)
	}
	via, err := c.via(ctx, name)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err = via.control.removeMember(rctx, id)
	var ee *Error
	if err != nil && !(errors.As(err, &ee) && ee.Code == codeNotFound) {
		// NotFound: an earlier attempt that timed out on our side committed.
		err = fmt.Errorf("etcd: remove member %x (%s) via %s: %w", id, name, via.name, err)
		if refusedReconfig(err) {
			return nemesis.NotApplied(err)
		}
		// Unknown outcome: if the membership no longer holds it, the
		// removal committed, and the slot is treated as removed (its node
		// stops itself once it learns; the harness kills it first).
		if _, found, lerr := c.memberByURL(ctx, n.peerURL); lerr != nil || found {
			return err
		}
	}
	if st := c.State(name); st == cluster.Running || st == cluster.Paused {
		c.Kill(name)
	}
	c.mu.Lock()
	n.state, n.memberID = cluster.Removed, 0
	c.mu.Unlock()
	return c.wipe(n)
}

// AddMember implements nemesis.Cluster: the member API adds the slot back
// as a new member at its advertised URL, and the node starts empty with
// initial-cluster-state existing and the membership etcd answered.
func (c *Cluster) AddMember(ctx context.Context, name string) (uint64, error) {
	c.mu.Lock()
	n, err := c.node(name)
	if err == nil && n.state != cluster.Removed {
		err = fmt.Errorf("etcd: add %s: slot holds a member (%s); remove it first", name, n.state)
	}
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	via, err := c.via(ctx, name)
	if err != nil {
		return 0, err
	}
	// An earlier add whose outcome we did not learn (a timeout) may have
	// committed: a member at the slot's URL that never started. Adding
	// again would be refused (the URL exists, or too few started members
	// for the larger quorum) for as long as that member is not started:
	// start it instead.
	if m, found, err := c.memberByURL(ctx, n.peerURL); err == nil && found {
		return c.adopt(name, n, m)
	}
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	resp, err := via.control.addMember(actx, n.peerURL)
	if err != nil {
		err = fmt.Errorf("etcd: add member %s at %s via %s: %w", name, n.peerURL, via.name, err)
		if refusedReconfig(err) {
			return 0, nemesis.NotApplied(err)
		}
		if m, found, lerr := c.memberByURL(ctx, n.peerURL); lerr == nil && found {
			return c.adopt(name, n, m) // it committed after all
		}
		return 0, err
	}
	var parts []string
	c.mu.Lock()
	for _, m := range resp.Members {
		mname := m.Name
		if mname == "" || uint64(m.ID) == uint64(resp.Member.ID) {
			mname = name
		}
		for _, u := range m.PeerURLs {
			parts = append(parts, mname+"="+u)
		}
	}
	n.memberID = uint64(resp.Member.ID)
	n.initialCluster, n.clusterState = strings.Join(parts, ","), "existing"
	n.state = cluster.Stopped
	c.mu.Unlock()
	c.wipe(n)
	return uint64(resp.Member.ID), c.Start(name)
}

// memberID is the member id in n's slot: known from an earlier status,
// else from the member list of any running node, by peer URL.
func (c *Cluster) memberID(ctx context.Context, n *node) (uint64, error) {
	c.mu.Lock()
	id := n.memberID
	c.mu.Unlock()
	if id != 0 {
		return id, nil
	}
	if err := c.refreshMembers(ctx); err != nil {
		return 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n.memberID == 0 {
		return 0, fmt.Errorf("no member advertises %s", n.peerURL)
	}
	return n.memberID, nil
}

// refreshMembers maps member ids to slots by their advertised peer URL.
func (c *Cluster) refreshMembers(ctx context.Context) error {
	var last error
	for _, name := range c.RunningNames() {
		n, _ := c.node(name)
		mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		resp, err := n.control.members(mctx)
		cancel()
		if err != nil {
			last = err
			continue
		}
		c.mu.Lock()
		for _, m := range resp.Members {
			for _, o := range c.nodes {
				if slices.Contains(m.PeerURLs, o.peerURL) && o.state != cluster.Removed {
					o.memberID = uint64(m.ID)
				}
			}
		}
		c.mu.Unlock()
		return nil
	}
	if last == nil {
		last = errors.New("no node is running")
	}
	return fmt.Errorf("member list: %w", last)
}

// nameOf maps a member id to its slot ("" if none).
func (c *Cluster) nameOf(id uint64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.memberID == id && n.state != cluster.Removed {
			return n.name
		}
	}
	return ""
}

// RunningNames lists the nodes the harness believes are running.
func (c *Cluster) RunningNames() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, n := range c.nodes {
		if n.state == cluster.Running {
			out = append(out, n.name)
		}
	}
	return out
}

func (c *Cluster) voters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := 0
	for _, n := range c.nodes {
		if n.state != cluster.Removed {
			v++
		}
	}
	return v
}

// status asks name for its maintenance status directly (control plane),
// and learns its member id from the answer.
func (c *Cluster) status(ctx context.Context, name string) (*statusResponse, error) {
	c.mu.Lock()
	n, err := c.node(name)
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := n.control.status(sctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if n.state != cluster.Removed {
		n.memberID = uint64(st.Header.MemberID)
	}
	c.mu.Unlock()
	return st, nil
}

// leader is one round of WaitLeader: the leader a majority of the voters
// name, if it runs.
func (c *Cluster) leader(ctx context.Context) (string, error) {
	votes := map[uint64]int{}
	run := c.RunningNames()
	var last error
	for _, name := range run {
		st, err := c.status(ctx, name)
		if err != nil {
			last = fmt.Errorf("%s: %w", name, err)
			continue
		}
		if st.Leader != 0 {
			votes[uint64(st.Leader)]++
		}
	}
	for id, v := range votes {
		if 2*v > c.voters() {
			name := c.nameOf(id)
			if name == "" {
				c.refreshMembers(ctx)
				name = c.nameOf(id)
			}
			if name != "" && c.State(name) == cluster.Running {
				return name, nil
			}
		}
	}
	return "", fmt.Errorf("no leader agreed by a majority of %v (votes %v; last error %v)", run, votes, last)
}

// WaitLeader implements nemesis.Cluster.
func (c *Cluster) WaitLeader(ctx context.Context) (string, error) {
	for {
		name, err := c.leader(ctx)
		if err == nil {
			return name, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%v: %w", err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitConverged implements nemesis.Cluster: every running node has
// applied the same raft index, at least the leader's commit index when
// the wait began.
func (c *Cluster) WaitConverged(ctx context.Context) error {
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		return err
	}
	st, err := c.status(ctx, leader)
	if err != nil {
		return err
	}
	target := uint64(st.RaftIndex)
	for {
		seen := map[string]uint64{}
		ok := true
		var first uint64
		for i, name := range c.RunningNames() {
			s, err := c.status(ctx, name)
			if err != nil {
				ok = false
				continue
			}
			applied := uint64(s.RaftAppliedIndex)
			seen[name] = applied
			if applied < target || (i > 0 && applied != first) {
				ok = false
			}
			if i == 0 {
				first = applied
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd nodes did not converge on raft index >= %d: applied %v: %w", target, seen, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// TransferLeader implements nemesis.Cluster: etcd's MoveLeader, sent to
// the leader from; it returns once to leads.
func (c *Cluster) TransferLeader(ctx context.Context, from, to string) error {
	c.mu.Lock()
	f, err := c.node(from)
	var t *node
	if err == nil {
		t, err = c.node(to)
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	id, err := c.memberID(ctx, t)
	if err != nil {
		return err
	}
	return f.control.moveLeader(ctx, id)
}

// Serving implements db.Cluster: name answers its maintenance status.
func (c *Cluster) Serving(ctx context.Context, name string) error {
	st, err := c.status(ctx, name)
	if err != nil {
		return fmt.Errorf("POST /v3/maintenance/status: %w", err)
	}
	if len(st.Errors) > 0 {
		return fmt.Errorf("POST /v3/maintenance/status: errors %v", st.Errors)
	}
	return nil
}

// Close implements db.Cluster: kills every node (not drained: cleanup
// must not wait on a wedged node), closes the ingresses, the mesh and the
// backend.
func (c *Cluster) Close() error {
	err := c.teardown()
	if berr := c.backend.Close(); err == nil {
		err = berr
	}
	return err
}

func (c *Cluster) teardown() error {
	c.mu.Lock()
	nodes := slices.Clone(c.nodes)
	stops := c.stops
	c.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
	for _, n := range nodes {
		if n.handle != nil {
			n.handle.Kill()
		}
		n.control.close()
	}
	for _, in := range c.ingress {
		in.Close()
	}
	var errs []error
	if c.HasDisks() {
		// A process still holding a file of a mount would get EIO and
		// keep the unmount busy: the nodes go first.
		c.waitExited(30 * time.Second)
		errs = append(errs, c.unmountDisks())
	}
	if c.mesh != nil {
		errs = append(errs, c.mesh.Close())
	}
	return errors.Join(errs...)
}

// refusedReconfig says etcd refused a membership change before proposing
// it: --strict-reconfig-check (on by default) answers "unhealthy cluster"
// (add) or "not enough started members" (remove) when the change would
// leave too few started members for a quorum.
func refusedReconfig(err error) bool {
	var ee *Error
	return errors.As(err, &ee) && (strings.Contains(ee.Message, "unhealthy cluster") ||
		strings.Contains(ee.Message, "not enough started members"))
}

// memberByURL finds the member advertising peerURL in the membership as
// the leader (or, without one, any running node) knows it.
func (c *Cluster) memberByURL(ctx context.Context, peerURL string) (member, bool, error) {
	var last error = errors.New("no node is running")
	for attempt := 0; attempt < 3; attempt++ {
		via, err := c.via(ctx, "")
		if err != nil {
			return member{}, false, err
		}
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := via.control.members(mctx)
		cancel()
		if err == nil {
			for _, m := range resp.Members {
				if slices.Contains(m.PeerURLs, peerURL) {
					return m, true, nil
				}
			}
			return member{}, false, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return member{}, false, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return member{}, false, fmt.Errorf("member list: %w", last)
}

// adopt starts slot name as member m, which the membership already holds
// (added by an attempt whose answer we lost), with the membership as the
// leader knows it.
func (c *Cluster) adopt(name string, n *node, m member) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	via, err := c.via(ctx, name)
	if err != nil {
		return 0, err
	}
	resp, err := via.control.members(ctx)
	if err != nil {
		return 0, fmt.Errorf("etcd: adopt %s as member %x: member list: %w", name, uint64(m.ID), err)
	}
	var parts []string
	c.mu.Lock()
	for _, o := range resp.Members {
		oname := o.Name
		if oname == "" || o.ID == m.ID {
			oname = name
		}
		for _, u := range o.PeerURLs {
			parts = append(parts, oname+"="+u)
		}
	}
	n.memberID = uint64(m.ID)
	n.initialCluster, n.clusterState = strings.Join(parts, ","), "existing"
	n.state = cluster.Stopped
	c.mu.Unlock()
	c.wipe(n)
	c.log.Info("etcd slot adopts a member added earlier", "node", name, "member", fmt.Sprintf("%x", uint64(m.ID)))
	return uint64(m.ID), c.Start(name)
}
