package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Errors a proposer or reader can get. ErrUnknownOutcome is the only one
// after which the write may or may not have been applied; the others mean
// it certainly was not.
var (
	ErrNoLeader       = errors.New("replica: no leader known")
	ErrOverloaded     = errors.New("replica: too many uncommitted proposals")
	ErrUnknownOutcome = errors.New("replica: outcome unknown (deadline passed before the entry was applied here)")
	ErrStopped        = errors.New("replica: stopped")
	ErrFenced         = errors.New("replica: fenced after a failed write to the WAL")
	ErrRemoved        = errors.New("replica: this node was removed from the cluster")
	// ErrConfChangeDropped: raft dropped a membership change because another
	// one was not yet applied (or a new leader had not yet applied its
	// predecessor's log). Certainly not applied; retry shortly.
	ErrConfChangeDropped = errors.New("replica: membership change dropped by raft while another change was pending; it was not applied, retry")
)

// StateMachine is the application state raft replicates. Apply and
// SetApplied are called from one goroutine, in log order; they must be
// deterministic (no clocks, no randomness) because every node applies the
// same entries and must reach the same state.
type StateMachine interface {
	// Apply applies one committed entry's payload. The result is handed to
	// the proposer on this node, if it is waiting.
	Apply(index, term uint64, data []byte) any
	// SetApplied records an entry that carries no application data (raft
	// no-ops, configuration changes).
	SetApplied(index uint64)
	Snapshot(w io.Writer) error
	Restore(r io.Reader) error
}

// BatchStateMachine is a StateMachine that can apply several consecutive
// committed entries in one call (issue 14, build item 2: one lock and one
// pass per raft Ready instead of per entry). ApplyBatch must leave the
// state exactly as calling Apply on each entry in order would, and
// return one result per entry, in order. The replica hands it every run
// of consecutive application entries of one Ready; raft no-ops,
// membership entries and markers still go through SetApplied one by one.
type BatchStateMachine interface {
	StateMachine
	ApplyBatch(entries []AppEntry) []any
}

// AppEntry is one committed entry's application payload. An entry that
// packs several proposals (Config.PackProposals) is handed over as Subs
// AppEntries with the same Index and Term and Sub 0..Subs-1, in order and
// always within one ApplyBatch call; an ordinary entry has Sub 0, Subs 1.
type AppEntry struct {
	Index, Term uint64
	Data        []byte
	Sub, Subs   int
}

// Outbound is one marshalled raft message for the transport.
type Outbound struct {
	To       uint64
	Snapshot bool // a MsgSnap: the sender must call ReportSnapshot when done
	Data     []byte
}

// Transport moves marshalled raft messages between nodes. Send must not
// block on the network: raft retransmits, so a transport that cannot keep
// up drops and calls ReportUnreachable.
type Transport interface {
	Send(msgs []Outbound)
	SetPeer(id uint64, addr string)
	RemovePeer(id uint64)
}

// Config configures a Replica. Zero values take the defaults noted.
type Config struct {
	ID uint64
	// Peers is the initial cluster. It bootstraps raft only when the data
	// dir holds no state and Join is false; otherwise it only seeds the
	// transport's address book until the replicated table takes over.
	Peers []Member
	// Join starts a node that an existing cluster added with
	// /admin/members: it waits to be sent the log instead of bootstrapping.
	Join    bool
	DataDir string
	// DialOverrides maps a peer address as the membership advertises it to
	// the address this node dials instead. The chaos harness routes every
	// directed link through its own relay this way, for members that exist
	// now and for any later member that reuses a slot's address.
	DialOverrides map[string]string

	TickInterval    time.Duration // default 100ms
	ElectionTicks   int           // default 10
	HeartbeatTicks  int           // default 1
	MaxSizePerMsg   uint64        // default 1 MiB
	MaxInflightMsgs int           // replication window; default 256
	// MaxUncommittedBytes bounds what the leader accepts before its log
	// commits; past it proposals fail with ErrOverloaded (503). Default 64 MiB.
	MaxUncommittedBytes uint64
	// PackProposals packs proposals made concurrently on this node into
	// one raft entry (pack.go), while every member reads entry format 2
	// (EntryFormatAllowed). Every node applies packed entries whatever
	// this says. It needs a BatchStateMachine.
	PackProposals   bool
	SnapshotEvery   uint64 // applied entries between snapshots; default 10000
	SnapshotCatchUp uint64 // entries kept after a snapshot for slow followers; default 5000
	// PromoteWithin: a learner is promoted to voter once its match index is
	// within this many entries of the leader's commit. Default 1000.
	PromoteWithin uint64

	WAL          wal.Options
	Transport    Transport // nil: single node, messages are dropped
	StateMachine StateMachine
	Logger       *slog.Logger
	Metrics      *Metrics

	// beforeSnapshotWrite, when set, runs before the file of a snapshot
	// received from the leader is written: tests make the disk slow with it.
	beforeSnapshotWrite func(index uint64)
}

func (c *Config) setDefaults() {
	if c.TickInterval == 0 {
		c.TickInterval = 100 * time.Millisecond
	}
	if c.ElectionTicks == 0 {
		c.ElectionTicks = 10
	}
	if c.HeartbeatTicks == 0 {
		c.HeartbeatTicks = 1
	}
	if c.MaxSizePerMsg == 0 {
		c.MaxSizePerMsg = 1 << 20
	}
	if c.MaxInflightMsgs == 0 {
		c.MaxInflightMsgs = 256
	}
	if c.MaxUncommittedBytes == 0 {
		c.MaxUncommittedBytes = 64 << 20
	}
	if c.SnapshotEvery == 0 {
		c.SnapshotEvery = 10000
	}
	if c.SnapshotCatchUp == 0 {
		c.SnapshotCatchUp = 5000
	}
	if c.PromoteWithin == 0 {
		c.PromoteWithin = 1000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = NewMetrics(nil)
	}
}

// wallClock is the replica's only reading of the wall clock; tests step it.
var wallClock = time.Now

// Applied is what a successful proposal returns: where its entry landed
// and what the state machine said.
type Applied struct {
	Index, Term uint64
	Result      any
}

// Replica is one raft node with its log, snapshots and apply loop.
type Replica struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	node    raft.Node
	storage *raft.MemoryStorage
	wal     *wal.WAL
	snaps   *snapStore
	sm      StateMachine

	ids *requestIDs

	mu        sync.Mutex // guards the fields below
	proposals map[uint64]chan Applied
	reads     map[uint64]chan uint64
	members   *membership
	confState *raftpb.ConfState
	fenceErr  error
	removed   bool
	// While TransferLeader moves leadership away from this node, raft
	// drops every proposal forwarded to it; heldProps keeps them to be
	// stepped once the transfer ends (see holdForwarded). transfers counts
	// the TransferLeader calls under way; it changes under mu and is read
	// without it on the fast path.
	transfers atomic.Int32
	heldProps []*raftpb.Message

	appliedMu      sync.Mutex
	applied        uint64
	appliedTerm    uint64
	appliedWaiters []appliedWaiter

	readies atomic.Uint64 // Readys taken by the Ready loop
	leader  atomic.Uint64
	term    atomic.Uint64
	commit  atomic.Uint64
	role    atomic.Value // raft.StateType

	// snapMu serializes the two writers of snapshot files and WAL marks:
	// the snapshot goroutine (periodic and on-demand snapshots) and the
	// Ready loop (snapshots received from the leader). Marks never go
	// backwards, so each checks snapIndex under it.
	snapMu    sync.Mutex
	snapIndex atomic.Uint64
	snapBusy  atomic.Bool // a periodic snapshot is being written
	// snapForMember asks for a snapshot as soon as possible: a member was
	// added, and the newest snapshot's ConfState does not know it.
	snapForMember atomic.Bool
	prevHS        wal.HardState // last HardState staged; Ready loop only
	confMarker    confMarker    // apply goroutine only
	runScratch    []pendingApp  // apply goroutine only
	pack          packer        // proposals waiting to be packed (PackProposals)
	appScratch    []AppEntry    // apply goroutine only
	snapq         chan snapJob
	promoting     map[uint64]time.Time // guarded by mu
	// laneq takes appends off the Ready loop from one carrying a received
	// snapshot until the lane is empty again; laneBusy counts those handed
	// over and not yet queued for sync.
	laneq    chan *raftpb.Message
	laneBusy atomic.Int64
	// promoteKick wakes the promote goroutine (every 5 ticks).
	promoteKick     chan struct{}
	promotionRounds atomic.Uint64

	// The pipeline (see doc.go): Ready loop (stages WAL batches) -> syncq
	// -> sync goroutine; Ready loop and sync goroutine -> applyq -> apply
	// goroutine -> snapq -> snapshot goroutine. Each queue is FIFO, which
	// is what keeps the order raft asked for.
	syncq       chan syncItem
	applyq      chan applyItem
	snapshotReq chan chan snapshotResult
	stopc       chan struct{} // closed by halt: every goroutine returns
	haltCtx     context.Context
	haltCancel  context.CancelFunc
	haltOnce    sync.Once
	wg          sync.WaitGroup
	done        chan struct{} // closed once every goroutine returned and raft stopped
	stopOnce    sync.Once
}

