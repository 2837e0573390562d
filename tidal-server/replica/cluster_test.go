package replica_test

// The in-process harness: N real replicas (real WAL, real fsync, each in
// its own t.TempDir) joined by a fake transport made of channels and
// goroutines. The fake transport can cut any directed link (partitions),
// delay, reorder and lose messages, and it records every MsgSnap it carried
// and every ReportSnapshot it made, so tests can tell a snapshot catch-up
// from a log catch-up.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// ---------------------------------------------------------------------
// State machine

// listSM is the simplest deterministic state machine: the list of applied
// payloads with their indexes, and a running SHA-256 over (index, payload)
// so two replicas agree on order, not merely on content.
type listSM struct {
	mu       sync.Mutex
	st       smState
	restores int // Restore calls this incarnation
	applies  int // Apply calls this incarnation (entries, batched or not)
	batches  int // ApplyBatch calls this incarnation
	packed   int // commands applied from packed entries (Subs > 1)
	// packFormats counts the commands applied from packed entries by
	// the entry format of their envelope (AppEntry.PackFormat).
	packFormats map[uint32]int
	// views makes CaptureSnapshot answer (replica.SnapshotCapturer); without
	// it the replica calls Snapshot. encode, when set, runs wherever the
	// state is encoded (Snapshot, or the captured encoder): a large state
	// that takes as long to encode as the test says.
	views  bool
	encode func()
}

type smState struct {
	Entries []smEntry `json:"entries"`
	Digest  string    `json:"digest"` // hex; "" before the first Apply
	Applied uint64    `json:"applied"`
}

type smEntry struct {
	Index uint64 `json:"index"`
	Data  string `json:"data"`
}

func (s *listSM) Apply(index, term uint64, data []byte) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(index, 0, data)
}

// ApplyBatch makes listSM a replica.BatchStateMachine, so every replica
// test runs the batched apply path for runs of
// entries and the single-entry path for the rest.
func (s *listSM) ApplyBatch(entries []replica.AppEntry) []any {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches++
	out := make([]any, len(entries))
	for i, e := range entries {
		out[i] = s.applyLocked(e.Index, e.Sub, e.Data)
		if e.Subs > 1 {
			s.packed++
			if s.packFormats == nil {
				s.packFormats = map[uint32]int{}
			}
			s.packFormats[e.PackFormat]++
		}
	}
	return out
}

func (s *listSM) applyLocked(index uint64, sub int, data []byte) any {
	// A packed entry's later commands share its index (Sub > 0).
	if index < s.st.Applied || index == s.st.Applied && sub == 0 {
		panic(fmt.Sprintf("Apply(%d) after applied %d: entries must be applied once, in order", index, s.st.Applied))
	}
	prev, _ := hex.DecodeString(s.st.Digest)
	h := sha256.New()
	h.Write(prev)
	fmt.Fprintf(h, "%d:", index)
	h.Write(data)
	s.st.Digest = hex.EncodeToString(h.Sum(nil))
	s.st.Entries = append(s.st.Entries, smEntry{Index: index, Data: string(data)})
	s.st.Applied = index
	s.applies++
	return len(s.st.Entries)
}

func (s *listSM) SetApplied(index uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if index <= s.st.Applied {
		panic(fmt.Sprintf("SetApplied(%d) after applied %d", index, s.st.Applied))
	}
	s.st.Applied = index
}

func (s *listSM) Snapshot(w io.Writer) error {
	if s.encode != nil {
		s.encode()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return json.NewEncoder(w).Encode(&s.st)
}

// CaptureSnapshot captures the state by encoding it (listSM is small);
// the encoder it returns runs the encode hook, then writes those bytes.
// Without views it answers nil: the replica calls Snapshot.
func (s *listSM) CaptureSnapshot() (func(io.Writer) error, error) {
	if !s.views {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(&s.st); err != nil {
		return nil, err
	}
	hook := s.encode
	return func(w io.Writer) error {
		if hook != nil {
			hook()
		}
		_, err := w.Write(b.Bytes())
		return err
	}, nil
}

func (s *listSM) Restore(r io.Reader) error {
	var st smState
	if err := json.NewDecoder(r).Decode(&st); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = st
	s.restores++
	return nil
}

func (s *listSM) state() smState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Entries = append([]smEntry(nil), s.st.Entries...)
	return st
}

func (s *listSM) counts() (restores, applies int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.restores, s.applies
}

// has reports whether payload was applied, and at which index.
func (s *listSM) has(payload string) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.st.Entries {
		if e.Data == payload {
			return e.Index, true
		}
	}
	return 0, false
}

