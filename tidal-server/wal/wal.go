package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/tidal-server/bugs"
	"golang.org/x/sys/unix"
)

// Options configures a WAL. The zero value is usable.
type Options struct {
	// SegmentSize is the size segments are preallocated to, in bytes
	// (default 64 MiB). A group commit that does not fit in the current
	// segment goes to a new one; a single group larger than a segment
	// grows its segment past this size.
	SegmentSize int64
	// BatchMaxBytes (wal.batch_max_bytes) bounds the bytes one group
	// commit writes (default 4 MiB). A single Save larger than this is
	// written alone.
	BatchMaxBytes int
	// BatchTimeout (wal.batch_timeout) is how long the writer may wait to
	// gather more Saves after the first one arrives. Zero (the default)
	// means take whatever is queued: under load the queue fills while the
	// previous fsync runs, which is all the batching group commit needs.
	BatchTimeout time.Duration
	// NoSync skips fdatasync after group writes. Tests and benchmarks only:
	// Save then promises nothing about durability.
	NoSync bool
	// Logger receives torn-tail truncations and fencing; slog.Default()
	// if nil.
	Logger *slog.Logger
	// Metrics is optional.
	Metrics *Metrics
}

const (
	defaultSegmentSize   = 64 << 20
	defaultBatchMaxBytes = 4 << 20
)

// Entry is one raft log entry as the WAL stores it; the WAL does not
// interpret Type or Data.
type Entry struct {
	Index, Term uint64
	Type        uint8
	Data        []byte
}

// HardState is raft's persistent vote state.
type HardState struct{ Term, Vote, Commit uint64 }

// SnapshotMark records that a snapshot at Index was durably saved elsewhere;
// entries at or below Index are no longer needed.
type SnapshotMark struct{ Index, Term uint64 }

// Batch is everything one raft Ready asks to persist. Its records are
// written in the order Snapshot, Entries, HardState, as one contiguous
// write in one segment.
type Batch struct {
	Entries   []Entry
	HardState *HardState
	Snapshot  *SnapshotMark
}

// Recovered is the durable state Open found. Its Snapshot, HardState and
// Entries are DefaultGroup's, for single-group callers; Groups holds every
// group's.
type Recovered struct {
	Snapshot  SnapshotMark // newest mark; zero if none
	HardState HardState    // newest; zero if none
	// Entries are those above Snapshot.Index, in index order, contiguous,
	// with conflicting suffixes already resolved.
	Entries []Entry
	// Groups maps every group with records in the log to its state.
	Groups map[uint64]GroupRecovered
	// TornTail is non-nil when Open truncated a torn tail.
	TornTail *TornTail
}

// GroupRecovered is one group's durable state, with the meaning of the
// same fields of Recovered.
type GroupRecovered struct {
	Snapshot  SnapshotMark
	HardState HardState
	Entries   []Entry
}

// TornTail describes the partial write Open (or Repair) cut off the newest
// segment.
type TornTail struct {
	File   string
	Offset int64 // where the last good record ended and the file now ends
	Bytes  int64 // non-zero bytes dropped from Offset on
}

// Stats are cumulative counters since Open.
type Stats struct {
	Fsyncs  uint64 // fdatasyncs of group commits
	Writes  uint64 // group-commit writes
	Batches uint64 // Save calls written
	Records uint64
	Bytes   uint64
}

// CorruptionError reports damage Open will not repair by itself: a bad
// record that is not a torn tail of the newest segment, a missing segment,
// or records that break the log's index rules.
type CorruptionError struct {
	File   string
	Offset int64
	Reason string
}

func (e *CorruptionError) Error() string {
	return fmt.Sprintf("wal: corruption in %s at offset %d: %s", e.File, e.Offset, e.Reason)
}

