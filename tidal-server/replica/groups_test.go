package replica_test

// Several raft groups per node: each node opens one WAL and one peer
// transport and runs a replica of every group on them, as a node hosting
// shards does. Real WALs in temporary dirs, real transports on 127.0.0.1.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tidaldb/tidal/tidal-server/peer"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// hostedGroups are the groups every node of a host cluster runs.
var hostedGroups = []uint64{wal.DefaultGroup, 2}

// lateReplica is a group's handler at the transport, bound to the replica
// once it started (the replica needs its transport handle to start). Raft
// ids are node ids in every group here.
type lateReplica struct {
	r atomic.Pointer[replica.Replica]
}

func (l *lateReplica) Receive(ctx context.Context, data []byte) error {
	if r := l.r.Load(); r != nil {
		return r.Receive(ctx, data)
	}
	return nil // not started yet: raft retransmits
}

func (l *lateReplica) ReportUnreachable(id uint64) {
	if r := l.r.Load(); r != nil {
		r.ReportUnreachable(id)
	}
}

func (l *lateReplica) ReportSnapshot(id uint64, ok bool) {
	if r := l.r.Load(); r != nil {
		r.ReportSnapshot(id, ok)
	}
}

func (l *lateReplica) MemberStatus(id uint64) (current, removed bool) {
	if r := l.r.Load(); r != nil {
		return r.MemberStatus(id)
	}
	return false, false
}

func (l *lateReplica) ReportRemoved(by uint64) {
	if r := l.r.Load(); r != nil {
		r.ReportRemoved(by)
	}
}

func (l *lateReplica) NodeOf(id uint64) (uint64, bool) { return id, true }

// hostNode is one node: its WAL, its transport and one replica per group.
type hostNode struct {
	id   uint64
	dir  string
	addr string
	reg  *prometheus.Registry
	w    *wal.WAL
	tr   *peer.Transport
	reps map[uint64]*replica.Replica
	sms  map[uint64]*listSM
}

type hostCluster struct {
	t     *testing.T
	peers []replica.Member
	nodes map[uint64]*hostNode
	logs  *logBuffer
}

func newHostCluster(t *testing.T, n int) *hostCluster {
	t.Helper()
	c := &hostCluster{t: t, nodes: map[uint64]*hostNode{}, logs: &logBuffer{}}
	// Listen first: every node's address is in every node's --peers.
	lis := map[uint64]net.Listener{}
	for id := uint64(1); id <= uint64(n); id++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis[id] = l
		c.peers = append(c.peers, replica.Member{ID: id, PeerAddr: l.Addr().String()})
		c.nodes[id] = &hostNode{id: id, dir: t.TempDir(), addr: l.Addr().String()}
	}
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			c.stop(nd.id)
		}
		if t.Failed() {
			t.Logf("replica logs (newest last):\n%s", c.logs.String())
		}
	})
	for id := uint64(1); id <= uint64(n); id++ {
		c.start(id, lis[id])
	}
	return c
}

// start opens node id's WAL and transport and starts a replica of every
// hosted group on them, on the same data dir as before, with fresh state
// machines. lis is nil on a restart: the node listens on its address again.
func (c *hostCluster) start(id uint64, lis net.Listener) {
	c.t.Helper()
	nd := c.nodes[id]
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", nd.addr); err != nil {
			c.t.Fatalf("node %d: listen on %s again: %v", id, nd.addr, err)
		}
	}
	log := slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", id)
	nd.reg = prometheus.NewRegistry()
	w, rec, err := wal.Open(filepath.Join(nd.dir, "wal"), wal.Options{SegmentSize: 1 << 20, Metrics: wal.NewMetrics(nd.reg), Logger: log})
	if err != nil {
		c.t.Fatalf("node %d: open WAL: %v", id, err)
	}
	nd.w = w
	handlers := map[uint64]*lateReplica{}
	for _, g := range hostedGroups {
		handlers[g] = &lateReplica{}
	}
	all := map[uint64]bool{}
	for _, p := range c.peers {
		all[p.ID] = true
	}
	tr, err := peer.New(id, handlers[wal.DefaultGroup], peer.Options{
		SpoolDir: filepath.Join(nd.dir, "spool"),
		Membership: func(id uint64) peer.MemberStatus {
			if all[id] {
				return peer.MemberCurrent
			}
			return peer.MemberUnknown
		},
	}, nil, log.With("component", "peer"))
	if err != nil {
		c.t.Fatalf("node %d: transport: %v", id, err)
	}
	go tr.Serve(lis)
	nd.tr = tr
	nd.reps, nd.sms = map[uint64]*replica.Replica{}, map[uint64]*listSM{}
	for _, g := range hostedGroups {
		var transport replica.Transport = tr
		if g != wal.DefaultGroup {
			transport = tr.Register(g, handlers[g])
		}
		cfg := replica.Config{
			ID: id, Peers: c.peers, DataDir: nd.dir,
			Log:            w.Group(g),
			TickInterval:   10 * time.Millisecond,
			ElectionTicks:  10,
			HeartbeatTicks: 1,
			Transport:      transport,
			StateMachine:   &listSM{},
			Logger:         log.With("group", g),
			Metrics:        replica.NewGroupMetrics(nd.reg, g),
		}
		if gr, ok := rec.Groups[g]; ok {
			cfg.Recovered = &gr
		}
		if g != wal.DefaultGroup {
			// Snapshot often: the group restarts from a snapshot in its
			// own dir and compacts its part of the shared WAL.
			cfg.SnapshotEvery, cfg.SnapshotCatchUp = 20, 5
		}
		r, err := replica.Start(cfg)
		if err != nil {
			c.t.Fatalf("node %d: start group %d: %v", id, g, err)
		}
		nd.reps[g], nd.sms[g] = r, cfg.StateMachine.(*listSM)
		handlers[g].r.Store(r)
	}
}