// syncItem is one MsgStorageAppend on its way to disk: the WAL batch staged
// for it, and what to do once it is durable.
type syncItem struct {
	pending *wal.Pending // nil: nothing to write, only ordering
	entries int
	staged  time.Time
	snap    *raftpb.Snapshot // a received snapshot to install, in apply order
	resps   []*raftpb.Message
}

// applyItem is one MsgStorageApply (committed entries and the responses to
// step once they are applied), or a received snapshot to install.
type applyItem struct {
	ents  []*raftpb.Entry
	resps []*raftpb.Message
	snap  *raftpb.Snapshot
}

type appliedWaiter struct {
	index uint64
	ch    chan struct{}
}

type snapshotResult struct {
	index, term uint64
	err         error
}

// Start opens (or creates) the node's data dir, recovers the newest
// snapshot and the WAL after it, rebuilds the state machine, and starts
// raft and the Ready loop.
func Start(cfg Config) (*Replica, error) {
	cfg.setDefaults()
	if cfg.ID == 0 {
		return nil, errors.New("replica: node id must be > 0")
	}
	if cfg.StateMachine == nil {
		return nil, errors.New("replica: no state machine")
	}
	if _, ok := cfg.StateMachine.(BatchStateMachine); cfg.PackProposals && !ok {
		return nil, errors.New("replica: PackProposals needs a state machine that implements BatchStateMachine")
	}
	r := &Replica{
		cfg:         cfg,
		log:         cfg.Logger,
		metrics:     cfg.Metrics,
		storage:     raft.NewMemoryStorage(),
		sm:          cfg.StateMachine,
		proposals:   map[uint64]chan Applied{},
		reads:       map[uint64]chan uint64{},
		members:     newMembership(),
		confState:   &raftpb.ConfState{},
		promoting:   map[uint64]time.Time{},
		snapshotReq: make(chan chan snapshotResult),
		syncq:       make(chan syncItem, pipelineDepth),
		applyq:      make(chan applyItem, pipelineDepth),
		snapq:       make(chan snapJob, 2),
		laneq:       make(chan *raftpb.Message, pipelineDepth),
		promoteKick: make(chan struct{}, 1),
		stopc:       make(chan struct{}),
		done:        make(chan struct{}),
	}
	r.haltCtx, r.haltCancel = context.WithCancel(context.Background())
	r.role.Store(raft.StateFollower)

	var err error
	if r.snaps, err = newSnapStore(filepath.Join(cfg.DataDir, "snap"), cfg.Logger); err != nil {
		return nil, err
	}
	// Before raft starts: no id may be handed out from an epoch an earlier
	// incarnation of this node used (requestid.go).
	if r.ids, err = openRequestIDs(cfg.DataDir); err != nil {
		return nil, err
	}
	walOpts := cfg.WAL
	if walOpts.Logger == nil {
		walOpts.Logger = cfg.Logger
	}
	w, rec, err := wal.Open(filepath.Join(cfg.DataDir, "wal"), walOpts)
	if err != nil {
		return nil, err
	}
	r.wal = w
	fresh := rec.Snapshot.Index == 0 && rec.HardState == (wal.HardState{}) && len(rec.Entries) == 0

	if rec.Snapshot.Index > 0 {
		snap, err := r.snaps.load(rec.Snapshot.Term, rec.Snapshot.Index)
		if err != nil {
			w.Close()
			return nil, err
		}
		if err := r.restoreSnapshot(snap); err != nil {
			w.Close()
			return nil, err
		}
		if err := r.storage.ApplySnapshot(snap); err != nil {
			w.Close()
			return nil, fmt.Errorf("replica: load snapshot into raft storage: %w", err)
		}
		r.snapIndex.Store(rec.Snapshot.Index)
	}
	if !fresh {
		hs := rec.HardState
		if err := r.storage.SetHardState(&raftpb.HardState{Term: proto.Uint64(hs.Term), Vote: proto.Uint64(hs.Vote), Commit: proto.Uint64(hs.Commit)}); err != nil {
			w.Close()
			return nil, fmt.Errorf("replica: restore hard state: %w", err)
		}
		ents := make([]*raftpb.Entry, len(rec.Entries))
		for i, e := range rec.Entries {
			ents[i] = fromWALEntry(e)
		}
		if err := r.storage.Append(ents); err != nil {
			w.Close()
			return nil, fmt.Errorf("replica: restore %d log entries after snapshot %d: %w", len(ents), rec.Snapshot.Index, err)
		}
	}

	// Until the replicated table is rebuilt, the configured peers are the
	// best address book we have.
	if cfg.Transport != nil {
		for _, p := range cfg.Peers {
			r.setPeer(p.ID, p.PeerAddr)
		}
		for _, m := range r.members.Members {
			r.setPeer(m.ID, m.PeerAddr)
		}
	}

	rc := &raft.Config{
		ID:                        cfg.ID,
		ElectionTick:              cfg.ElectionTicks,
		HeartbeatTick:             cfg.HeartbeatTicks,
		Storage:                   r.storage,
		Applied:                   r.applied,
		MaxSizePerMsg:             cfg.MaxSizePerMsg,
		MaxInflightMsgs:           cfg.MaxInflightMsgs,
		MaxUncommittedEntriesSize: cfg.MaxUncommittedBytes,
		CheckQuorum:               true,
		PreVote:                   true,
		ReadOnlyOption:            raft.ReadOnlySafe,
		// Persistence and apply run on their own goroutines, fed in order
		// by the Ready loop; raft holds back every message that depends on
		// a write until that write's responses are stepped back (see
		// doc.go). This is what lets the leader fsync in parallel with its
		// followers without counting itself durable early.
		AsyncStorageWrites: true,
		Logger:             raftLogger{cfg.Logger},
	}
	switch {
	case fresh && !cfg.Join:
		if len(cfg.Peers) == 0 {
			w.Close()
			return nil, errors.New("replica: a new cluster needs at least one peer (this node)")
		}
		peers := make([]raft.Peer, 0, len(cfg.Peers))
		found := false
		for _, p := range cfg.Peers {
			found = found || p.ID == cfg.ID
			ctx, _ := json.Marshal(confContext{Member: p})
			peers = append(peers, raft.Peer{ID: p.ID, Context: ctx})
		}
		if !found {
			w.Close()
			return nil, fmt.Errorf("replica: --peers does not list this node's id %d", cfg.ID)
		}
		r.log.Info("bootstrapping new cluster", "id", cfg.ID, "peers", len(peers))
		r.node = raft.StartNode(rc, peers)
	default:
		r.log.Info("restarting raft node", "id", cfg.ID, "snapshot", rec.Snapshot.Index,
			"entries", len(rec.Entries), "commit", rec.HardState.Commit, "join", cfg.Join && fresh)
		r.node = raft.RestartNode(rc)
	}
	r.wg.Add(6)
	go r.run()
	go r.laneLoop()
	go r.snapshotLoop()
	go r.syncLoop()
	go r.applyLoop()
	go r.promoteLoop()
	go func() {
		r.wg.Wait()
		r.node.Stop()
		close(r.done)
	}()
	// A cluster of one need not wait out an election timeout to lead.
	r.mu.Lock()
	voters := r.confState.GetVoters()
	r.mu.Unlock()
	if (fresh && !cfg.Join && len(cfg.Peers) == 1) || (len(voters) == 1 && voters[0] == cfg.ID) {
		if err := r.node.Campaign(context.Background()); err != nil {
			r.log.Warn("campaign", "err", err)
		}
	}
	return r, nil
}

// setPeer points the transport at id, preferring a dial override.
func (r *Replica) setPeer(id uint64, addr string) {
	if id == r.cfg.ID || r.cfg.Transport == nil {
		return
	}
	if o, ok := r.cfg.DialOverrides[addr]; ok {
		addr = o
	}
	if addr != "" {
		r.cfg.Transport.SetPeer(id, addr)
	}
}

func fromWALEntry(e wal.Entry) *raftpb.Entry {
	t := raftpb.EntryType(e.Type)
	return &raftpb.Entry{Index: proto.Uint64(e.Index), Term: proto.Uint64(e.Term), Type: &t, Data: e.Data}
}