var (
	// ErrFenced is wrapped by every Save after a write or fdatasync
	// failed. The failed batch may or may not be on disk; nothing is
	// written after it, so the durable log is frozen at a prefix of what
	// was acknowledged plus possibly that batch. Reopen to recover.
	ErrFenced = errors.New("wal: fenced after a failed write or sync")
	// ErrClosed is returned by Save after Close.
	ErrClosed = errors.New("wal: closed")
)

// WAL is an open write-ahead log. Save is safe for concurrent use; Compact
// and Close may be called from any goroutine.
type WAL struct {
	dir     string
	opts    Options
	fs      fileSystem
	log     *slog.Logger
	lock    *os.File
	kick    chan struct{} // cap 1: "the queue changed or Close was called"
	exited  chan struct{} // closed when the writer goroutine returns
	compact sync.Mutex    // serializes Compact calls

	mu     sync.Mutex
	queue  []*Pending
	queued int // bytes in queue
	groups map[uint64]*groupState
	// tagged says records are written group-tagged: set for good once a
	// group other than DefaultGroup is admitted, or when the newest
	// segment is already tagged. isTagged mirrors it for Stage's
	// lock-free encoding guess.
	tagged   bool
	isTagged atomic.Bool
	closed   bool
	fenced   error
	segments []*segmentInfo // ascending; the last is the one being written

	// Owned by the writer goroutine.
	file  segmentFile
	off   int64
	dirty bool // written since the last fdatasync
	wbuf  []byte

	stats struct{ fsyncs, writes, batches, records, bytes atomic.Uint64 }
}

// groupState is what the WAL tracks of one group, under mu.
type groupState struct {
	tracker  indexTracker
	stagedHS *HardState    // newest queued, for Compact's rewrite
	stagedSM *SnapshotMark // newest queued
	durable  struct {
		snap          SnapshotMark
		hsSeq, smSeq  uint64 // segments holding the newest HardState / mark
		hasHS, hasSnp bool
	}
	// below is the group's compaction bound: it no longer needs entries
	// below it. Zero until the group's first Compact since Open.
	below uint64
}

type segmentInfo struct {
	seq    uint64
	tagged bool
	// maxIndex maps each group with entries in the segment to the
	// largest entry index it ever wrote there.
	maxIndex map[uint64]uint64
}

// group returns g's state, creating an empty one: a group that never
// wrote starts at index 0, like a fresh log.
func (w *WAL) group(g uint64) *groupState {
	gs, ok := w.groups[g]
	if !ok {
		gs = &groupState{tracker: indexTracker{anchored: true}}
		w.groups[g] = gs
	}
	return gs
}

// Open opens the log in dir, creating dir and a first segment if needed,
// and returns what it recovered. See the package documentation for what
// counts as a torn tail (truncated here) and what as corruption (returned as
// *CorruptionError, with no WAL).
func Open(dir string, opts Options) (*WAL, *Recovered, error) {
	return open(dir, opts, osFS{})
}