// ---------------------------------------------------------------------
// Fake transport

type link struct{ from, to uint64 }

type linkFaults struct {
	delay, jitter time.Duration
	loss          float64 // probability a message is dropped
	reorder       bool    // deliver each message on its own timer, so later ones overtake
	// dropAppends drops log replication (MsgApp, MsgSnap) and delivers the
	// rest: the receiver keeps hearing the leader's heartbeats, so it keeps
	// its leader and forwards proposals to it, but it falls behind — the
	// lagging follower, without depending on timing.
	dropAppends bool
}

type queued struct {
	ep *endpoint // the sending incarnation
	m  replica.Outbound
	at time.Time // when Send took it
	// watched: an append on the watched link, counted in appendsPending
	// until delivered or dropped.
	watched bool
}

type snapReport struct {
	from, to uint64
	ok       bool
}

// network connects the replicas of one test. Faults are looked up when a
// message is delivered, not when it is sent, so a partition also catches
// what was already in flight.
type network struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	nodes     map[uint64]*replica.Replica // running incarnations; absent = down
	cut       map[link]bool
	faults    map[link]linkFaults
	queues    map[link]chan queued
	rng       *rand.Rand
	snapsSent map[link]int
	reports   []snapReport
	formats   map[uint64]uint32 // advertised entry formats (setEntryFormat)
	// snapHold, while set, keeps every Send of a MsgSnap waiting inside
	// the transport until it is closed (holdSnapshotSends): a sender
	// that does the expensive part of a snapshot send on the Ready loop
	// then holds up the Ready loop.
	snapHold  chan struct{}
	snapHeld  atomic.Int64 // Sends of a MsgSnap that waited on snapHold
	delivered atomic.Uint64
	dropped   atomic.Uint64
	// watch, once set (watchAppends), is the link whose appends are
	// counted: bytes sent and not yet delivered or dropped, and the most
	// there ever were.
	watch                     link
	appendsPending, appendMax atomic.Int64
}

// watchAppends starts counting the bytes of appends on from->to that are
// in flight in the network (sent, not yet delivered or dropped).
func (n *network) watchAppends(from, to uint64) {
	n.mu.Lock()
	n.watch = link{from, to}
	n.mu.Unlock()
}

// appendBytesInFlightMax is the most append bytes the watched link ever
// held at once.
func (n *network) appendBytesInFlightMax() int64 { return n.appendMax.Load() }

func newNetwork(seed uint64) *network {
	ctx, cancel := context.WithCancel(context.Background())
	return &network{
		ctx: ctx, cancel: cancel,
		nodes:     map[uint64]*replica.Replica{},
		cut:       map[link]bool{},
		faults:    map[link]linkFaults{},
		queues:    map[link]chan queued{},
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		snapsSent: map[link]int{},
		formats:   map[uint64]uint32{},
	}
}

// close stops every delivery goroutine and waits for them.
func (n *network) close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.wg.Wait()
}

// setEntryFormat makes node id advertise entry format f (PeerEntryFormat);
// by default an attached node advertises this build's.
func (n *network) setEntryFormat(id uint64, f uint32) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.formats[id] = f
}

// PeerEntryFormat makes the fake transport a replica.PeerFormats, as the
// real one is: what peer id advertises.
func (e *endpoint) PeerEntryFormat(id uint64) (uint32, bool) {
	e.net.mu.Lock()
	defer e.net.mu.Unlock()
	if f, ok := e.net.formats[id]; ok {
		return f, true
	}
	if _, up := e.net.nodes[id]; up {
		return replica.EntryFormat, true
	}
	return 0, false
}

func (n *network) attach(id uint64, r *replica.Replica) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[id] = r
}

func (n *network) detach(id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nodes, id)
}

// partition cuts every link between the groups, both ways; links inside a
// group are left as they are.
func (n *network) partition(groups ...[]uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, a := range groups {
		for j, b := range groups {
			if i == j {
				continue
			}
			for _, x := range a {
				for _, y := range b {
					n.cut[link{x, y}] = true
				}
			}
		}
	}
}

// cutLink drops everything from -> to (one way).
func (n *network) cutLink(from, to uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[link{from, to}] = true
}