func toWALEntry(e *raftpb.Entry) wal.Entry {
	return wal.Entry{Index: e.GetIndex(), Term: e.GetTerm(), Type: uint8(e.GetType()), Data: e.GetData()}
}

// pipelineDepth bounds the queues from the Ready loop to the sync and
// apply goroutines. A full queue blocks the Ready loop, and with it
// heartbeats, so it is sized to be rarely reached: raft already bounds what
// is in flight to apply (MaxCommittedSizePerReady bytes of entries until
// their MsgStorageApplyResp is stepped), and what is staged but not yet
// synced by the uncommitted-log limit on a leader and by the leader's
// replication window (MaxInflightMsgs) on a follower.
const pipelineDepth = 4096

// run is the Ready loop. It persists and applies nothing itself: it sends
// peer messages at once and hands raft's local storage messages, in order,
// to the append and apply goroutines.
func (r *Replica) run() {
	defer r.wg.Done()
	ticker := time.NewTicker(r.cfg.TickInterval)
	defer ticker.Stop()
	ticks := 0
	for {
		select {
		case <-ticker.C:
			r.node.Tick()
			ticks++
			if ticks%5 == 0 {
				select {
				case r.promoteKick <- struct{}{}:
				default: // a round is still running
				}
				r.updateMetrics()
			}
		case rd := <-r.node.Ready():
			r.readies.Add(1)
			if !r.route(rd) {
				return
			}
		case <-r.stopc:
			return
		}
	}
}

// route dispatches one Ready. With AsyncStorageWrites every message in it
// may go out now: those that depend on a local write are not in it but in
// that write's MsgStorageAppend.Responses.
func (r *Replica) route(rd raft.Ready) bool {
	if rd.SoftState != nil {
		prev := r.leader.Swap(rd.SoftState.Lead)
		r.role.Store(rd.SoftState.RaftState)
		if prev != rd.SoftState.Lead {
			r.metrics.LeaderChanges.Inc()
			r.log.Info("leader changed", "from", prev, "to", rd.SoftState.Lead, "role", rd.SoftState.RaftState.String())
		}
	}
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		r.term.Store(rd.HardState.GetTerm())
		r.commit.Store(rd.HardState.GetCommit())
	}
	var peers []*raftpb.Message
	var local []*raftpb.Message
	for _, m := range rd.Messages {
		switch m.GetTo() {
		case raft.LocalAppendThread, raft.LocalApplyThread:
			local = append(local, m)
		default:
			peers = append(peers, m)
		}
	}
	// Peers first: a follower's fsync then overlaps the leader's.
	r.send(peers)
	for _, m := range local {
		if m.GetTo() == raft.LocalAppendThread {
			if r.laneBusy.Load() > 0 || !raft.IsEmptySnap(m.GetSnapshot()) {
				// Writing a received snapshot's file (it may be large,
				// the disk slow) goes to the lane, and every append after
				// it follows it there until the lane is empty: the WAL
				// must name the snapshot before any entry above it. This
				// loop goes on ticking and sending meanwhile.
				r.laneBusy.Add(1)
				select {
				case r.laneq <- m:
				case <-r.stopc:
					return false
				}
				continue
			}
			// Staging only encodes and queues (the WAL's writer does the
			// I/O), so it stays on this goroutine: one hand-off fewer on
			// every write's path than a separate append goroutine.
			it, err := r.stageAppend(m, &r.prevHS)
			if err != nil {
				r.halt(err)
				return false
			}
			select {
			case r.syncq <- it:
			case <-r.stopc:
				return false
			}
			continue
		}
		select {
		case r.applyq <- applyItem{ents: m.GetEntries(), resps: m.GetResponses()}:
		case <-r.stopc:
			return false
		}
	}
	for _, rs := range rd.ReadStates {
		if len(rs.RequestCtx) != 8 {
			continue
		}
		id := binary.BigEndian.Uint64(rs.RequestCtx)
		r.mu.Lock()
		ch, ok := r.reads[id]
		delete(r.reads, id)
		r.mu.Unlock()
		if ok {
			ch <- rs.Index
		}
	}
	return true
}

// stageAppend stages one MsgStorageAppend in the WAL without waiting for
// its fsync, and updates raft's in-memory log. Staging in order is all the
// WAL needs to write in order; the waiting happens in syncLoop, so the next
// batch is staged (and shares the next fsync) while this one syncs.
func (r *Replica) stageAppend(m *raftpb.Message, prev *wal.HardState) (syncItem, error) {
	it := syncItem{resps: m.GetResponses(), entries: len(m.GetEntries()), staged: time.Now()}
	var batch wal.Batch
	snap := m.GetSnapshot()
	hasSnap := snap != nil && !raft.IsEmptySnap(snap)
	if hasSnap {
		// Held until the mark is staged: the snapshot goroutine must not
		// slip an older mark in between.
		r.snapMu.Lock()
		defer r.snapMu.Unlock()
		if r.cfg.beforeSnapshotWrite != nil {
			r.cfg.beforeSnapshotWrite(snap.GetMetadata().GetIndex())
		}
		if err := r.snaps.save(snap); err != nil {
			return it, fmt.Errorf("save received snapshot: %w", err)
		}
		md := snap.GetMetadata()
		batch.Snapshot = &wal.SnapshotMark{Index: md.GetIndex(), Term: md.GetTerm()}
		it.snap = snap
	}
	// raft sets the HardState fields of a MsgStorageAppend only when the
	// HardState changed.
	var hs *raftpb.HardState
	if m.Term != nil || m.Vote != nil || m.Commit != nil {
		hs = &raftpb.HardState{Term: proto.Uint64(m.GetTerm()), Vote: proto.Uint64(m.GetVote()), Commit: proto.Uint64(m.GetCommit())}
		batch.HardState = &wal.HardState{Term: m.GetTerm(), Vote: m.GetVote(), Commit: m.GetCommit()}
	}
	if ents := m.GetEntries(); len(ents) > 0 {
		batch.Entries = make([]wal.Entry, len(ents))
		for i, e := range ents {
			batch.Entries[i] = toWALEntry(e)
		}
	}
	// raft.MustSync's rule: entries, term and vote must be durable before
	// anything that depends on them is sent; a commit index alone need not.
	mustSync := len(batch.Entries) > 0 || hasSnap ||
		(batch.HardState != nil && (batch.HardState.Term != prev.Term || batch.HardState.Vote != prev.Vote))
	if batch.HardState != nil {
		*prev = *batch.HardState
	}
	if batch.HardState != nil || batch.Snapshot != nil || len(batch.Entries) > 0 {
		p, err := r.wal.Stage(batch, mustSync)
		if err != nil {
			return it, fmt.Errorf("persist ready (%d entries): %w", len(batch.Entries), err)
		}
		it.pending = p
	}

	// raft's view of the log. It may run ahead of the disk: raft reads
	// back only what it already holds, and counts nothing durable before
	// the responses below are stepped.
	if hasSnap {
		if err := r.storage.ApplySnapshot(snap); err != nil && !errors.Is(err, raft.ErrSnapOutOfDate) {
			return it, fmt.Errorf("apply snapshot to raft storage: %w", err)
		}
		r.snapIndex.Store(snap.GetMetadata().GetIndex())
	}
	if hs != nil {
		if err := r.storage.SetHardState(hs); err != nil {
			return it, err
		}
	}
	if ents := m.GetEntries(); len(ents) > 0 {
		if err := r.storage.Append(ents); err != nil {
			return it, fmt.Errorf("append to raft storage: %w", err)
		}
	}
	return it, nil
}

// laneLoop stages the appends the Ready loop hands it — one carrying a
// received snapshot, whose file it writes first, and those behind it —
// in order, then queues them for the sync goroutine exactly as the Ready
// loop would. laneBusy falls only once an item is queued, so when the Ready
// loop sees it at zero, everything handed over is already in syncq and it
// may stage inline again (the atomic orders prevHS between the two).
func (r *Replica) laneLoop() {
	defer r.wg.Done()
	for {
		select {
		case m := <-r.laneq:
			it, err := r.stageAppend(m, &r.prevHS)
			if err != nil {
				r.halt(err)
				return
			}
			select {
			case r.syncq <- it:
			case <-r.stopc:
				return
			}
			r.laneBusy.Add(-1)
		case <-r.stopc:
			return
		}
	}
}

