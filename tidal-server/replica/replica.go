package replica

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
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
	// ErrTransferAbandoned: a leader transfer this node asked for did not
	// happen: raft abandoned it after an election timeout and the target
	// was silent, so it was not asked again.
	ErrTransferAbandoned = errors.New("replica: leader transfer abandoned")
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

// SnapshotCapturer is a StateMachine that can take its state quickly and
// encode it later. CaptureSnapshot is called on the apply
// goroutine, so what it captures is exactly the applied prefix; the
// function it returns is called on the snapshot goroutine while entries
// go on being applied, and must write the bytes Snapshot would have
// written at the capture. A replica whose state machine is one never
// encodes a periodic snapshot on the apply path, which otherwise holds up
// every write's acknowledgement for as long as the encoding takes. A nil
// encode with a nil error means: call Snapshot, on the apply goroutine.
type SnapshotCapturer interface {
	StateMachine
	CaptureSnapshot() (encode func(io.Writer) error, err error)
}

// BatchStateMachine is a StateMachine that can apply several consecutive
// committed entries in one call (one lock and one
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
	// PackFormat is the entry format of the packed envelope the command
	// came in (format.go), which decides how the state machine places
	// the entry's commands inside it: PackedEntryFormat (2) under that
	// format's rule, kept so a log written under it replays identically;
	// PackedSpansEntryFormat (3), or 0 (an ordinary entry, or one built
	// by hand), under the newest rule.
	PackFormat uint32
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
	Join bool
	// DataDir is the node's data dir. The replica keeps its snapshots and
	// its request id epoch in GroupDir(DataDir, group); with no Log it
	// also opens the node's WAL, <DataDir>/wal, and closes it on Stop.
	DataDir string
	// Log, when set, is this replica's group's log in a WAL the node
	// opened (WAL.Group(id)); the group is Log.ID(). The node owns that
	// WAL: it opens it once, hands each group its log and its part of
	// what Open recovered (Recovered), and closes it after every replica
	// on it has stopped. The replica owns its group's snapshot marks and
	// compaction. Nil: the replica is group wal.DefaultGroup and opens
	// <DataDir>/wal itself with the WAL options, as a node of one group
	// does.
	Log *wal.GroupLog
	// Recovered is what the node's wal.Open found for Log's group
	// (Recovered.Groups[id]); nil for a group with no records. Only read
	// when Log is set; a shared WAL's recovered state is valid for one
	// Start per Open.
	Recovered *wal.GroupRecovered
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
	// MaxInflightBytes bounds the entry bytes of appends in flight to one
	// follower; default 32 × MaxSizePerMsg (32 MiB). MaxInflightMsgs alone
	// lets a follower that comes back far behind be sent 256 appends of
	// MaxSizePerMsg at once — marshalled and queued on this node's Ready
	// loop in one pass, ahead of the heartbeats of every other follower.
	// 32 MiB in flight still carries 320 MB/s at a 100 ms round trip.
	MaxInflightBytes uint64
	// MaxUncommittedBytes bounds what the leader accepts before its log
	// commits; past it proposals fail with ErrOverloaded (503). Default 64 MiB.
	MaxUncommittedBytes uint64
	// PackProposals packs proposals made concurrently on this node into
	// one raft entry (pack.go), in the newest packed envelope every member
	// reads (entry format 3, else 2; EntryFormatAllowed). Every node applies packed entries whatever
	// this says. It needs a BatchStateMachine.
	PackProposals bool
	SnapshotEvery uint64 // applied entries between snapshots; default 10000
	// StaggerSnapshots spreads the members' periodic snapshot points over
	// the interval by member id instead of all members snapshotting at the
	// same index (snapschedule.go); the interval stays SnapshotEvery on
	// average.
	StaggerSnapshots bool
	SnapshotCatchUp  uint64 // entries kept after a snapshot for slow followers; default 5000
	// PromoteWithin: a learner is promoted to voter once its match index is
	// within this many entries of the leader's commit. Default 1000.
	PromoteWithin uint64

	WAL wal.Options // for the WAL the replica opens itself (no Log)
	// Transport carries the group's messages: the node's transport for
	// the default group, or the handle the node's transport gave the
	// group (peer.Transport.Register). Nil: single node, messages are
	// dropped.
	Transport    Transport
	StateMachine StateMachine
	Logger       *slog.Logger
	Metrics      *Metrics

	// beforeSnapshotWrite, when set, runs before the file of a snapshot
	// received from the leader is written: tests make the disk slow with it.
	beforeSnapshotWrite func(index uint64)
	// beforePromote, when set, runs before a learner promotion is
	// proposed, on the goroutine that proposes it: tests make a promotion
	// take as long as they want with it.
	beforePromote func(id uint64)
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
	if c.MaxInflightBytes == 0 {
		c.MaxInflightBytes = 32 * c.MaxSizePerMsg
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
	// dropped: the leader told this node raft dropped the proposal (a
	// drop notice, dropped.go); Index and Term are then zero.
	dropped error
}