func (n *network) heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = map[link]bool{}
	n.faults = map[link]linkFaults{}
}

func (n *network) setFaults(from, to uint64, f linkFaults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults[link{from, to}] = f
}

func (n *network) snapshotsSent(from, to uint64) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.snapsSent[link{from, to}]
}

// holdSnapshotSends makes every later Send of a MsgSnap wait in the
// transport until release is called; the network's close releases it too.
func (n *network) holdSnapshotSends() (release func()) {
	hold := make(chan struct{})
	n.mu.Lock()
	n.snapHold = hold
	n.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			n.mu.Lock()
			n.snapHold = nil
			n.mu.Unlock()
			close(hold)
		})
	}
}

func (n *network) snapshotReports() []snapReport {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]snapReport(nil), n.reports...)
}

func (n *network) enqueue(ep *endpoint, m replica.Outbound) {
	l := link{ep.id, m.To}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return
	}
	if m.Snapshot {
		n.snapsSent[l]++
	}
	if hold := n.snapHold; m.Snapshot && hold != nil {
		n.mu.Unlock()
		n.snapHeld.Add(1)
		select {
		case <-hold:
		case <-n.ctx.Done():
			return
		}
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return
		}
	}
	q, ok := n.queues[l]
	if !ok {
		q = make(chan queued, 4096)
		n.queues[l] = q
		n.wg.Add(1)
		go n.runLink(l, q)
	}
	watched := l == n.watch && isAppend(m.Data)
	n.mu.Unlock()
	if watched {
		now := n.appendsPending.Add(int64(len(m.Data)))
		for max := n.appendMax.Load(); now > max && !n.appendMax.CompareAndSwap(max, now); max = n.appendMax.Load() {
		}
	}
	select {
	case q <- queued{ep: ep, m: m, at: time.Now(), watched: watched}:
	default:
		// A full queue drops, as the real transport does; raft retransmits.
		if watched {
			n.appendsPending.Add(-int64(len(m.Data)))
		}
		n.dropped.Add(1)
		n.report(ep, m, false)
	}
}

func (n *network) runLink(l link, q chan queued) {
	defer n.wg.Done()
	// A delay is latency, not a rate limit: each message is due at the time
	// it was sent plus the delay, and in FIFO mode no message is due before
	// the one ahead of it.
	var lastDue time.Time
	for {
		select {
		case <-n.ctx.Done():
			return
		case item := <-q:
			n.mu.Lock()
			f := n.faults[l]
			due := item.at.Add(f.delay)
			if f.jitter > 0 {
				due = due.Add(time.Duration(n.rng.Int64N(int64(f.jitter))))
			}
			n.mu.Unlock()
			if f.reorder {
				n.wg.Add(1)
				go func() {
					defer n.wg.Done()
					if n.sleep(time.Until(due)) {
						n.deliver(l, item)
					}
				}()
				continue
			}
			if due.Before(lastDue) {
				due = lastDue
			}
			lastDue = due
			if n.sleep(time.Until(due)) {
				n.deliver(l, item)
			}
		}
	}
}

// sleep waits d; false if the network closed first.
func (n *network) sleep(d time.Duration) bool {
	if d <= 0 {
		return n.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.ctx.Done():
		return false
	}
}

func (n *network) deliver(l link, item queued) {
	if item.watched {
		defer n.appendsPending.Add(-int64(len(item.m.Data)))
	}
	n.mu.Lock()
	dst := n.nodes[l.to]
	drop := n.cut[l] || dst == nil
	f := n.faults[l]
	if !drop && f.loss > 0 && n.rng.Float64() < f.loss {
		drop = true
	}
	n.mu.Unlock()
	if !drop && f.dropAppends {
		drop = isAppend(item.m.Data)
	}
	if drop {
		n.dropped.Add(1)
		n.report(item.ep, item.m, false)
		return
	}
	// As the peer plane does: a member refuses a removed sender and tells
	// it so (the leader stops sending to a removed node, which may never
	// apply its own removal and would campaign on forever).
	if _, removed := dst.MemberStatus(l.from); removed {
		n.dropped.Add(1)
		if src := item.ep.replica.Load(); src != nil {
			src.ReportRemoved(l.to)
		}
		return
	}
	if err := dst.Receive(n.ctx, item.m.Data); err != nil {
		n.dropped.Add(1)
		n.report(item.ep, item.m, false)
		return
	}
	n.delivered.Add(1)
	if item.m.Snapshot {
		n.report(item.ep, item.m, true)
	}
}