// syncLoop waits for each staged batch in order and only then releases what
// depended on it: the acknowledgements to the leader (or, on the leader,
// its own vote towards commit) and raft's notice that the entries are
// stable. A failed write fences the replica.
func (r *Replica) syncLoop() {
	defer r.wg.Done()
	for {
		var it syncItem
		select {
		case it = <-r.syncq:
		case <-r.stopc:
			return
		}
		if it.pending != nil {
			if err := it.pending.Wait(r.haltCtx); err != nil {
				if r.haltCtx.Err() == nil {
					r.halt(fmt.Errorf("persist ready (%d entries): %w", it.entries, err))
				}
				return
			}
			r.metrics.PersistSeconds.Observe(time.Since(it.staged).Seconds())
		}
		if it.snap != nil {
			// The state machine takes the snapshot in apply order: every
			// entry raft committed before it is already queued, and none
			// after it can be until the responses below are stepped.
			select {
			case r.applyq <- applyItem{snap: it.snap}:
			case <-r.stopc:
				return
			}
		}
		if !r.deliver(it.resps) {
			return
		}
	}
}

// deliver steps responses addressed to this node back into raft and sends
// the rest to peers.
func (r *Replica) deliver(resps []*raftpb.Message) bool {
	var peers []*raftpb.Message
	for _, m := range resps {
		if m.GetTo() != r.cfg.ID {
			peers = append(peers, m)
			continue
		}
		if err := r.node.Step(r.haltCtx, m); err != nil {
			return false
		}
	}
	r.send(peers)
	return true
}

// applyLoop applies committed entries in log order, installs received
// snapshots in that same order, and encodes snapshots — all off the Ready
// loop and off the WAL's path, so a slow apply or a large snapshot never
// holds up persistence: the snapshot goroutine writes periodic snapshots,
// the lane writes received ones (laneLoop), and the Ready loop only ever
// stages (and can wait for neither).
func (r *Replica) applyLoop() {
	defer r.wg.Done()
	for {
		select {
		case it := <-r.applyq:
			if it.snap != nil {
				r.confMarker = confMarker{} // the log it was followed by is gone
				if err := r.restoreSnapshot(it.snap); err != nil {
					r.halt(err)
					return
				}
				r.log.Info("installed snapshot from leader", "index", it.snap.GetMetadata().GetIndex())
				continue
			}
			if len(it.ents) > 0 {
				start := time.Now()
				if err := r.apply(it.ents); err != nil {
					r.halt(err)
					return
				}
				r.metrics.ApplySeconds.Observe(time.Since(start).Seconds())
				r.metrics.ApplyBatch.Observe(float64(len(it.ents)))
			}
			if r.isRemoved() {
				r.log.Warn("this node was removed from the cluster; stopping raft")
				r.halt(nil)
				return
			}
			if !r.deliver(it.resps) {
				return
			}
			due := r.appliedIndex()-r.snapIndex.Load() >= r.cfg.SnapshotEvery || r.snapForMember.Load()
			if due && !r.snapBusy.Load() {
				r.snapForMember.Store(false)
				if !r.startSnapshot(nil) {
					return
				}
			}
		case req := <-r.snapshotReq:
			if !r.startSnapshot(req) {
				return
			}
		case <-r.stopc:
			return
		}
	}
}

func (r *Replica) send(msgs []*raftpb.Message) {
	if len(msgs) == 0 || r.cfg.Transport == nil {
		return
	}
	out := make([]Outbound, 0, len(msgs))
	for _, m := range msgs {
		data, err := proto.Marshal(m)
		if err != nil {
			r.log.Error("marshal raft message", "type", m.GetType().String(), "err", err)
			continue
		}
		out = append(out, Outbound{To: m.GetTo(), Snapshot: m.GetType() == raftpb.MsgSnap, Data: data})
	}
	r.cfg.Transport.Send(out)
}

// Proposal payloads are framed as
//
//	u8 version(1) | u64 origin node | u64 request id | application data
//
// so that only the proposer's own entry can wake its waiter.
//
// A membership change is proposed behind a marker entry framed the same way
// with version 2 and no data (see proposeConfChange).
const (
	envelopeVersion   = 1
	confMarkerVersion = 2
	envelopeHeader    = 1 + 8 + 8
)

// pendingApp is an application entry whose apply is deferred to the end
// of its run of consecutive application entries (see applyRun).
type pendingApp struct {
	AppEntry
	origin, request uint64
}