// Replica is one raft node with its log, snapshots and apply loop.
type Replica struct {
	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	node    raft.Node
	storage *raft.MemoryStorage
	// wal is the group's log; ownWAL the WAL the replica opened itself
	// (no Config.Log), which Stop closes, else nil.
	wal    *wal.GroupLog
	ownWAL *wal.WAL
	group  uint64
	snaps  *snapStore
	sm     StateMachine

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
	// transferGate orders the start of every leader transfer this node's
	// raft sees (TransferLeader, a MsgTransferLeader received) with the
	// check a membership change makes before it is stepped (no transfer
	// under way: raft would drop it without a word, confchange.go), so no
	// transfer starts between the check and the step.
	transferGate sync.Mutex
	// lastTransfer is the last transfer this node, leading, let raft
	// start: to whom, at which tick (noteTransferAsk). Under transferGate.
	lastTransfer struct{ to, tick uint64 }

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
	snapBytes atomic.Int64 // length of the last snapshot encoded from a capture
	// snapEncoding is the capacity of the buffer a snapshot is being
	// encoded into, 0 when none is (SnapshotMemory).
	snapEncoding atomic.Int64
	// snapHeld is the capacity of the data of the snapshot raft's storage
	// holds, set wherever that snapshot is replaced (SnapshotMemory):
	// asking the storage would copy it (MemoryStorage.Snapshot clones).
	snapHeld atomic.Int64
	snapBusy atomic.Bool // a periodic snapshot is being written
	// snapForMember asks for a snapshot as soon as possible: a member was
	// added, and the newest snapshot's ConfState does not know it.
	snapForMember atomic.Bool
	prevHS        wal.HardState  // last HardState staged; Ready loop only
	confMarker    confMarker     // apply goroutine only
	runScratch    []pendingApp   // apply goroutine only
	pack          packer         // proposals waiting to be packed (PackProposals)
	planted       plantedReplica // a tidalbugs build's defects (bugs_on.go)
	appScratch    []AppEntry     // apply goroutine only
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
	// heardAt: when each peer was last heard from, for leaderLacksQuorum.
	heardAt heardClock

	// The pipeline (see doc.go): Ready loop (stages WAL batches) -> syncq
	// -> sync goroutine; Ready loop and sync goroutine -> applyq -> apply
	// goroutine -> snapq -> snapshot goroutine. Each queue is FIFO, which
	// is what keeps the order raft asked for.
	syncq       chan syncItem
	applyq      chan applyItem
	snapshotReq chan chan snapshotResult
	forwardq    chan *raftpb.Message // proposals forwarded by followers (forward.go)
	stopc       chan struct{}        // closed by halt: every goroutine returns
	haltCtx     context.Context
	haltCancel  context.CancelFunc
	haltOnce    sync.Once
	wg          sync.WaitGroup
	snapSends   sync.WaitGroup // MsgSnaps being marshalled off the Ready loop
	done        chan struct{}  // closed once every goroutine returned and raft stopped
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
		forwardq:    make(chan *raftpb.Message, forwardQueue),
		promoteKick: make(chan struct{}, 1),
		stopc:       make(chan struct{}),
		done:        make(chan struct{}),
	}
	r.haltCtx, r.haltCancel = context.WithCancel(context.Background())
	r.role.Store(raft.StateFollower)

	var err error
	if r.group, err = groupOf(cfg); err != nil {
		return nil, err
	}
	dir := GroupDir(cfg.DataDir, r.group)
	if r.group != wal.DefaultGroup {
		// The default group's dir is the data dir, which the server
		// prepares; another group's is the replica's to prepare.
		if err := wal.MkdirAllDurable(dir); err != nil {
			return nil, fmt.Errorf("replica: group %d dir: %w", r.group, err)
		}
		if _, err := wal.RemoveTemporaries(dir, cfg.Logger); err != nil {
			return nil, fmt.Errorf("replica: group %d dir: %w", r.group, err)
		}
	}
	if r.snaps, err = newSnapStore(filepath.Join(dir, "snap"), cfg.Logger); err != nil {
		return nil, err
	}
	// Before raft starts: no id may be handed out from an epoch an earlier
	// incarnation of this replica used (requestid.go).
	if r.ids, err = openRequestIDs(dir); err != nil {
		return nil, err
	}
	var rec wal.GroupRecovered
	if cfg.Log != nil {
		r.wal = cfg.Log
		if cfg.Recovered != nil {
			rec = *cfg.Recovered
		}
	} else {
		walOpts := cfg.WAL
		if walOpts.Logger == nil {
			walOpts.Logger = cfg.Logger
		}
		w, all, err := wal.Open(filepath.Join(cfg.DataDir, "wal"), walOpts)
		if err != nil {
			return nil, err
		}
		r.ownWAL, r.wal = w, w.Group(wal.DefaultGroup)
		rec = wal.GroupRecovered{Snapshot: all.Snapshot, HardState: all.HardState, Entries: all.Entries}
	}
	// closeWAL undoes what Start opened when it fails: the WAL if it is
	// the replica's own, nothing if it is the node's.
	closeWAL := func() {
		if r.ownWAL != nil {
			r.ownWAL.Close()
		}
	}
	fresh := rec.Snapshot.Index == 0 && rec.HardState == (wal.HardState{}) && len(rec.Entries) == 0

	if rec.Snapshot.Index > 0 {
		snap, err := r.snaps.load(rec.Snapshot.Term, rec.Snapshot.Index)
		if err != nil {
			closeWAL()
			return nil, err
		}
		if err := r.restoreSnapshot(snap); err != nil {
			closeWAL()
			return nil, err
		}
		if err := r.storage.ApplySnapshot(snap); err != nil {
			closeWAL()
			return nil, fmt.Errorf("replica: load snapshot into raft storage: %w", err)
		}
		r.snapHeld.Store(int64(len(snap.GetData()))) // ApplySnapshot keeps a clone: exactly the length
		r.snapIndex.Store(rec.Snapshot.Index)
	}
	if !fresh {
		hs := rec.HardState
		if err := r.storage.SetHardState(&raftpb.HardState{Term: proto.Uint64(hs.Term), Vote: proto.Uint64(hs.Vote), Commit: proto.Uint64(hs.Commit)}); err != nil {
			closeWAL()
			return nil, fmt.Errorf("replica: restore hard state: %w", err)
		}
		ents := make([]*raftpb.Entry, len(rec.Entries))
		for i, e := range rec.Entries {
			ents[i] = fromWALEntry(e)
		}
		if err := r.storage.Append(ents); err != nil {
			closeWAL()
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
		MaxInflightBytes:          cfg.MaxInflightBytes,
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
			closeWAL()
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
			closeWAL()
			return nil, fmt.Errorf("replica: --peers does not list this node's id %d", cfg.ID)
		}
		r.log.Info("bootstrapping new cluster", "id", cfg.ID, "group", r.group, "peers", len(peers))
		r.node = raft.StartNode(rc, peers)
	default:
		r.log.Info("restarting raft node", "id", cfg.ID, "group", r.group, "snapshot", rec.Snapshot.Index,
			"entries", len(rec.Entries), "commit", rec.HardState.Commit, "join", cfg.Join && fresh)
		r.node = raft.RestartNode(rc)
	}
	r.wg.Add(7)
	go r.run()
	go r.forwardLoop()
	go r.laneLoop()
	go r.snapshotLoop()
	go r.syncLoop()
	go r.applyLoop()
	go r.promoteLoop()
	go func() {
		r.wg.Wait()
		r.snapSends.Wait()
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
	if r.plantedDrainAck() {
		// drain-ack-before-fsync: raft's answer (a leader handing off
		// drops every proposal) is not even looked at.
		_ = r.node.Propose(ctx, r.envelope(req, data))
		last, _ := r.storage.LastIndex()
		return Applied{Index: last + 1, Term: r.term.Load()}, nil
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
		if a.dropped != nil {
			return Applied{}, a.dropped
		}
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
		if r.plantedDrainAck() {
			// drain-ack-before-fsync: the replica stopped under a
			// write that never committed here, answered as applied.
			last, _ := r.storage.LastIndex()
			return Applied{Index: last + 1, Term: r.term.Load()}, nil
		}
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
		// A leader drops every proposal while it transfers leadership:
		// name that, not an overload, so the caller knows when to retry.
		if to := r.transferringTo(); to != raft.None {
			return r.transferError(to)
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

// Receive hands a marshalled message from a peer to raft.
//
// A proposal forwarded by a follower (MsgProp) never blocks here: raft
// refuses proposals while it knows no leader by blocking Step, and the
// transport delivers a peer's messages one after another on one stream. A
// restarted ex-leader that received proposals queued for it before it
// died would otherwise block its stream on the first one, never see the
// new leader's heartbeats queued behind it, never learn the leader — and
// never take the proposal: a deadlock seen in the chaos suite. So it is
// queued for the forward loop (forward.go), which waits for raft to take
// it apart from the stream. A forwarded proposal dropped in the end is
// safe: its proposer times out with an unknown outcome and the client
// retries with the same ids.
func (r *Replica) Receive(ctx context.Context, data []byte) error {
	m := &raftpb.Message{}
	if err := proto.Unmarshal(data, m); err != nil {
		return fmt.Errorf("decode raft message (%d bytes): %w", len(data), err)
	}
	if m.GetType() != raftpb.MsgTransferLeader {
		// A forwarded MsgTransferLeader's From names the transferee, not
		// the member that sent it.
		r.heardAt.heard(m.GetFrom())
	}
	switch {
	case m.GetType() == raftpb.MsgProp:
		if r.holdForwarded(m) {
			return nil
		}
		return r.stepForwarded(ctx, m)
	case isDropNotice(m):
		n, err := decodeDropNotice(m.GetContext())
		if err != nil {
			r.log.Warn("ignoring a malformed drop notice", "from", m.GetFrom(), "err", err)
			return nil
		}
		r.receiveDropNotice(m.GetFrom(), n)
		return nil
	case m.GetType() == raftpb.MsgTransferLeader:
		// Ordered with membership changes' transfer checks (transferGate).
		r.transferGate.Lock()
		defer r.transferGate.Unlock()
		if r.leader.Load() == r.cfg.ID && !r.noteTransferAsk(m.GetFrom()) {
			// A follower's TransferLeader asks again each election
			// timeout; it cannot hear the target, this node can.
			r.log.Info("ignoring a repeated request to transfer leadership to a member not heard from for an election timeout", "to", m.GetFrom())
			return nil
		}
	}
	return r.node.Step(ctx, m)
}

// stepForwarded hands a proposal forwarded by a follower to the forward
// loop (forward.go), never blocking the transport's inbound goroutine.
func (r *Replica) stepForwarded(_ context.Context, m *raftpb.Message) error {
	select {
	case r.forwardq <- m:
	default:
		// The loop is that far behind: drop, as raft would, and tell
		// the proposer (which counts it).
		r.notifyDropped(m, dropOverloaded, raft.None)
	}
	return nil
}

// holdForwarded keeps a write forwarded to this node while it hands
// leadership off: raft would drop it (a leader with a transfer under way
// takes no proposals) and its proposer, on another node, would wait out
// its deadline and answer 504. Held proposals are stepped, once each, when
// the transfer ends; by then this node forwards them to the new leader.
// A membership change is never held: the forward loop refuses it at once
// while a transfer is under way (forward.go), so the operator who asked
// for both hears which one to retry.
func (r *Replica) holdForwarded(m *raftpb.Message) bool {
	if r.transfers.Load() == 0 || !allNormal(m.GetEntries()) {
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

// Stop stops raft and the Ready loop and closes the WAL if the replica
// opened it (no Config.Log); a node's shared WAL stays open for its other
// groups. Everything acknowledged is already durable, so Stop never needs
// to flush.
func (r *Replica) Stop() error {
	var err error
	r.stopOnce.Do(func() {
		r.halt(nil)
		<-r.done
		if r.ownWAL != nil {
			err = r.ownWAL.Close()
		}
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

// Group is the raft group this replica belongs to.
func (r *Replica) Group() uint64 { return r.group }

// GroupDir is where group keeps its files under a node's data dir: the
// data dir itself for wal.DefaultGroup (snap/ and request-epoch where a
// node of one group has always kept them), <dataDir>/groups/<group> for
// every other group. The WAL, <dataDir>/wal, is the node's, whatever the
// group.
func GroupDir(dataDir string, group uint64) string {
	if group == wal.DefaultGroup {
		return dataDir
	}
	return filepath.Join(dataDir, "groups", strconv.FormatUint(group, 10))
}

// groupOf is the group cfg runs, checking that a shared log comes with
// what only the node can give.
func groupOf(cfg Config) (uint64, error) {
	if cfg.Log == nil {
		if cfg.Recovered != nil {
			return 0, errors.New("replica: Config.Recovered without Config.Log: recovered state is only read for a log the node opened")
		}
		return wal.DefaultGroup, nil
	}
	return cfg.Log.ID(), nil
}

// Leader is the leader this node knows of, or 0.
func (r *Replica) Leader() uint64 { return r.leader.Load() }

// Applied is the index the local state machine has applied.
func (r *Replica) Applied() uint64 { return r.appliedIndex() }