// isAppend reports whether a marshalled raft message replicates the log.
func isAppend(data []byte) bool {
	m := &raftpb.Message{}
	if err := proto.Unmarshal(data, m); err != nil {
		return false
	}
	return m.GetType() == raftpb.MsgApp || m.GetType() == raftpb.MsgSnap
}

// report tells the sender how a message fared, as the real transport does:
// ReportSnapshot for every MsgSnap, ReportUnreachable for a lost message.
func (n *network) report(ep *endpoint, m replica.Outbound, ok bool) {
	src := ep.replica.Load()
	if src == nil {
		return
	}
	if m.Snapshot {
		n.mu.Lock()
		n.reports = append(n.reports, snapReport{ep.id, m.To, ok})
		n.mu.Unlock()
		src.ReportSnapshot(m.To, ok)
	}
	if !ok {
		src.ReportUnreachable(m.To)
	}
}

// endpoint is one incarnation's replica.Transport.
type endpoint struct {
	net     *network
	id      uint64
	replica atomic.Pointer[replica.Replica]

	mu    sync.Mutex
	peers map[uint64]string
}

var _ replica.Transport = (*endpoint)(nil)

func (e *endpoint) Send(msgs []replica.Outbound) {
	for _, m := range msgs {
		e.mu.Lock()
		_, known := e.peers[m.To]
		e.mu.Unlock()
		if !known {
			// The real transport has no sender for an unknown peer either.
			e.net.dropped.Add(1)
			e.net.report(e, m, false)
			continue
		}
		e.net.enqueue(e, m)
	}
}

func (e *endpoint) SetPeer(id uint64, addr string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.peers[id] = addr
}

func (e *endpoint) RemovePeer(id uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.peers, id)
}

func (e *endpoint) peerAddr(id uint64) (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	a, ok := e.peers[id]
	return a, ok
}

// ---------------------------------------------------------------------
// Cluster

type testNode struct {
	id  uint64
	dir string
	sm  *listSM
	r   *replica.Replica
	ep  *endpoint
}

type cluster struct {
	t     testing.TB
	net   *network
	cfg   replica.Config // template
	peers []replica.Member
	nodes map[uint64]*testNode
	logs  *logBuffer
	// setupSM, when set, adjusts each node's state machine as it starts.
	setupSM func(*listSM)
}

func peerAddr(id uint64) string { return fmt.Sprintf("fake-%d", id) }

// newCluster starts voters 1..n. mutate adjusts the config template before
// any node starts. Stop, network shutdown and the goroutine-leak check are
// registered as cleanups.
func newCluster(t testing.TB, n int, mutate func(*replica.Config)) *cluster {
	t.Helper()
	checkNoGoroutineLeak(t)
	logs := &logBuffer{}
	c := &cluster{
		t:   t,
		net: newNetwork(uint64(len(t.Name())) * 7919),
		cfg: replica.Config{
			TickInterval:   10 * time.Millisecond,
			ElectionTicks:  10,
			HeartbeatTicks: 1,
			WAL:            wal.Options{SegmentSize: 1 << 20},
			Logger:         slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		},
		nodes: map[uint64]*testNode{},
		logs:  logs,
	}
	if mutate != nil {
		mutate(&c.cfg)
	}
	for id := uint64(1); id <= uint64(n); id++ {
		c.peers = append(c.peers, replica.Member{ID: id, PeerAddr: peerAddr(id)})
	}
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			if nd.r != nil {
				c.net.detach(nd.id)
				nd.r.Stop()
				nd.r = nil
			}
		}
		c.net.close()
		if t.Failed() {
			t.Logf("replica logs (newest last):\n%s", logs.String())
		}
	})
	for id := uint64(1); id <= uint64(n); id++ {
		c.start(id, false)
	}
	return c
}

// start starts (or restarts, on the same data dir) node id with a fresh
// state machine, which the replica must rebuild from its snapshot and WAL.
func (c *cluster) start(id uint64, join bool) *testNode {
	c.t.Helper()
	return c.startWith(id, join, nil)
}