func (r *Replica) apply(ents []*raftpb.Entry) error {
	run := r.runScratch[:0]
	defer func() { r.runScratch = run[:0] }()
	applied := r.appliedIndex()
	for _, e := range ents {
		idx := e.GetIndex()
		if idx <= applied {
			continue
		}
		data := e.GetData()
		if e.GetType() == raftpb.EntryNormal && len(data) >= envelopeHeader && data[0] == envelopeVersion && r.confMarker.index == 0 {
			run = append(run, pendingApp{
				AppEntry: AppEntry{Index: idx, Term: e.GetTerm(), Data: data[envelopeHeader:], Subs: 1},
				origin:   binary.BigEndian.Uint64(data[1:9]),
				request:  binary.BigEndian.Uint64(data[9:17]),
			})
			continue
		}
		if e.GetType() == raftpb.EntryNormal && len(data) > 0 && data[0] == packedVersion && r.confMarker.index == 0 {
			var err error
			if run, err = unpack(run, idx, e.GetTerm(), data); err == nil {
				continue
			}
			// Malformed: cannot happen for entries a node packed; the
			// switch below skips it on every node alike, like any entry
			// of unknown framing.
		}
		if err := r.applyRun(run); err != nil {
			return err
		}
		run = run[:0]
		// The entry right after a conf change marker is that change, or
		// the empty entry raft put in its place.
		marker := r.confMarker
		r.confMarker = confMarker{}
		switch e.GetType() {
		case raftpb.EntryNormal:
			data := e.GetData()
			if len(data) == 0 {
				r.sm.SetApplied(idx)
				if marker.droppedAt(e) && marker.origin == r.cfg.ID {
					r.wake(marker.request, Applied{Index: idx, Term: e.GetTerm(), Result: ErrConfChangeDropped})
				}
				break
			}
			if len(data) >= envelopeHeader && data[0] == confMarkerVersion {
				r.confMarker = confMarker{
					index: idx, term: e.GetTerm(),
					origin:  binary.BigEndian.Uint64(data[1:9]),
					request: binary.BigEndian.Uint64(data[9:17]),
				}
				r.sm.SetApplied(idx)
				break
			}
			if _, known := EntryFormatOf(raftpb.EntryNormal, data); !known {
				// An entry format this build does not read (format.go):
				// skipping it, as this did before issue 12 item 2, makes
				// this replica diverge from the nodes that applied it.
				return &EntryFormatError{Index: idx, Term: e.GetTerm(), Envelope: data[0]}
			}
			if data[0] == packedVersion {
				// A packed entry right after a conf change marker (never,
				// in practice: see droppedAt) is applied like any other;
				// a malformed one is skipped here.
				one, err := unpack(nil, idx, e.GetTerm(), data)
				if err != nil {
					r.log.Error("skipping malformed packed entry", "index", idx, "err", err)
					r.sm.SetApplied(idx)
					break
				}
				if err := r.applyRun(one); err != nil {
					return err
				}
				break
			}
			if len(data) < envelopeHeader || data[0] != envelopeVersion {
				// A known envelope cut short cannot happen for entries we
				// proposed (the log is checksummed); refusing to apply
				// would wedge the node, so it is skipped on every node alike.
				r.log.Error("skipping entry with unknown framing", "index", idx, "len", len(data))
				r.sm.SetApplied(idx)
				break
			}
			// An application entry right after a conf change marker
			// (never, in practice) is applied alone, after the marker is
			// consumed as above.
			if err := r.applyRun([]pendingApp{{
				AppEntry: AppEntry{Index: idx, Term: e.GetTerm(), Data: data[envelopeHeader:], Subs: 1},
				origin:   binary.BigEndian.Uint64(data[1:9]),
				request:  binary.BigEndian.Uint64(data[9:17]),
			}}); err != nil {
				return err
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			if err := r.applyConfChange(e); err != nil {
				return err
			}
			r.sm.SetApplied(idx)
		}
		r.setApplied(idx, e.GetTerm())
	}
	return r.applyRun(run)
}

// applyRun applies a run of consecutive application entries: in one call
// when the state machine takes batches, then wakes this node's proposers
// and publishes the applied index once for the run.
func (r *Replica) applyRun(run []pendingApp) error {
	if len(run) == 0 {
		return nil
	}
	var results []any
	bsm, batches := r.sm.(BatchStateMachine)
	if !batches && run[len(run)-1].Subs > 1 || run[0].Sub > 0 {
		return fmt.Errorf("replica: entry %d packs %d proposals, and this state machine cannot apply packed entries (no ApplyBatch)", run[len(run)-1].Index, run[len(run)-1].Subs)
	}
	if batches && len(run) > 1 {
		ents := r.appScratch[:0]
		for i := range run {
			ents = append(ents, run[i].AppEntry)
		}
		results = bsm.ApplyBatch(ents)
		clear(ents)
		r.appScratch = ents[:0]
		if len(results) != len(run) {
			panic(fmt.Sprintf("replica: ApplyBatch returned %d results for %d entries", len(results), len(run)))
		}
	} else {
		results = make([]any, len(run))
		for i := range run {
			results[i] = r.sm.Apply(run[i].Index, run[i].Term, run[i].Data)
		}
	}
	// Wake this node's proposers: their channels are looked up under one
	// lock for the run, and sent to (buffered, one each) outside it.
	type waiter struct {
		ch chan Applied
		a  Applied
	}
	var waiters []waiter
	r.mu.Lock()
	for i := range run {
		if run[i].origin != r.cfg.ID {
			continue
		}
		if ch, ok := r.proposals[run[i].request]; ok {
			delete(r.proposals, run[i].request)
			waiters = append(waiters, waiter{ch, Applied{Index: run[i].Index, Term: run[i].Term, Result: results[i]}})
		}
	}
	r.mu.Unlock()
	for _, w := range waiters {
		w.ch <- w.a
	}
	last := run[len(run)-1]
	r.setApplied(last.Index, last.Term)
	clear(run)
	return nil
}

// wake hands a to the waiter of request req on this node, if any.
func (r *Replica) wake(req uint64, a Applied) {
	r.mu.Lock()
	ch, ok := r.proposals[req]
	delete(r.proposals, req)
	r.mu.Unlock()
	if ok {
		ch <- a
	}
}

// confMarker is the last applied entry when it was a conf change marker
// (see proposeConfChange); the apply goroutine owns it.
type confMarker struct {
	index, term     uint64
	origin, request uint64
}

// droppedAt reports whether e, an empty normal entry, is what raft left in
// place of the change proposed behind this marker. raft appends the marker
// and the change of one proposal together, at consecutive indexes of one
// term, and replaces a change it refuses by an empty normal entry; a new
// leader's own empty entry (at the start of its term) has another term.
func (m confMarker) droppedAt(e *raftpb.Entry) bool {
	return m.index != 0 && e.GetIndex() == m.index+1 && e.GetTerm() == m.term
}

func (r *Replica) applyConfChange(e *raftpb.Entry) error {
	var cc *raftpb.ConfChangeV2
	if e.GetType() == raftpb.EntryConfChange {
		v1 := &raftpb.ConfChange{}
		if err := proto.Unmarshal(e.GetData(), v1); err != nil {
			return fmt.Errorf("decode conf change at index %d: %w", e.GetIndex(), err)
		}
		cc = v1.AsV2()
	} else {
		cc = &raftpb.ConfChangeV2{}
		if err := proto.Unmarshal(e.GetData(), cc); err != nil {
			return fmt.Errorf("decode conf change v2 at index %d: %w", e.GetIndex(), err)
		}
	}
	var cctx confContext
	if len(cc.GetContext()) > 0 {
		if err := json.Unmarshal(cc.GetContext(), &cctx); err != nil {
			r.log.Error("conf change context is not JSON", "index", e.GetIndex(), "err", err)
		}
	}

	r.mu.Lock()
	// A change the membership table refuses is applied with its NodeId
	// zeroed, raft's own convention for "decided downstream not to apply
	// this": confchange.Changer skips such changes. Deterministic on every
	// node, since the table is replicated state. (Replacing the whole change
	// by an empty ConfChangeV2 — what this did before — means "leave the
	// joint config" to raft, which panics outside one; the entry stays in
	// the log, so every node panicked at that index on every restart:
	// issue 9 item 1.)
	var refused []string
	for _, ch := range cc.GetChanges() {
		if why := r.members.refuse(ch.GetType(), ch.GetNodeId()); why != "" {
			refused = append(refused, why)
			ch.NodeId = proto.Uint64(raft.None)
		}
	}
	var applyErr error
	if len(refused) > 0 {
		applyErr = &MembershipError{Msg: strings.Join(refused, "; ") + " (the change reached the log and was applied as a no-op)"}
		r.log.Warn("membership change refused at apply", "index", e.GetIndex(), "why", strings.Join(refused, "; "))
	}
	for _, ch := range cc.GetChanges() {
		id := ch.GetNodeId()
		if id == raft.None {
			continue
		}
		switch ch.GetType() {
		case raftpb.ConfChangeType_ConfChangeAddNode, raftpb.ConfChangeType_ConfChangeAddLearnerNode:
			m, known := r.members.Members[id]
			if cctx.Member.ID == id {
				m = cctx.Member
			} else if !known {
				m = Member{ID: id}
			}
			r.members.Members[id] = m
			r.setPeer(id, m.PeerAddr)
			if ch.GetType() == raftpb.ConfChangeType_ConfChangeAddNode {
				delete(r.promoting, id)
			}
			if !known && r.snapIndex.Load() > 0 {
				// A newcomer catches up from a snapshot if the log it
				// needs is compacted, and raft makes it refuse a snapshot
				// whose ConfState does not list it ("should never
				// happen"): the older snapshot would be sent forever.
				// Snapshot again once this change is applied. (Without a
				// snapshot yet, the log from index 1 is all still there.)
				r.snapForMember.Store(true)
			}
		case raftpb.ConfChangeType_ConfChangeRemoveNode:
			delete(r.members.Members, id)
			r.members.Removed[id] = true
			if id == r.cfg.ID {
				r.removed = true
			} else if r.cfg.Transport != nil {
				r.cfg.Transport.RemovePeer(id)
			}
		}
	}
	joint := len(r.confState.GetVotersOutgoing()) > 0
	cs := r.confState
	r.mu.Unlock()

	if len(cc.GetChanges()) == 0 && !joint {
		// An empty ConfChangeV2 means "leave the joint config", and raft
		// panics when there is none to leave. raft's proposal validation
		// keeps such an entry out of the log (it logs an empty normal
		// entry instead), and this package never enters a joint config;
		// should a log hold one anyway, the node applies it as the no-op it
		// is rather than panicking at the same index on every restart.
		// (Logs of builds that blanked refused changes hold the original
		// change, which refuse() above now zeroes.)
		r.log.Warn("skipping an empty membership change outside a joint config", "index", e.GetIndex())
	} else {
		cs = r.node.ApplyConfChange(cc)
	}
	r.mu.Lock()
	r.confState = cs
	r.mu.Unlock()
	if cctx.Origin == r.cfg.ID && cctx.Request != 0 {
		r.wake(cctx.Request, Applied{Index: e.GetIndex(), Term: e.GetTerm(), Result: applyErr})
	}
	r.log.Info("applied membership change", "index", e.GetIndex(), "changes", raftpb.ConfChangesToString(cc.GetChanges()),
		"voters", cs.GetVoters(), "learners", cs.GetLearners())
	return nil
}

func (r *Replica) setApplied(index, term uint64) {
	r.appliedMu.Lock()
	r.applied = index
	r.appliedTerm = term
	kept := r.appliedWaiters[:0]
	for _, w := range r.appliedWaiters {
		if w.index <= index {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	r.appliedWaiters = kept
	r.appliedMu.Unlock()
}

func (r *Replica) appliedIndex() uint64 {
	r.appliedMu.Lock()
	defer r.appliedMu.Unlock()
	return r.applied
}

// waitApplied returns once the local state machine has applied index.
func (r *Replica) waitApplied(ctx context.Context, index uint64) error {
	r.appliedMu.Lock()
	if r.applied >= index {
		r.appliedMu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	r.appliedWaiters = append(r.appliedWaiters, appliedWaiter{index: index, ch: ch})
	r.appliedMu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		return r.stoppedErr()
	}
}

// snapJob is a state snapshot encoded by the apply goroutine, on its way
// to the snapshot goroutine that makes it durable.
type snapJob struct {
	index, term uint64
	cs          *raftpb.ConfState
	data        []byte
	reply       chan snapshotResult // nil for a periodic snapshot
}

// startSnapshot runs on the apply goroutine, so the state it encodes is
// exactly the applied prefix; writing the file, the WAL mark and compacting
// happen on the snapshot goroutine while apply goes on. It returns false
// once the replica is halting. Snapshot framing: u32 len | membership JSON
// | state machine bytes.
func (r *Replica) startSnapshot(reply chan snapshotResult) bool {
	r.appliedMu.Lock()
	index, term := r.applied, r.appliedTerm
	r.appliedMu.Unlock()
	if index == 0 || index <= r.snapIndex.Load() {
		if reply != nil {
			reply <- snapshotResult{index: r.snapIndex.Load(), term: term}
		}
		return true
	}
	r.mu.Lock()
	mem, err := r.members.marshal()
	cs := proto.Clone(r.confState).(*raftpb.ConfState)
	r.mu.Unlock()
	var buf bytes.Buffer
	if err == nil {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(mem)))
		buf.Write(n[:])
		buf.Write(mem)
		if err = r.sm.Snapshot(&buf); err != nil {
			err = fmt.Errorf("state machine snapshot at %d: %w", index, err)
		}
	}
	if err != nil {
		if reply != nil {
			reply <- snapshotResult{err: err}
		}
		r.halt(err)
		return false
	}
	if reply == nil {
		r.snapBusy.Store(true)
	}
	select {
	case r.snapq <- snapJob{index: index, term: term, cs: cs, data: buf.Bytes(), reply: reply}:
		return true
	case <-r.stopc:
		return false
	}
}

// snapshotLoop makes encoded snapshots durable, one at a time.
func (r *Replica) snapshotLoop() {
	defer r.wg.Done()
	for {
		select {
		case j := <-r.snapq:
			start := time.Now()
			idx, term, err := r.persistSnapshot(j)
			if j.reply == nil {
				r.snapBusy.Store(false)
			} else {
				j.reply <- snapshotResult{idx, term, err}
			}
			if err != nil {
				r.halt(err)
				return
			}
			if idx == j.index {
				r.metrics.Snapshots.Inc()
				r.metrics.SnapshotSeconds.Observe(time.Since(start).Seconds())
				r.log.Info("snapshot taken", "index", idx, "term", term, "bytes", len(j.data), "persist_took", time.Since(start))
			}
		case <-r.stopc:
			return
		}
	}
}

// persistSnapshot writes the snapshot file (fsynced), then the WAL mark,
// then compacts raft's memory log and the WAL below it.
func (r *Replica) persistSnapshot(j snapJob) (uint64, uint64, error) {
	index, term := j.index, j.term
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	if index <= r.snapIndex.Load() {
		// A snapshot received from the leader overtook this one.
		return r.snapIndex.Load(), term, nil
	}
	snap, err := r.storage.CreateSnapshot(index, j.cs, j.data)
	if errors.Is(err, raft.ErrSnapOutOfDate) {
		return r.snapIndex.Load(), term, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("create snapshot at %d: %w", index, err)
	}
	if err := r.snaps.save(snap); err != nil {
		return 0, 0, err
	}
	if err := r.wal.Save(context.Background(), wal.Batch{Snapshot: &wal.SnapshotMark{Index: index, Term: term}}, true); err != nil {
		return 0, 0, fmt.Errorf("record snapshot mark: %w", err)
	}
	if index > r.cfg.SnapshotCatchUp {
		if err := r.storage.Compact(index - r.cfg.SnapshotCatchUp); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return 0, 0, fmt.Errorf("compact raft log: %w", err)
		}
	}
	// Entries at or below the snapshot are never read back from the WAL:
	// a restart starts from this snapshot.
	if err := r.wal.Compact(index + 1); err != nil {
		return 0, 0, fmt.Errorf("compact WAL below %d: %w", index+1, err)
	}
	r.snapIndex.Store(index)
	return index, term, nil
}