// stop stops node id's replicas, then its WAL (the node's, closed after
// every group on it stopped), then its transport. No-op if it is down.
func (c *hostCluster) stop(id uint64) {
	nd := c.nodes[id]
	if nd.w == nil {
		return
	}
	for g, r := range nd.reps {
		if err := r.Stop(); err != nil {
			c.t.Errorf("node %d: stop group %d: %v", id, g, err)
		}
	}
	if err := nd.w.Close(); err != nil {
		c.t.Errorf("node %d: close WAL: %v", id, err)
	}
	nd.tr.Stop()
	nd.w, nd.tr, nd.reps = nil, nil, nil
}

// propose proposes payload to group through node id until it is applied
// there. It retries an unknown outcome as a client does: a proposal a
// follower forwarded to a leader that just stopped is lost, and its
// proposer hears only its deadline. A payload may then be applied twice,
// which no check here minds.
func (c *hostCluster) propose(id, group uint64, payload string) replica.Applied {
	c.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		a, err := c.nodes[id].reps[group].Propose(ctx, []byte(payload))
		cancel()
		switch {
		case err == nil:
			return a
		case !retryable(err) && !errors.Is(err, replica.ErrUnknownOutcome):
			c.t.Fatalf("propose %q to group %d on node %d: %v", payload, group, id, err)
		case time.Now().After(deadline):
			c.t.Fatalf("propose %q to group %d on node %d: still failing after 2m: %v", payload, group, id, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitApplied waits until every running node applied payload in group.
func (c *hostCluster) waitApplied(group uint64, payload string) {
	c.t.Helper()
	waitFor(c.t, time.Minute, fmt.Sprintf("%q applied in group %d on every node", payload, group), func() (bool, string) {
		for id, nd := range c.nodes {
			if nd.w == nil {
				continue
			}
			if _, ok := nd.sms[group].has(payload); !ok {
				return false, fmt.Sprintf("node %d has not applied it (applied %d)", id, nd.reps[group].Applied())
			}
		}
		return true, ""
	})
}

// Three nodes, each hosting groups 1 and 2 on one WAL and one transport:
// each group commits and applies its own writes only; under concurrent
// load on both groups a node's WAL syncs fewer times than it writes
// batches; a node closed and reopened recovers both groups from its one
// WAL (group 2 from a snapshot in its own dir), and both go on committing.
func TestGroupsShareNodeWALAndTransport(t *testing.T) {
	c := newHostCluster(t, 3)

	for _, g := range hostedGroups {
		c.propose(1, g, fmt.Sprintf("g%d-first", g))
	}
	for _, g := range hostedGroups {
		c.waitApplied(g, fmt.Sprintf("g%d-first", g))
	}

	// Concurrent load on both groups, from every node.
	before := map[uint64]wal.Stats{}
	for id, nd := range c.nodes {
		before[id] = nd.w.Stats()
	}
	const perWriter = 30
	var wg sync.WaitGroup
	for id := range c.nodes {
		for _, g := range hostedGroups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWriter {
					c.propose(id, g, fmt.Sprintf("g%d-n%d-%d", g, id, i))
				}
			}()
		}
	}
	wg.Wait()
	for id := range c.nodes {
		for _, g := range hostedGroups {
			c.waitApplied(g, fmt.Sprintf("g%d-n%d-%d", g, id, perWriter-1))
		}
	}
	for id, nd := range c.nodes {
		st, b := nd.w.Stats(), before[id]
		fsyncs, batches := st.Fsyncs-b.Fsyncs, st.Batches-b.Batches
		t.Logf("node %d under load: %d batches (both groups), %d fdatasyncs", id, batches, fsyncs)
		if fsyncs >= batches {
			t.Errorf("node %d: %d fdatasyncs for %d batches of two groups; expected fewer (one sync covers every group's queued batches)", id, fsyncs, batches)
		}
	}

	// Independence: a group applies its own payloads and no other's.
	for id, nd := range c.nodes {
		for _, g := range hostedGroups {
			for _, e := range nd.sms[g].state().Entries {
				var eg uint64
				if _, err := fmt.Sscanf(e.Data, "g%d-", &eg); err != nil || eg != g {
					t.Fatalf("node %d group %d applied %q at %d: expected group %d's payloads only", id, g, e.Data, e.Index, g)
				}
			}
		}
	}

	// Every group's metrics in one registry per node, told apart by label.
	mfs, err := c.nodes[1].reg.Gather()
	if err != nil {
		t.Fatalf("gather node 1's metrics: %v", err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "tidal_raft_applied_index" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "group" {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	if !seen["1"] || !seen["2"] {
		t.Errorf("tidal_raft_applied_index series by group on node 1: %v; expected groups 1 and 2", seen)
	}

	// Layout: group 1 where a node of one group keeps its files, group 2
	// under groups/2, one WAL.
	dir := c.nodes[3].dir
	for _, p := range []string{"wal", "snap", "request-epoch", "groups/2/snap", "groups/2/request-epoch"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("node 3's data dir: expected %s: %v", p, err)
		}
	}
	if snaps, _ := filepath.Glob(filepath.Join(dir, "groups", "2", "snap", "*.snap")); len(snaps) == 0 {
		t.Errorf("node 3: no snapshot of group 2 in groups/2/snap (snapshot every 20 entries, %d applied)", c.nodes[3].reps[2].Applied())
	}

	// Close node 3 and reopen it: both groups come back from the one WAL.
	applied := map[uint64]uint64{}
	for _, g := range hostedGroups {
		applied[g] = c.nodes[3].reps[g].Applied()
	}
	c.stop(3)
	// What the server reads from a stopped node's data dir before it
	// starts — format headers, the stored membership its --peers check
	// compares — reads the shared WAL (group 1's part) and every group's
	// snapshots.
	if err := replica.CheckDataDirFormat(dir); err != nil {
		t.Errorf("CheckDataDirFormat of node 3's data dir: %v", err)
	}
	if sc, err := replica.ReadStoredConfig(dir); err != nil || len(sc.Members) != 3 || len(sc.Voters) != 3 {
		t.Errorf("ReadStoredConfig of node 3's data dir: %+v, %v; expected group 1's 3 voters", sc, err)
	}
	for _, g := range hostedGroups {
		c.propose(1, g, fmt.Sprintf("g%d-while-3-down", g))
	}
	c.start(3, nil)
	for _, g := range hostedGroups {
		r := c.nodes[3].reps[g]
		waitFor(t, time.Minute, fmt.Sprintf("node 3 group %d back to applied index %d", g, applied[g]), func() (bool, string) {
			return r.Applied() >= applied[g], fmt.Sprintf("applied %d", r.Applied())
		})
		c.waitApplied(g, fmt.Sprintf("g%d-while-3-down", g))
		c.propose(3, g, fmt.Sprintf("g%d-after-restart", g))
	}
	for _, g := range hostedGroups {
		c.waitApplied(g, fmt.Sprintf("g%d-after-restart", g))
	}
	if restores, _ := c.nodes[3].sms[2].counts(); restores == 0 {
		t.Errorf("node 3 group 2 restarted without restoring a snapshot; expected it to start from the one in groups/2/snap")
	}
	// The groups' logs replicate the same state everywhere.
	for _, g := range hostedGroups {
		want := c.nodes[1].sms[g].state()
		for _, id := range []uint64{2, 3} {
			r := c.nodes[id].reps[g]
			waitFor(t, time.Minute, fmt.Sprintf("node %d group %d at node 1's applied index %d", id, g, want.Applied), func() (bool, string) {
				return r.Applied() >= want.Applied, fmt.Sprintf("applied %d", r.Applied())
			})
		}
	}
}