// startWith is start with mutate applied to this node's config.
func (c *cluster) startWith(id uint64, join bool, mutate func(*replica.Config)) *testNode {
	c.t.Helper()
	nd, ok := c.nodes[id]
	if !ok {
		nd = &testNode{id: id, dir: c.t.TempDir()}
		c.nodes[id] = nd
		// Cleanups run last-registered first: this one, registered after
		// TempDir's, stops the node before its directory is removed. The
		// cluster's own cleanup (registered before any TempDir) came too
		// late, and a node still writing a snapshot made RemoveAll fail.
		c.t.Cleanup(func() {
			if nd.r != nil {
				c.net.detach(nd.id)
				nd.r.Stop()
				nd.r = nil
			}
		})
	}
	if nd.r != nil {
		c.t.Fatalf("start node %d: already running", id)
	}
	nd.sm = &listSM{}
	if c.setupSM != nil {
		c.setupSM(nd.sm)
	}
	nd.ep = &endpoint{net: c.net, id: id, peers: map[uint64]string{}}
	cfg := c.cfg
	cfg.ID = id
	cfg.DataDir = nd.dir
	cfg.Peers = c.peers
	cfg.Join = join
	cfg.Transport = nd.ep
	cfg.StateMachine = nd.sm
	cfg.Logger = cfg.Logger.With("node", id)
	if mutate != nil {
		mutate(&cfg)
	}
	r, err := replica.Start(cfg)
	if err != nil {
		c.t.Fatalf("start node %d: %v", id, err)
	}
	nd.r = r
	nd.ep.replica.Store(r)
	c.net.attach(id, r)
	return nd
}

// stop stops node id; its messages are dropped from now on.
func (c *cluster) stop(id uint64) {
	c.t.Helper()
	nd := c.nodes[id]
	c.net.detach(id)
	if err := nd.r.Stop(); err != nil {
		c.t.Logf("stop node %d: %v", id, err)
	}
	nd.r = nil
}

func (c *cluster) node(id uint64) *testNode {
	c.t.Helper()
	nd, ok := c.nodes[id]
	if !ok || nd.r == nil {
		c.t.Fatalf("node %d is not running", id)
	}
	return nd
}

func (c *cluster) running() []uint64 {
	var ids []uint64
	for id := uint64(1); id <= uint64(len(c.nodes))+8; id++ {
		if nd, ok := c.nodes[id]; ok && nd.r != nil {
			ids = append(ids, id)
		}
	}
	return ids
}

func (c *cluster) propose(id uint64, payload string, timeout time.Duration) (replica.Applied, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return c.node(id).r.Propose(ctx, []byte(payload))
}

// retryable reports whether err says the request was certainly not made
// and may be retried as is: no leader (an election, perhaps a spurious one
// on a loaded machine), overload, a membership change dropped by raft.
func retryable(err error) bool {
	return errors.Is(err, replica.ErrNoLeader) || errors.Is(err, replica.ErrOverloaded) || errors.Is(err, replica.ErrConfChangeDropped) ||
		errors.Is(err, replica.ErrTransferInProgress)
}