func (r *Replica) restoreSnapshot(snap *raftpb.Snapshot) error {
	data := snap.GetData()
	if len(data) < 4 {
		return fmt.Errorf("snapshot at index %d: %d bytes, too short for its header", snap.GetMetadata().GetIndex(), len(data))
	}
	n := binary.BigEndian.Uint32(data)
	if uint64(n)+4 > uint64(len(data)) {
		return fmt.Errorf("snapshot at index %d: membership length %d exceeds %d bytes", snap.GetMetadata().GetIndex(), n, len(data))
	}
	mem, err := unmarshalMembership(data[4 : 4+n])
	if err != nil {
		return err
	}
	if err := r.sm.Restore(bytes.NewReader(data[4+n:])); err != nil {
		return fmt.Errorf("restore state machine from snapshot %d: %w", snap.GetMetadata().GetIndex(), err)
	}
	r.mu.Lock()
	r.members = mem
	r.confState = proto.Clone(snap.GetMetadata().GetConfState()).(*raftpb.ConfState)
	r.mu.Unlock()
	for _, m := range mem.Members {
		r.setPeer(m.ID, m.PeerAddr)
	}
	md := snap.GetMetadata()
	r.setApplied(md.GetIndex(), md.GetTerm())
	return nil
}

// halt stops every goroutine of the replica. A non-nil err fences it: it
// failed to persist (or to install what it persisted), so nothing more may
// be persisted, sent or applied, and every later request fails with
// ErrFenced. The supervisor started in Start stops raft once all have
// returned and then closes done.
func (r *Replica) halt(err error) {
	r.haltOnce.Do(func() {
		var fe *EntryFormatError
		switch {
		case errors.As(err, &fe):
			r.mu.Lock()
			r.fenceErr = err
			r.mu.Unlock()
			r.log.Error("replica stopped: an entry in a format this build cannot read", "err", err)
		case err != nil:
			r.mu.Lock()
			r.fenceErr = err
			r.mu.Unlock()
			r.metrics.Fenced.Set(1)
			r.log.Error("replica fenced: refusing all further writes; restart the node after fixing the disk", "err", err)
		}
		close(r.stopc)
		r.haltCancel()
	})
}

func (r *Replica) isRemoved() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.removed
}

func (r *Replica) stoppedErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.fenceErr != nil:
		return fmt.Errorf("%w: %w", ErrFenced, r.fenceErr)
	case r.removed:
		return ErrRemoved
	}
	return ErrStopped
}

// Propose replicates data and returns once this node has applied the entry
// carrying it. Before the entry reaches raft the error says the write was
// not made; once it did, a deadline gives ErrUnknownOutcome.
func (r *Replica) Propose(ctx context.Context, data []byte) (Applied, error) {
	if err := r.checkRunning(); err != nil {
		return Applied{}, err
	}
	// raft's node does not even read proposals while it knows no leader:
	// node.Propose would block to the deadline and report an unknown
	// outcome for a write that certainly was not made.
	if r.leader.Load() == raft.None {
		return Applied{}, ErrNoLeader
	}
	req, err := r.ids.next()
	if err != nil {
		return Applied{}, err
	}
	ch := make(chan Applied, 1)
	r.mu.Lock()
	r.proposals[req] = ch
	r.mu.Unlock()
	r.metrics.ProposalsPending.Inc()
	defer r.metrics.ProposalsPending.Dec()
	forget := func() {
		r.mu.Lock()
		delete(r.proposals, req)
		r.mu.Unlock()
	}

	var packErr chan error // nil unless packed: never ready
	if r.cfg.PackProposals && !bugs.Active(bugs.AckBeforeCommit) {
		packErr = r.proposePacked(req, data)
	} else if err := r.node.Propose(ctx, r.envelope(req, data)); err != nil {
		forget()
		return Applied{}, r.proposeErr(err)
	}
	if bugs.Active(bugs.AckBeforeCommit) {
		forget()
		last, _ := r.storage.LastIndex()
		return Applied{Index: last + 1, Term: r.term.Load()}, nil
	}
	select {
	case a := <-ch:
		return a, nil
	case err := <-packErr:
		forget()
		return Applied{}, err
	case <-ctx.Done():
		forget()
		r.metrics.ProposalsTimedOut.Inc()
		return Applied{}, ErrUnknownOutcome
	case <-r.done:
		forget()
		return Applied{}, fmt.Errorf("%w: %w", ErrUnknownOutcome, r.stoppedErr())
	}
}

func (r *Replica) proposeErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrProposalDropped):
		r.metrics.ProposalsDropped.Inc()
		if r.leader.Load() == raft.None {
			return ErrNoLeader
		}
		return ErrOverloaded
	case errors.Is(err, raft.ErrStopped):
		return r.stoppedErr()
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// raft may have taken the proposal and only its answer was late:
		// the outcome is unknown, never "certainly not applied".
		r.metrics.ProposalsTimedOut.Inc()
		return ErrUnknownOutcome
	}
	return err
}

func (r *Replica) checkRunning() error {
	select {
	case <-r.done:
		return r.stoppedErr()
	default:
	}
	if r.isRemoved() {
		return ErrRemoved
	}
	return nil
}