func open(dir string, opts Options, fs fileSystem) (_ *WAL, _ *Recovered, err error) {
	if opts.SegmentSize == 0 {
		opts.SegmentSize = defaultSegmentSize
	}
	if opts.SegmentSize < 4*segmentHeaderBytes {
		return nil, nil, fmt.Errorf("wal: SegmentSize %d: expected at least %d", opts.SegmentSize, 4*segmentHeaderBytes)
	}
	if opts.BatchMaxBytes <= 0 {
		opts.BatchMaxBytes = defaultBatchMaxBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := mkdirAllDurable(fs, dir); err != nil {
		return nil, nil, fmt.Errorf("wal: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	if _, err := removeTemporaries(fs, dir, opts.Logger); err != nil {
		return nil, nil, fmt.Errorf("wal: %w", err)
	}

	if err := plantedDropLastEntry(fs, dir, opts.Logger); err != nil {
		return nil, nil, err
	}
	in, err := inspect(dir)
	if err != nil {
		return nil, nil, err
	}
	if in.problem != nil && in.torn == nil {
		return nil, nil, in.problem
	}

	w := &WAL{
		dir:    dir,
		opts:   opts,
		fs:     fs,
		log:    opts.Logger,
		lock:   lock,
		kick:   make(chan struct{}, 1),
		exited: make(chan struct{}),
	}
	w.groups = make(map[uint64]*groupState, len(in.state.groups))
	for g, st := range in.state.groups {
		// Replay is over: a group that read only marks goes on from its
		// newest one, which last already is.
		gs := &groupState{tracker: st.indexTracker}
		gs.tracker.anchored = true
		if st.hasHS {
			hs := st.hs
			gs.stagedHS = &hs
			gs.durable.hasHS, gs.durable.hsSeq = true, in.hsSeq[g]
		}
		if st.hasSnap {
			sm := st.snap
			gs.stagedSM = &sm
			gs.durable.hasSnp, gs.durable.smSeq, gs.durable.snap = true, in.smSeq[g], sm
		}
		w.groups[g] = gs
	}
	for _, s := range in.segs {
		w.segments = append(w.segments, &segmentInfo{seq: s.seq, tagged: taggedVersion(s.version), maxIndex: s.maxIndex})
	}
	// A newer release's test stand-in tags every segment it creates.
	w.tagged = writeVersion > FormatVersion || (len(in.segs) > 0 && w.segments[len(w.segments)-1].tagged)
	w.isTagged.Store(w.tagged)

	if len(in.segs) == 0 {
		f, err := w.createSegment(0, w.tagged)
		if err != nil {
			return nil, nil, err
		}
		w.file, w.off = f, segmentHeaderBytes
		w.segments = append(w.segments, &segmentInfo{seq: 0, tagged: w.tagged, maxIndex: map[uint64]uint64{}})
	} else {
		last := in.segs[len(in.segs)-1]
		if err := w.reopenNewest(last.path, last.end, in.torn); err != nil {
			return nil, nil, err
		}
		w.off = last.end
	}

	rec := in.state.result(in.torn)
	go w.run()
	return w, rec, nil
}

// reopenNewest opens the newest segment for appending at end, cutting off a
// torn tail first, and preallocates it again (Repair and torn-tail
// truncation leave it short).
func (w *WAL) reopenNewest(path string, end int64, torn *TornTail) error {
	f, err := w.fs.OpenWrite(path)
	if err != nil {
		return fmt.Errorf("wal: open newest segment: %w", err)
	}
	if torn != nil {
		if err := f.Truncate(end); err != nil {
			f.Close()
			return fmt.Errorf("wal: truncate torn tail of %s at %d: %w", path, end, err)
		}
		w.log.Warn("wal: truncated torn tail of the newest segment",
			"file", torn.File, "offset", torn.Offset, "bytes", torn.Bytes)
	}
	if err := f.Preallocate(w.opts.SegmentSize); err != nil {
		f.Close()
		return fmt.Errorf("wal: preallocate %s: %w", path, err)
	}
	// The truncation must be durable before anything is appended after
	// it, or a crash could bring the torn bytes back behind new records.
	if err := f.Datasync(); err != nil {
		f.Close()
		return fmt.Errorf("wal: sync %s: %w", path, err)
	}
	w.file = f
	return nil
}

// LockDir takes the lock a running node holds on the log in dir (the
// LOCK file's flock), for a command that must not run beside a node:
// it fails, saying so, while one has the log open. Close releases it.
func LockDir(dir string) (io.Closer, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	return lockDir(dir)
}

func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("wal: open lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("wal: lock %s: expected no other process to have the log open: %w", path, err)
	}
	return f, nil
}

// createSegment creates segment seq complete with its header under a
// temporary name and renames it into place, so a segment file that exists
// always starts with a durable header. A tagged segment is written in
// writeVersion, an untagged one in version 1.
func (w *WAL) createSegment(seq uint64, tagged bool) (segmentFile, error) {
	final := filepath.Join(w.dir, segmentName(seq))
	tmp := final + tmpSuffix
	f, err := w.fs.CreateExclusive(tmp)
	if err != nil {
		return nil, fmt.Errorf("wal: create segment: %w", err)
	}
	fail := func(what string, err error) (segmentFile, error) {
		f.Close()
		return nil, fmt.Errorf("wal: create segment %s: %s: %w", final, what, err)
	}
	if err := f.Preallocate(w.opts.SegmentSize); err != nil {
		return fail("preallocate", err)
	}
	version := uint32(untaggedVersion)
	if tagged {
		version = writeVersion
	}
	if _, err := f.WriteAt(appendSegmentHeader(nil, seq, version), 0); err != nil {
		return fail("write header", err)
	}
	if err := f.Datasync(); err != nil {
		return fail("sync", err)
	}
	if err := w.fs.Rename(tmp, final); err != nil {
		return fail("rename", err)
	}
	if bugs.Active(bugs.SkipDirFsync) {
		// Planted defect: the new name is not durable, so a power cut
		// takes the segment and every record synced into it.
		return f, nil
	}
	if err := w.fs.SyncDir(w.dir); err != nil {
		return fail("sync directory", err)
	}
	return f, nil
}

// Save writes b and, if sync, waits for it to be fdatasynced. Batches
// queued while the writer is busy go out together as one write and one
// fdatasync; Save returns only after that sync (or write, if !sync). It is
// Stage followed by Wait.
//
// Entries must have consecutive indexes, above the newest snapshot mark and
// at most one past the last entry saved; an entry at or below the last
// index replaces that index and everything after it.
//
// If ctx ends first, Save returns its error but the batch may still be
// written: the outcome is unknown, as with any I/O that was handed off.
// After a failed write or sync, Save returns an error wrapping ErrFenced.
func (w *WAL) Save(ctx context.Context, b Batch, sync bool) error {
	return w.save(ctx, DefaultGroup, b, sync)
}

func (w *WAL) save(ctx context.Context, group uint64, b Batch, sync bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := w.stage(group, b, sync)
	if err != nil {
		return err
	}
	return p.Wait(ctx)
}

// Pending is a staged batch on its way to disk.
type Pending struct {
	buf        []byte
	group      uint64
	tagged     bool // buf holds tagged records
	sync       bool
	records    int
	hasEntries bool
	maxIndex   uint64
	hs         bool
	snap       *SnapshotMark
	done       chan error // cap 1, so the writer never blocks on it

	result   error
	finished bool
}

// Stage checks b against the index rules and queues it for the writer,
// without waiting. Batches are written in the order Stage accepted them, so
// a caller that allocates indexes can do that and Stage under its own lock,
// and Wait outside it: the lock then covers only the hand-off, and
// concurrent callers share fdatasyncs.
func (w *WAL) Stage(b Batch, sync bool) (*Pending, error) {
	return w.stage(DefaultGroup, b, sync)
}

func (w *WAL) stage(group uint64, b Batch, sync bool) (*Pending, error) {
	if err := checkContiguous(b.Entries); err != nil {
		return nil, fmt.Errorf("wal: save: group %d: %w", group, err)
	}
	p := &Pending{group: group, sync: sync, done: make(chan error, 1)}
	// Encoding happens here, in the caller's goroutine, so concurrent
	// callers encode in parallel and the lock only covers the hand-off.
	// Whether the log is tagged can change between this guess and the
	// lock, once in the log's life; then the batch is encoded again.
	if err := p.encode(b, group != DefaultGroup || w.isTagged.Load()); err != nil {
		return nil, err
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if tagged := w.tagged || group != DefaultGroup; tagged != p.tagged {
		if err := p.encode(b, tagged); err != nil {
			return nil, err
		}
	}
	if err := w.admitLocked(group, b); err != nil {
		return nil, err
	}
	if p.tagged && !w.tagged {
		w.tagged = true
		w.isTagged.Store(true)
	}
	w.enqueueLocked(p)
	return p, nil
}

// encode frames b into p.buf, tagged or not, and notes what p carries. It
// refuses an entry whose record would exceed the largest payload a
// decoder accepts.
func (p *Pending) encode(b Batch, tagged bool) error {
	c := encoder{tagged: tagged, group: p.group}
	size := 0
	for i, e := range b.Entries {
		n := c.size(entryFixedBody+len(e.Data)) - recordHeaderSize
		if n > maxRecordPayload {
			return fmt.Errorf("wal: save: group %d: entries[%d]: %d data bytes exceed the maximum %d", p.group, i, len(e.Data), len(e.Data)-(n-maxRecordPayload))
		}
		size += n + recordHeaderSize
	}
	buf := make([]byte, 0, size+c.size(hardStateBody)+c.size(snapMarkBody))
	p.tagged, p.records, p.maxIndex, p.snap, p.hs = tagged, 0, 0, nil, false
	if b.Snapshot != nil {
		buf = c.snapshotMark(buf, *b.Snapshot)
		sm := *b.Snapshot
		p.snap = &sm
		p.records++
	}
	for _, e := range b.Entries {
		buf = c.entry(buf, e)
		p.maxIndex = max(p.maxIndex, e.Index)
	}
	p.records += len(b.Entries)
	p.hasEntries = len(b.Entries) > 0
	if b.HardState != nil {
		buf = c.hardState(buf, *b.HardState)
		p.hs = true
		p.records++
	}
	p.buf = buf
	return nil
}

// Wait returns once the batch is written and, if it was staged with sync,
// fdatasynced; or with an error wrapping ErrFenced if that failed. If ctx
// ends first, Wait returns an error wrapping ctx.Err() and the outcome is
// unknown; Wait may be called again. Wait is not safe for concurrent use.
func (p *Pending) Wait(ctx context.Context) error {
	if p.finished {
		return p.result
	}
	select {
	case err := <-p.done:
		p.result, p.finished = err, true
		return err
	case <-ctx.Done():
		return fmt.Errorf("wal: save: gave up waiting, the batch may still be written: %w", ctx.Err())
	}
}

// admitLocked checks b against everything of group queued before it and,
// if it fits, records it as queued.
func (w *WAL) admitLocked(group uint64, b Batch) error {
	if w.fenced != nil {
		return w.fenced
	}
	if w.closed {
		return ErrClosed
	}
	gs := w.group(group)
	t := gs.tracker
	if b.Snapshot != nil {
		if err := t.admitMark(*b.Snapshot); err != nil {
			return fmt.Errorf("wal: save: group %d: %w", group, err)
		}
	}
	if n := len(b.Entries); n > 0 {
		if err := t.admitEntries(b.Entries[0].Index, b.Entries[n-1].Index); err != nil {
			return fmt.Errorf("wal: save: group %d: %w", group, err)
		}
	}
	gs.tracker = t
	if b.HardState != nil {
		hs := *b.HardState
		gs.stagedHS = &hs
	}
	if b.Snapshot != nil {
		sm := *b.Snapshot
		gs.stagedSM = &sm
	}
	return nil
}

func (w *WAL) enqueueLocked(p *Pending) {
	w.queue = append(w.queue, p)
	w.queued += len(p.buf)
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run is the writer goroutine: the only code that writes segment data.
func (w *WAL) run() {
	defer close(w.exited)
	for range w.kick {
		if w.opts.BatchTimeout > 0 {
			w.gather()
		}
		for {
			group, closing := w.take()
			if len(group) > 0 {
				w.commit(group)
				continue
			}
			if closing {
				w.shutdown()
				return
			}
			break
		}
	}
}

// gather waits up to BatchTimeout for the queue to reach BatchMaxBytes.
func (w *WAL) gather() {
	timer := time.NewTimer(w.opts.BatchTimeout)
	defer timer.Stop()
	for {
		w.mu.Lock()
		enough := w.queued >= w.opts.BatchMaxBytes || w.closed || w.fenced != nil
		w.mu.Unlock()
		if enough {
			return
		}
		select {
		case <-w.kick:
		case <-timer.C:
			return
		}
	}
}

// take removes the next group from the queue: at least one Save, and more
// while they fit in BatchMaxBytes and are tagged as the first is (the
// first tagged Save goes to a new, tagged segment). closing reports that
// Close was called and the queue is empty.
func (w *WAL) take() (group []*Pending, closing bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, bytes := 0, 0
	for n < len(w.queue) && (n == 0 || (bytes+len(w.queue[n].buf) <= w.opts.BatchMaxBytes && w.queue[n].tagged == w.queue[0].tagged)) {
		bytes += len(w.queue[n].buf)
		n++
	}
	group = w.queue[:n:n]
	w.queue = w.queue[n:]
	w.queued -= bytes
	if len(w.queue) == 0 {
		w.queue = nil
	}
	return group, w.closed && len(w.queue) == 0
}

// commit writes one group with one write and at most one fdatasync, then
// releases its waiters. Any failure fences the WAL.
func (w *WAL) commit(group []*Pending) {
	w.wbuf = w.wbuf[:0]
	needSync := false
	for _, p := range group {
		w.wbuf = append(w.wbuf, p.buf...)
		needSync = needSync || p.sync
	}
	needSync = needSync && !w.opts.NoSync

	if len(w.wbuf) > 0 {
		w.mu.Lock()
		activeTagged := w.segments[len(w.segments)-1].tagged
		w.mu.Unlock()
		full := w.off+int64(len(w.wbuf)) > w.opts.SegmentSize && w.off > segmentHeaderBytes
		if full || group[0].tagged != activeTagged {
			if err := w.rollover(group[0].tagged); err != nil {
				w.fence(err, group)
				return
			}
		}
		if _, err := w.file.WriteAt(w.wbuf, w.off); err != nil {
			w.fence(fmt.Errorf("write %d bytes at offset %d of %s: %w", len(w.wbuf), w.off, w.activePath(), err), group)
			return
		}
		w.off += int64(len(w.wbuf))
		w.dirty = true
	}
	released := false
	if needSync && w.dirty {
		if bugs.Active(bugs.AckBeforeFsync) {
			// Planted defect: the waiters hear "durable" before the
			// fdatasync has even started.
			for _, p := range group {
				p.done <- nil
			}
			released = true
		}
		start := time.Now()
		var err error
		if !bugs.Active(bugs.NeverFsync) {
			err = w.file.Datasync()
		} // else planted defect: "durable" without ever asking the disk
		w.opts.Metrics.observeSync(time.Since(start))
		if err != nil && bugs.Active(bugs.IgnoreFsyncError) {
			// Planted defect: the lesson in DESIGN.md, unlearned.
			w.log.Error("wal: fdatasync failed; carrying on", "file", w.activePath(), "err", err)
			err = nil
		}
		if err != nil {
			if released {
				group = nil // already answered; done holds one value only
			}
			w.fence(fmt.Errorf("fdatasync %s: %w", w.activePath(), err), group)
			return
		}
		w.dirty = false
		w.stats.fsyncs.Add(1)
	}

	records := 0
	w.mu.Lock()
	active := w.segments[len(w.segments)-1]
	for _, p := range group {
		records += p.records
		if p.hasEntries {
			active.maxIndex[p.group] = max(active.maxIndex[p.group], p.maxIndex)
		}
		gs := w.group(p.group)
		if p.hs {
			gs.durable.hasHS, gs.durable.hsSeq = true, active.seq
		}
		if p.snap != nil {
			gs.durable.hasSnp, gs.durable.smSeq, gs.durable.snap = true, active.seq, *p.snap
		}
	}
	w.mu.Unlock()

	w.stats.writes.Add(1)
	w.stats.batches.Add(uint64(len(group)))
	w.stats.records.Add(uint64(records))
	w.stats.bytes.Add(uint64(len(w.wbuf)))
	w.opts.Metrics.observeGroup(len(group), len(w.wbuf))
	if released {
		return
	}
	for _, p := range group {
		p.done <- nil
	}
}

func (w *WAL) activePath() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return filepath.Join(w.dir, segmentName(w.segments[len(w.segments)-1].seq))
}

// rollover makes the old segment durable and switches to a new one, tagged
// or not. The old segment is synced first: unsynced bytes there behind
// synced bytes in the next segment would look like corruption, not a torn
// tail, on recovery.
func (w *WAL) rollover(tagged bool) error {
	if w.dirty && !w.opts.NoSync {
		if err := w.file.Datasync(); err != nil {
			return fmt.Errorf("fdatasync %s before rollover: %w", w.activePath(), err)
		}
		w.dirty = false
		w.stats.fsyncs.Add(1)
	}
	w.mu.Lock()
	seq := w.segments[len(w.segments)-1].seq + 1
	w.mu.Unlock()
	f, err := w.createSegment(seq, tagged)
	if err != nil {
		return err
	}
	if err := w.file.Close(); err != nil {
		f.Close()
		return fmt.Errorf("close %s: %w", w.activePath(), err)
	}
	w.file, w.off = f, segmentHeaderBytes
	w.mu.Lock()
	w.segments = append(w.segments, &segmentInfo{seq: seq, tagged: tagged, maxIndex: map[uint64]uint64{}})
	w.mu.Unlock()
	return nil
}

// fence stops the WAL for good after a failed write or sync: the failed
// group and everything queued behind it get the error, and admitLocked
// turns away everything after. Carrying on after a failed fdatasync is how
// replicas diverge: the kernel may have dropped the dirty pages and a later
// sync would report success.
func (w *WAL) fence(cause error, group []*Pending) {
	w.mu.Lock()
	first := w.fenced == nil
	if first {
		w.fenced = fmt.Errorf("%w: %w", ErrFenced, cause)
	}
	err := w.fenced
	queued := w.queue
	w.queue, w.queued = nil, 0
	w.mu.Unlock()
	if first {
		w.log.Error("wal: fenced; refusing all further writes", "err", cause)
		w.opts.Metrics.setFenced()
	}
	for _, p := range group {
		p.done <- err
	}
	for _, p := range queued {
		p.done <- err
	}
}

// shutdown runs on the writer goroutine once Close has drained the queue.
func (w *WAL) shutdown() {
	w.mu.Lock()
	fenced := w.fenced != nil
	w.mu.Unlock()
	if w.dirty && !fenced && !w.opts.NoSync {
		if err := w.file.Datasync(); err != nil {
			w.log.Error("wal: fdatasync on close failed", "err", err)
		}
	}
}

// Close writes out what is queued, waits for it, and releases the log. Saves
// after Close return ErrClosed.
func (w *WAL) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	w.closed = true
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
	<-w.exited
	err := w.file.Close()
	if lerr := w.lock.Close(); err == nil {
		err = lerr
	}
	return err
}

// Stats returns cumulative counters.
func (w *WAL) Stats() Stats {
	return Stats{
		Fsyncs:  w.stats.fsyncs.Load(),
		Writes:  w.stats.writes.Load(),
		Batches: w.stats.batches.Load(),
		Records: w.stats.records.Load(),
		Bytes:   w.stats.bytes.Load(),
	}
}

// Compact is DefaultGroup's CompactGroup: the single-group API.
func (w *WAL) Compact(below uint64) error {
	return w.compactGroup(DefaultGroup, below)
}

// compactGroup records that group no longer needs its entries below below,
// which must not exceed the group's durable snapshot mark's index + 1: the
// WAL never drops an entry no snapshot covers. It then removes whole
// segments, oldest first and never the one being written, in which every
// group with entries no longer needs them: each such group's entries there
// are all below that group's own bound. A group that has not compacted
// since Open (bound 0) keeps every segment holding its entries. If the
// newest HardState or snapshot mark of any group lives in a segment about
// to go, they are first rewritten (synced) into the current segment.
func (w *WAL) compactGroup(group, below uint64) error {
	w.compact.Lock()
	defer w.compact.Unlock()

	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	gs := w.group(group)
	snap := gs.durable.snap
	if below > snap.Index+1 {
		w.mu.Unlock()
		return fmt.Errorf("wal: compact group %d below %d: expected at most %d (one past the durable snapshot mark)", group, below, snap.Index+1)
	}
	gs.below = max(gs.below, below)
	n := 0
	for n < len(w.segments)-1 && w.unneededLocked(w.segments[n]) {
		n++
	}
	if n == 0 {
		w.mu.Unlock()
		return nil
	}
	lastGone := w.segments[n-1].seq
	var rewrites []*Pending
	for _, g := range slices.Sorted(maps.Keys(w.groups)) {
		gs := w.groups[g]
		if !(gs.durable.hasHS && gs.durable.hsSeq <= lastGone) && !(gs.durable.hasSnp && gs.durable.smSeq <= lastGone) {
			continue
		}
		if err := w.admitLocked(g, Batch{}); err != nil {
			w.mu.Unlock()
			return err
		}
		// Rewrite the newest queued values, not the newest durable ones:
		// this record goes behind everything queued, and replay takes
		// the last HardState and mark it reads.
		var b Batch
		if gs.stagedSM != nil {
			sm := *gs.stagedSM
			b.Snapshot = &sm
		}
		if gs.stagedHS != nil {
			hs := *gs.stagedHS
			b.HardState = &hs
		}
		p := &Pending{group: g, sync: true, done: make(chan error, 1)}
		if err := p.encode(b, w.tagged); err != nil {
			w.mu.Unlock()
			return err // a hard state and a mark always fit
		}
		w.enqueueLocked(p)
		rewrites = append(rewrites, p)
	}
	gone := make([]uint64, n)
	for i := range gone {
		gone[i] = w.segments[i].seq
	}
	w.mu.Unlock()

	for _, p := range rewrites {
		if err := p.Wait(context.Background()); err != nil {
			return fmt.Errorf("wal: compact: rewrite group %d's hard state and snapshot mark: %w", p.group, err)
		}
	}
	// Oldest first, each removal durable before the next: a crash leaves
	// a shorter prefix removed, never a hole in the sequence.
	for _, seq := range gone {
		path := filepath.Join(w.dir, segmentName(seq))
		if err := w.fs.Remove(path); err != nil {
			return fmt.Errorf("wal: compact: remove %s: %w", path, err)
		}
		if err := w.fs.SyncDir(w.dir); err != nil {
			return fmt.Errorf("wal: compact: sync %s: %w", w.dir, err)
		}
		w.mu.Lock()
		w.segments = w.segments[1:]
		w.mu.Unlock()
	}
	return nil
}

// unneededLocked reports whether no group needs the entries in s: every
// group with entries there has compacted past all of them.
func (w *WAL) unneededLocked(s *segmentInfo) bool {
	for g, maxIndex := range s.maxIndex {
		if maxIndex >= w.group(g).below {
			return false
		}
	}
	return true
}

// Segments returns the sequence numbers of the live segments, oldest first.
func (w *WAL) Segments() []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	seqs := make([]uint64, len(w.segments))
	for i, s := range w.segments {
		seqs[i] = s.seq
	}
	return seqs
}