// retrying calls do until it returns an error that is not retryable, for at
// most 30s, backing off a little between attempts.
func retrying(do func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := do()
		if !retryable(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// proposeRetrying proposes on id, retrying only the errors that say the
// write was certainly not made.
func (c *cluster) proposeRetrying(id uint64, payload string, timeout time.Duration) (replica.Applied, error) {
	var a replica.Applied
	err := retrying(func() (err error) {
		a, err = c.propose(id, payload, timeout)
		return err
	})
	return a, err
}

// mustPropose is proposeRetrying that fails the test on any other error.
func (c *cluster) mustPropose(id uint64, payload string) replica.Applied {
	c.t.Helper()
	a, err := c.proposeRetrying(id, payload, 30*time.Second)
	if err != nil {
		c.t.Fatalf("propose %q on node %d: %v", payload, id, err)
	}
	return a
}

// mustAddMember adds member id (a learner) through node via, retrying
// while raft drops the change or no leader is known.
func (c *cluster) mustAddMember(via, id uint64) {
	c.t.Helper()
	err := retrying(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return c.node(via).r.AddMember(ctx, replica.Member{ID: id, PeerAddr: peerAddr(id)})
	})
	if err != nil {
		c.t.Fatalf("AddMember(%d) through node %d: %v", id, via, err)
	}
}

// waitFor polls cond until it holds or timeout passes; cond describes what
// it saw so a timeout says what was expected and what was found.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, seen := cond()
		if ok {
			return
		}
		last = seen
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; last seen: %s", timeout, what, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// durableIndex is the leader id's own durable last index, as its raft
// progress shows it.
func durableIndex(c *cluster, id uint64) uint64 {
	for _, m := range c.node(id).r.Status().Members {
		if m.ID == id {
			return m.Match
		}
	}
	return 0
}

// waitPromotionRounds waits until the current leader has run n learner
// promotion rounds from now.
func waitPromotionRounds(t testing.TB, c *cluster, n uint64) {
	t.Helper()
	lead := c.waitLeader()
	r := c.node(lead).r
	base := replica.PromotionRounds(r)
	waitFor(t, 30*time.Second, fmt.Sprintf("%d promotion rounds on leader %d", n, lead), func() (bool, string) {
		got := replica.PromotionRounds(r) - base
		return got >= n, fmt.Sprintf("%d rounds", got)
	})
}

// waitLeader waits until every node in ids names the same leader, which is
// one of ids and sees itself as leader; it returns that leader.
func (c *cluster) waitLeader(ids ...uint64) uint64 {
	c.t.Helper()
	if len(ids) == 0 {
		ids = c.running()
	}
	var lead uint64
	waitFor(c.t, 30*time.Second, fmt.Sprintf("one leader among %v", ids), func() (bool, string) {
		var seen []string
		lead = 0
		agree := true
		for _, id := range ids {
			st := c.node(id).r.Status()
			seen = append(seen, fmt.Sprintf("%d:lead=%d,role=%s,term=%d", id, st.Leader, st.Role, st.Term))
			if lead == 0 {
				lead = st.Leader
			}
			agree = agree && st.Leader != 0 && st.Leader == lead
		}
		if !agree || !contains(ids, lead) {
			return false, strings.Join(seen, " ")
		}
		return c.node(lead).r.Status().Role == "leader", strings.Join(seen, " ")
	})
	return lead
}

func contains(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// waitConverged waits until every node in ids has applied the same index,
// equal to the commit index they all report, with equal state digests; it
// returns that state.
func (c *cluster) waitConverged(ids ...uint64) smState {
	c.t.Helper()
	if len(ids) == 0 {
		ids = c.running()
	}
	var st smState
	waitFor(c.t, 60*time.Second, fmt.Sprintf("nodes %v to converge", ids), func() (bool, string) {
		var seen []string
		ok := true
		var first smState
		for i, id := range ids {
			nd := c.node(id)
			s := nd.sm.state()
			rs := nd.r.Status()
			seen = append(seen, fmt.Sprintf("%d:applied=%d,commit=%d,sm=%d,entries=%d,digest=%.8s", id, rs.Applied, rs.Commit, s.Applied, len(s.Entries), s.Digest))
			if i == 0 {
				first = s
			}
			ok = ok && rs.Applied == rs.Commit && s.Applied == rs.Applied && s.Applied == first.Applied && s.Digest == first.Digest
		}
		st = first
		return ok, strings.Join(seen, " ")
	})
	// Equal digests imply equal lists; check anyway, so a digest bug cannot
	// hide a divergence.
	for _, id := range ids {
		got := c.node(id).sm.state()
		if !equalEntries(got.Entries, st.Entries) {
			c.t.Fatalf("node %d: digest equal but entries differ:\n got %v\nwant %v", id, got.Entries, st.Entries)
		}
	}
	return st
}

func equalEntries(a, b []smEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ---------------------------------------------------------------------
// Logs and leaks

// logBuffer keeps the newest replica log lines, to print when a test fails.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

const logBufferMax = 256 << 10

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len()+len(p) > logBufferMax {
		b := l.buf.Bytes()
		keep := append([]byte(nil), b[len(b)/2:]...)
		l.buf.Reset()
		l.buf.Write(keep)
	}
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// checkNoGoroutineLeak records the goroutine count now and, at cleanup
// (after every later cleanup, since cleanups run last-in first-out), waits
// for the count to come back down. Tests in this package do not run in
// parallel, so the count is this test's own.
func checkNoGoroutineLeak(t testing.TB) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := runtime.NumGoroutine()
			if n <= before {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutine leak: %d goroutines before the test, %d five seconds after it stopped everything:\n%s", before, n, buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// walSegments counts the segment files in a node's WAL directory.
func walSegments(t testing.TB, dir string) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "wal", "*.wal"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

func snapFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "snap", "*.snap"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}