// ReadIndex confirms with a quorum that this node's leader is still the
// leader and returns once the local state machine has applied everything
// committed at that moment: a read served afterwards is linearizable.
func (r *Replica) ReadIndex(ctx context.Context) (uint64, error) {
	if err := r.checkRunning(); err != nil {
		return 0, err
	}
	// A caller that already gave up gets its error, not a read that
	// raced with the cancellation.
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if r.leader.Load() == raft.None {
		return 0, ErrNoLeader
	}
	id, err := r.ids.next()
	if err != nil {
		return 0, err
	}
	rctx := make([]byte, 8)
	binary.BigEndian.PutUint64(rctx, id)
	ch := make(chan uint64, 1)
	r.mu.Lock()
	r.reads[id] = ch
	r.mu.Unlock()
	forget := func() {
		r.mu.Lock()
		delete(r.reads, id)
		r.mu.Unlock()
	}
	if err := r.node.ReadIndex(ctx, rctx); err != nil {
		forget()
		return 0, r.proposeErr(err)
	}
	select {
	case idx := <-ch:
		if err := r.waitApplied(ctx, idx); err != nil {
			return 0, err
		}
		return idx, nil
	case <-ctx.Done():
		forget()
		return 0, ctx.Err()
	case <-r.done:
		forget()
		return 0, r.stoppedErr()
	}
}

// forwardedProposalWait bounds how long a proposal forwarded by a follower
// may wait for raft to take it.
const forwardedProposalWait = 100 * time.Millisecond

// Receive hands a marshalled message from a peer to raft.
//
// A proposal forwarded by a follower (MsgProp) is stepped with a short
// deadline and dropped if raft does not take it: raft refuses proposals
// while it knows no leader by blocking Step, and the transport delivers a
// peer's messages one after another on one stream. A restarted ex-leader
// that received proposals queued for it before it died would otherwise
// block its stream on the first one, never see the new leader's
// heartbeats queued behind it, never learn the leader — and never take the
// proposal: a deadlock seen in the chaos suite. A dropped forwarded
// proposal is safe: its proposer times out with an unknown outcome and the
// client retries with the same ids.
func (r *Replica) Receive(ctx context.Context, data []byte) error {
	m := &raftpb.Message{}
	if err := proto.Unmarshal(data, m); err != nil {
		return fmt.Errorf("decode raft message (%d bytes): %w", len(data), err)
	}
	if m.GetType() == raftpb.MsgProp {
		if r.holdForwarded(m) {
			return nil
		}
		return r.stepForwarded(ctx, m)
	}
	return r.node.Step(ctx, m)
}

func (r *Replica) stepForwarded(ctx context.Context, m *raftpb.Message) error {
	pctx, cancel := context.WithTimeout(ctx, forwardedProposalWait)
	defer cancel()
	err := r.node.Step(pctx, m)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		r.metrics.ProposalsDropped.Inc()
		return nil
	}
	return err
}

// holdForwarded keeps a proposal forwarded to this node while it hands
// leadership off: raft would drop it (a leader with a transfer under way
// takes no proposals) and its proposer, on another node, would wait out
// its deadline and answer 504. Held proposals are stepped, once each, when
// the transfer ends; by then this node forwards them to the new leader.
func (r *Replica) holdForwarded(m *raftpb.Message) bool {
	if r.transfers.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.transfers.Load() == 0 {
		return false
	}
	r.heldProps = append(r.heldProps, m)
	return true
}

// ReportUnreachable tells raft that a message to id could not be sent, so
// it stops optimistic pipelining to that peer and probes instead.
func (r *Replica) ReportUnreachable(id uint64) { r.node.ReportUnreachable(id) }

// ReportSnapshot tells raft how sending a snapshot to id ended.
func (r *Replica) ReportSnapshot(id uint64, ok bool) {
	st := raft.SnapshotFinish
	if !ok {
		st = raft.SnapshotFailure
	}
	r.node.ReportSnapshot(id, st)
}

// Snapshot takes a snapshot now (the admin endpoint) and returns its position.
func (r *Replica) Snapshot(ctx context.Context) (index, term uint64, err error) {
	ch := make(chan snapshotResult, 1)
	select {
	case r.snapshotReq <- ch:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-r.done:
		return 0, 0, r.stoppedErr()
	}
	select {
	case res := <-ch:
		return res.index, res.term, res.err
	case <-r.done:
		return 0, 0, r.stoppedErr()
	}
}

// AddMember proposes m as a learner; the leader promotes it to voter once
// it has caught up (PromoteWithin).
func (r *Replica) AddMember(ctx context.Context, m Member) error {
	r.mu.Lock()
	err := r.members.checkAdd(m.ID)
	r.mu.Unlock()
	if err != nil {
		return &MembershipError{Msg: err.Error()}
	}
	if m.PeerAddr == "" {
		return &MembershipError{Msg: "peer_addr is required"}
	}
	return r.proposeConfChange(ctx, raftpb.ConfChangeType_ConfChangeAddLearnerNode, m)
}

// RemoveMember proposes removing id.
func (r *Replica) RemoveMember(ctx context.Context, id uint64) error {
	r.mu.Lock()
	_, ok := r.members.Members[id]
	r.mu.Unlock()
	if !ok {
		return &MembershipError{Msg: fmt.Sprintf("member id %d is not a member", id), NotFound: true}
	}
	return r.proposeConfChange(ctx, raftpb.ConfChangeType_ConfChangeRemoveNode, Member{ID: id})
}

// PublishMember records m's addresses in the replicated membership table
// for m.ID, an existing voter, the way etcd members publish their client
// URLs: nodes bootstrapped from --peers know only peer addresses. A
// ConfChangeAddNode for a voter changes no configuration; applying it
// stores the member its context carries. Learners are refused (the change
// would promote them).
func (r *Replica) PublishMember(ctx context.Context, m Member) error {
	r.mu.Lock()
	_, known := r.members.Members[m.ID]
	voter := slices.Contains(r.confState.GetVoters(), m.ID)
	r.mu.Unlock()
	if !known || !voter {
		return &MembershipError{Msg: fmt.Sprintf("member id %d is not a voter; only voters publish their addresses", m.ID)}
	}
	return r.proposeConfChange(ctx, raftpb.ConfChangeType_ConfChangeAddNode, m)
}

// MembershipError is a membership request that cannot be made as asked.
type MembershipError struct {
	Msg      string
	NotFound bool
}

func (e *MembershipError) Error() string { return e.Msg }

// proposeConfChange proposes one membership change and waits until this
// node has applied it.
//
// raft refuses a change proposed while another is not yet applied (which
// includes every change a new leader takes before it has applied its
// predecessor's log), and it does so silently: it logs an empty normal entry
// in the change's place. To tell that entry from any other, the change is
// proposed behind a marker entry carrying this node's request id, in one
// MsgProp; raft appends both at consecutive indexes of one term. An empty
// entry right after our marker is our change, dropped: the caller hears
// ErrConfChangeDropped at once (certainly not applied; 503) instead of
// waiting out its deadline for an outcome it would then call unknown.
func (r *Replica) proposeConfChange(ctx context.Context, typ raftpb.ConfChangeType, m Member) error {
	if err := r.checkRunning(); err != nil {
		return err
	}
	// As in Propose: raft would hold the proposal until the deadline.
	if r.leader.Load() == raft.None {
		return ErrNoLeader
	}
	req, err := r.ids.next()
	if err != nil {
		return err
	}
	cctx, _ := json.Marshal(confContext{Member: m, Request: req, Origin: r.cfg.ID})
	cc, err := proto.Marshal(&raftpb.ConfChangeV2{
		Changes: []*raftpb.ConfChangeSingle{{Type: &typ, NodeId: proto.Uint64(m.ID)}},
		Context: cctx,
	})
	if err != nil {
		return fmt.Errorf("encode membership change: %w", err)
	}
	marker := make([]byte, envelopeHeader)
	marker[0] = confMarkerVersion
	binary.BigEndian.PutUint64(marker[1:], r.cfg.ID)
	binary.BigEndian.PutUint64(marker[9:], req)
	prop := &raftpb.Message{Type: raftpb.MsgProp.Enum(), Entries: []*raftpb.Entry{
		{Type: raftpb.EntryNormal.Enum(), Data: marker},
		{Type: raftpb.EntryConfChangeV2.Enum(), Data: cc},
	}}

	ch := make(chan Applied, 1)
	r.mu.Lock()
	r.proposals[req] = ch
	r.mu.Unlock()
	forget := func() {
		r.mu.Lock()
		delete(r.proposals, req)
		r.mu.Unlock()
	}
	// Step, as node.ProposeConfChange does: it returns once raft took the
	// message (a follower forwards it to the leader).
	if err := r.node.Step(ctx, prop); err != nil {
		forget()
		return r.proposeErr(err)
	}
	select {
	case a := <-ch:
		if err, _ := a.Result.(error); err != nil {
			return err
		}
		return nil
	case <-ctx.Done():
		forget()
		r.metrics.ProposalsTimedOut.Inc()
		return ErrUnknownOutcome
	case <-r.done:
		forget()
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, r.stoppedErr())
	}
}

// promoteLoop runs learner promotion rounds off the Ready loop: a round
// proposes changes and waits for their outcome.
func (r *Replica) promoteLoop() {
	defer r.wg.Done()
	for {
		select {
		case <-r.promoteKick:
			r.maybePromoteLearners()
		case <-r.stopc:
			return
		}
	}
}

const (
	// promoteRetry spaces promotions of one learner whose outcome is not
	// known to have failed.
	promoteRetry = 5 * time.Second
	// promoteWait bounds the wait for one promotion's outcome.
	promoteWait = 5 * time.Second
)

// maybePromoteLearners runs on the leader: a learner whose match index is
// close enough to commit is proposed as a voter. Promoting earlier would
// let a slow newcomer count towards quorums it cannot yet serve.
func (r *Replica) maybePromoteLearners() {
	if r.leader.Load() != r.cfg.ID {
		return
	}
	defer r.promotionRounds.Add(1)
	st := r.node.Status()
	commit := st.HardState.GetCommit()
	for id, pr := range st.Progress {
		if !pr.IsLearner {
			continue
		}
		if pr.Match == 0 || pr.Match+r.cfg.PromoteWithin < commit { // Match 0: it has never acknowledged anything
			continue
		}
		r.mu.Lock()
		if t, ok := r.promoting[id]; ok && wallClock().Sub(t) < promoteRetry {
			r.mu.Unlock()
			continue
		}
		r.promoting[id] = wallClock()
		m, ok := r.members.Members[id]
		r.mu.Unlock()
		if !ok {
			continue
		}
		r.log.Info("promoting learner to voter", "id", id, "match", pr.Match, "commit", commit)
		ctx, cancel := context.WithTimeout(r.haltCtx, promoteWait)
		err := r.proposeConfChange(ctx, raftpb.ConfChangeType_ConfChangeAddNode, m)
		cancel()
		switch {
		case err == nil:
		case errors.Is(err, ErrConfChangeDropped), errors.Is(err, ErrNoLeader), errors.Is(err, ErrOverloaded):
			// Certainly not made: the next round tries again.
			r.mu.Lock()
			delete(r.promoting, id)
			r.mu.Unlock()
			r.log.Info("learner promotion not made; retrying next round", "id", id, "err", err)
		default:
			r.log.Warn("promote learner", "id", id, "err", err)
		}
	}
}

// TransferLeader asks the current leader to hand leadership to `to` and
// waits until `to` leads or ctx ends.
func (r *Replica) TransferLeader(ctx context.Context, to uint64) error {
	if err := r.checkRunning(); err != nil {
		return err
	}
	r.mu.Lock()
	_, ok := r.members.Members[to]
	r.mu.Unlock()
	if !ok {
		return &MembershipError{Msg: fmt.Sprintf("member id %d is not a member", to), NotFound: true}
	}
	lead := r.leader.Load()
	if lead == raft.None {
		return ErrNoLeader
	}
	if lead == to {
		return nil
	}
	if lead == r.cfg.ID {
		r.mu.Lock()
		r.transfers.Add(1)
		r.mu.Unlock()
		defer r.releaseHeld()
	}
	r.node.TransferLeadership(ctx, lead, to)
	t := time.NewTicker(r.cfg.TickInterval / 2)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if r.leader.Load() == to {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("leadership did not move from %d to %d: %w", lead, to, ctx.Err())
		case <-r.done:
			return r.stoppedErr()
		}
	}
}

// releaseHeld ends a transfer: once none is under way, the proposals held
// during them are stepped.
func (r *Replica) releaseHeld() {
	r.mu.Lock()
	var held []*raftpb.Message
	if r.transfers.Add(-1) == 0 {
		held, r.heldProps = r.heldProps, nil
	}
	r.mu.Unlock()
	for _, m := range held {
		r.stepForwarded(r.haltCtx, m)
	}
}

// Stop stops raft and the Ready loop and closes the WAL. Everything
// acknowledged is already durable, so Stop never needs to flush.
func (r *Replica) Stop() error {
	var err error
	r.stopOnce.Do(func() {
		r.halt(nil)
		<-r.done
		err = r.wal.Close()
	})
	return err
}

// Done is closed when the Ready loop has ended (stopped, fenced or removed).
func (r *Replica) Done() <-chan struct{} { return r.done }

// Err says why the replica stopped serving, or nil while it runs.
func (r *Replica) Err() error {
	select {
	case <-r.done:
		return r.stoppedErr()
	default:
	}
	if r.isRemoved() {
		return ErrRemoved
	}
	return nil
}

// ID is this node's id.
func (r *Replica) ID() uint64 { return r.cfg.ID }

// Leader is the leader this node knows of, or 0.
func (r *Replica) Leader() uint64 { return r.leader.Load() }

// Applied is the index the local state machine has applied.
func (r *Replica) Applied() uint64 { return r.appliedIndex() }

// MemberStatus is one member as /cluster/status shows it.
type MemberStatus struct {
	Member
	Role      string `json:"role"`
	Match     uint64 `json:"match"`
	Lag       uint64 `json:"lag"`
	Reachable bool   `json:"reachable"`
}

// Status is a point-in-time view of this node and, on the leader, of every
// member's replication progress.
type Status struct {
	ID      uint64         `json:"node"`
	Leader  uint64         `json:"leader"`
	Term    uint64         `json:"term"`
	Commit  uint64         `json:"commit"`
	Applied uint64         `json:"applied"`
	Role    string         `json:"role"`
	Members []MemberStatus `json:"members"`
	Error   string         `json:"error,omitempty"`
}

func roleName(s raft.StateType) string {
	switch s {
	case raft.StateLeader:
		return "leader"
	case raft.StateCandidate, raft.StatePreCandidate:
		return "candidate"
	}
	return "follower"
}

// Status reports this node's view. Match and lag per member are known only
// on the leader; followers report their own applied position.
func (r *Replica) Status() Status {
	st := Status{ID: r.cfg.ID, Applied: r.appliedIndex()}
	var rs raft.Status
	running := r.Err() == nil
	if running {
		rs = r.node.Status()
		st.Leader = rs.Lead
		st.Term = rs.HardState.GetTerm()
		st.Commit = rs.HardState.GetCommit()
		st.Role = roleName(rs.RaftState)
	} else {
		st.Role = "stopped"
		st.Term = r.term.Load()
		st.Commit = r.commit.Load()
		st.Error = r.Err().Error()
	}
	r.mu.Lock()
	members := r.members.sorted()
	learners := map[uint64]bool{}
	for _, id := range r.confState.GetLearners() {
		learners[id] = true
	}
	r.mu.Unlock()
	for _, m := range members {
		ms := MemberStatus{Member: m, Role: "follower"}
		if learners[m.ID] {
			ms.Role = "learner"
		}
		if m.ID == st.Leader {
			ms.Role = "leader"
		}
		if pr, ok := rs.Progress[m.ID]; ok {
			ms.Match = pr.Match
			ms.Reachable = pr.RecentActive
			if st.Commit > pr.Match {
				ms.Lag = st.Commit - pr.Match
			}
		} else if m.ID == r.cfg.ID {
			ms.Match = st.Applied
			ms.Reachable = running
			if st.Commit > st.Applied {
				ms.Lag = st.Commit - st.Applied
			}
		}
		st.Members = append(st.Members, ms)
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].ID < st.Members[j].ID })
	return st
}

func (r *Replica) updateMetrics() {
	if r.Err() != nil {
		return
	}
	rs := r.node.Status()
	commit := rs.HardState.GetCommit()
	r.metrics.Term.Set(float64(rs.HardState.GetTerm()))
	r.metrics.CommitIndex.Set(float64(commit))
	r.metrics.AppliedIndex.Set(float64(r.appliedIndex()))
	if rs.RaftState == raft.StateLeader {
		r.metrics.IsLeader.Set(1)
	} else {
		r.metrics.IsLeader.Set(0)
	}
	for id, pr := range rs.Progress {
		if id == r.cfg.ID {
			continue
		}
		peer := fmt.Sprint(id)
		r.metrics.PeerMatch.WithLabelValues(peer).Set(float64(pr.Match))
		lag := 0.0
		if commit > pr.Match {
			lag = float64(commit - pr.Match)
		}
		r.metrics.PeerLag.WithLabelValues(peer).Set(lag)
	}
}
