package ledger

import (
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/tidaldb/tidal/tidal-server/bugs"
)

// DefaultIDsPerGeneration is the id-memory generation size used when
// Options leaves it zero: a retry is recognised as long as fewer than
// 500,000 other events were applied since the original.
const DefaultIDsPerGeneration = 500000

// MaxBatchLen bounds the events of one log entry (positions are stored as
// uint32 and an API layer should refuse far smaller batches anyway).
const MaxBatchLen = 1 << 20

// Options tune a Ledger. IDsPerGeneration shapes the replicated state (it
// decides when ids are forgotten), so every node must use the same value;
// Restore refuses a snapshot taken with another.
type Options struct {
	IDsPerGeneration int
}

// Ledger is the signal state machine. See the package documentation for
// the semantics. It is safe for concurrent use: Apply, SetApplied and
// Restore take an exclusive lock, the read methods a shared one.
type Ledger struct {
	mu        sync.RWMutex
	schema    Schema
	sigs      []sigSpec
	idsPerGen int

	// (applied, nextPos) is the applied position (see Span): every
	// position of the entries below applied, and positions 0..nextPos-1
	// of the entry at applied, are consumed. nextPos is entryDone once
	// that entry is finished (FinishEntry, SetApplied, Restore).
	applied uint64
	nextPos uint32
	// Entity state, laid out as entities.go describes: ids[s] is the
	// entity of slot s, index maps ids to slots; cells and window records
	// are in chunks (cellAt, cellWins), nwins records allocated so far;
	// spills holds the buckets of windows that outgrew their record.
	index    entityTable
	ids      []uint64
	cells    [][]cell
	wins     [][]winRec
	nwins    int
	spills   spillArena
	keys     int // (entity, signal) pairs with at least one event
	buckets  int // window buckets held, over all keys
	cur, old *generation

	// class is Apply's scratch: per event, the signal index to fold or
	// isDuplicate; seen its table of a large batch's ids (classify).
	// Guarded by mu (exclusive).
	class []int8
	seen  []int32
	// hashes and slots are Apply's scratch for large batches (prefetch.go):
	// each event's id hash and entity slot.
	hashes []uint64
	slots  []int32
}

const isDuplicate int8 = -1

type sigSpec struct {
	name       string
	halfLifeMs float64
	windows    []winSpec
	bucketed   int // windows with a duration: the cell's window records, in winSpec.bucket order
}

type winSpec struct {
	name   string
	width  int64 // bucket width in ms; 0 for the "all" window
	bucket int   // index into the cell's window records (cellWins), -1 for "all"
}

// cell is the state of one (entity, signal) pair; absent while count is 0.
type cell struct {
	count     uint64
	weightSum float64
	anchor    int64   // newest ts folded
	decayed   float64 // Σ w·2^-(anchor-ts)/h
	bkt       uint32  // first of its window records (cellWins)
}

// bucket counts the events whose ts/width == k; a window's buckets are
// kept sorted by k and pruned below anchor/width - BucketsPerWindow.
type bucket struct {
	k int64
	n uint64
}

// idRecord is what the id memory keeps per applied event id: where it
// landed and the payload a retry is compared against.
type idRecord struct {
	index, term uint64
	entity      uint64
	weight      float64
	pos         uint32
	signal      uint16
}

// New returns an empty ledger (applied index 0). It panics if the schema
// does not validate: schemas are checked when loaded, so an invalid one
// here is a caller bug.
func New(s Schema, o Options) *Ledger {
	if err := s.Validate(); err != nil {
		panic(fmt.Sprintf("ledger.New: invalid schema: %v", err))
	}
	if o.IDsPerGeneration <= 0 {
		o.IDsPerGeneration = DefaultIDsPerGeneration
	}
	l := &Ledger{schema: s, idsPerGen: o.IDsPerGeneration}
	for _, st := range s.Signals {
		spec := sigSpec{name: st.Name, halfLifeMs: float64(st.HalfLife) / float64(time.Millisecond)}
		if bugs.Active(bugs.DecayWrongHalfLife) {
			spec.halfLifeMs /= 60 // planted: the half-life's hours taken for minutes
		}
		for _, w := range st.Windows {
			ws := winSpec{name: w.Name, bucket: -1}
			if w.Duration > 0 {
				ws.width = w.Duration.Milliseconds() / BucketsPerWindow
				ws.bucket = spec.bucketed
				spec.bucketed++
			}
			spec.windows = append(spec.windows, ws)
		}
		l.sigs = append(l.sigs, spec)
	}
	l.reset()
	return l
}

func (l *Ledger) reset() {
	l.applied, l.nextPos = 0, entryDone
	l.index = newEntityTable()
	l.ids, l.cells, l.wins, l.nwins, l.spills = nil, nil, nil, 0, spillArena{}
	l.keys, l.buckets = 0, 0
	l.cur = newGeneration(l.idsPerGen)
	l.old = newGeneration(0)
}

// Schema returns the schema the ledger was built with.
func (l *Ledger) Schema() Schema { return l.schema }

// Result is the outcome of one applied batch.
type Result struct {
	Applied    int // events folded
	Duplicates int // events whose id and payload were already applied: acknowledged, not folded
}

// Apply folds the events of the committed log entry at (index, term),
// an entry that carries this one command: ApplyAt at position 0, then
// FinishEntry.
//
// It is atomic: either every event is folded or recognised as a retry and
// the applied index becomes index, or an error is returned and nothing
// changes — not even the applied index. Errors are deterministic functions
// of the state and the batch (so every replica rejects the same entries):
// *EventError for an invalid event, *ConflictError for an id reused with a
// different payload. The caller then marks the entry consumed with
// SetApplied(index). An index not above AppliedIndex wraps
// ErrAlreadyApplied.
func (l *Ledger) Apply(index, term uint64, events []Event) (Result, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	res, err := l.applyAt(index, term, 0, events)
	if err == nil {
		l.finishEntry()
	}
	return res, err
}

// entryDone is nextPos once the entry at the applied index is finished:
// above every position a command can take (MaxBatchLen bounds them).
const entryDone = math.MaxUint32

// Span is how many positions a command that carries n events takes in
// its log entry: one per event, and one for a command that carries none
// (an embedding put, a command that does not decode, an empty batch).
//
// A position is a place inside one log entry, one notion for every kind
// of command. The commands of an entry — one for an ordinary entry,
// several for a packed one — take consecutive spans from position 0, in
// the order they were packed, with no gap and whatever their outcome: a
// refused command consumes its span all the same (Consume). A signals
// command's events are at the positions of its span, in batch order (the
// Location.Position of each). So (index, position) orders every command
// and event of the log, of every kind, alike on every node, on every
// replay and after every restore, and the state's applied position is a
// pair (applied index, next position): a command whose (index, first
// position) is below it was applied already, and is refused with
// ErrAlreadyApplied, the same for every kind, never applied twice.
//
// Every command takes at least one position so that no two commands of
// an entry share a first position: if an embedding put took none, the
// signals packed after it would start at its position and look like its
// replay.
func Span(n int) uint32 {
	if n < 1 {
		return 1
	}
	return uint32(n)
}

// FinishEntry ends the entry whose commands ApplyAt and Consume applied:
// any command of it arriving later is a replay. The id memory rotates
// here, at the entry boundary, by count of ids, never by time — the
// generation dropped holds only ids older than the IDsPerGeneration ids
// now in the previous generation. Apply calls it itself; a caller of
// ApplyAt or Consume calls it after the entry's last command, whatever
// that command's outcome. Finishing a finished entry does nothing.
func (l *Ledger) FinishEntry() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.finishEntry()
}

func (l *Ledger) finishEntry() {
	if l.nextPos == entryDone {
		return
	}
	l.nextPos = entryDone
	if l.cur.len() >= l.idsPerGen {
		l.old = l.cur
		l.cur = newGeneration(l.idsPerGen)
	}
}

// ApplyAt is Apply for one of the commands of the entry at index, its
// events taking the positions first, first+1, … of that entry (see Span:
// the span first..first+Span(len(events))-1). The span must start where
// the previous command of the entry ended: at 0 for the entry's first
// command (index above AppliedIndex), at the applied position for a later
// one. A span starting below the applied position wraps
// ErrAlreadyApplied; one leaving a gap is a caller bug, refused too.
// Like Apply it is atomic, and a refused command leaves the applied
// position where it was: the caller then consumes its span with Consume.
// ApplyAt does not end the entry: call FinishEntry after its last
// command.
func (l *Ledger) ApplyAt(index, term uint64, first uint32, events []Event) (Result, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applyAt(index, term, first, events)
}

// Consume records that a command of the entry at index, which takes
// positions first..first+span-1 (span is Span of its events), was
// consumed without folding signals: an embedding put, or a command
// refused whole. The span must start where the previous command of the
// entry ended, as for ApplyAt; one below the applied position wraps
// ErrAlreadyApplied and changes nothing, so a replayed command of any
// kind is recognised here.
func (l *Ledger) Consume(index uint64, first, span uint32) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.claim(index, first, span); err != nil {
		return err
	}
	l.applied, l.nextPos = index, first+span
	return nil
}

// claim checks that a command may take positions first..first+span-1 of
// the entry at index: that they are the next ones after the applied
// position.
func (l *Ledger) claim(index uint64, first, span uint32) error {
	switch {
	case index < l.applied || index == l.applied && first < l.nextPos:
		if first == 0 {
			return fmt.Errorf("%w: entry index %d, applied index %d", ErrAlreadyApplied, index, l.applied)
		}
		if l.nextPos == entryDone {
			return fmt.Errorf("%w: entry index %d position %d, applied index %d (entry finished)", ErrAlreadyApplied, index, first, l.applied)
		}
		return fmt.Errorf("%w: entry index %d position %d, applied index %d (next position %d)", ErrAlreadyApplied, index, first, l.applied, l.nextPos)
	case index == l.applied && first != l.nextPos:
		return fmt.Errorf("ledger: command of entry %d at position %d, expected position %d, where the entry's previous command ended", index, first, l.nextPos)
	case index > l.applied && first != 0:
		return fmt.Errorf("ledger: first command of entry %d at position %d, expected position 0 (applied index %d)", index, first, l.applied)
	case uint64(first)+uint64(span) > MaxBatchLen:
		return &FieldError{Field: "events", Message: fmt.Sprintf("expected at most %d positions in one entry, found %d from position %d", MaxBatchLen, span, first)}
	}
	return nil
}

func (l *Ledger) applyAt(index, term uint64, first uint32, events []Event) (Result, error) {
	if err := l.claim(index, first, Span(len(events))); err != nil {
		return Result{}, err
	}
	l.class = slices.Grow(l.class[:0], len(events))[:len(events)]
	var hashes []uint64
	if len(events) >= prefetchMin {
		l.hashes = l.idHashes(events, l.hashes)
		hashes = l.hashes
	}
	if n := seenTableSize(len(events)); cap(l.seen) < n {
		l.seen = make([]int32, n)
	}
	err := l.classify(events, l.class, l.seen, hashes)
	if err != nil {
		return Result{}, err
	}
	if hashes != nil {
		l.slots = l.prefetchFold(events, l.class, l.slots)
	}
	var res Result
	for i := range events {
		e := &events[i]
		si := l.class[i]
		if si == isDuplicate {
			res.Duplicates++
			continue
		}
		rec := idRecord{index: index, term: term, entity: e.Entity, weight: e.Weight, pos: first + uint32(i), signal: uint16(si)}
		if hashes != nil {
			l.cur.addHashed(e.ID, hashes[i], rec)
		} else {
			l.cur.add(e.ID, rec)
		}
		l.fold(e, int(si))
		res.Applied++
	}
	l.applied, l.nextPos = index, first+Span(len(events))
	return res, nil
}

// Check reports the error Apply would return for this batch against the
// current state (invalid events, ids reused with another payload, within
// the batch or against remembered ids), without changing anything. The
// node calls it before proposing to answer 400/409 early; Apply stays
// authoritative because the state may change before the entry commits.
func (l *Ledger) Check(events []Event) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var hashes []uint64
	if len(events) >= prefetchMin {
		hashes = l.idHashes(events, make([]uint64, 0, len(events)))
	}
	return l.classify(events, make([]int8, len(events)), nil, hashes)
}

// classify validates the batch and sets class[i] to the signal index of
// event i, or isDuplicate for a retry of an applied event or of an earlier
// event of the same batch. It reads but never writes ledger state.
//
// seen is scratch classify may use for the ids of a large batch (Apply's,
// so a large batch does not allocate every time); it is allocated when
// shorter than seenTableSize. hashes, when not nil, holds every event's
// id hash (idHashes).
func (l *Ledger) classify(events []Event, class []int8, seen []int32, hashes []uint64) error {
	if len(events) > MaxBatchLen {
		return &FieldError{Field: "events", Message: fmt.Sprintf("expected at most %d events in one entry, found %d", MaxBatchLen, len(events))}
	}
	// Earlier events of this batch by id; a linear scan is cheaper for
	// the common small batches. A large batch's go in an open-addressing
	// table of event numbers keyed by the id hashes (which the id memory
	// lookups need anyway): a Go map of strings hashed every id again and
	// was 4% of a follower's CPU under 100-event batches.
	var table []int32
	var tmask uint64
	if len(events) > linearSeenMax {
		if hashes == nil {
			hashes = make([]uint64, len(events))
			for i := range events {
				hashes[i] = maphash.String(idSeed, events[i].ID)
			}
		}
		n := seenTableSize(len(events))
		if cap(seen) < n {
			seen = make([]int32, n)
		}
		table, tmask = seen[:n], uint64(n-1)
		clear(table)
	}
	// Invalid events are reported before conflicts: whether a batch is
	// well-formed must not depend on the state it meets.
	for i := range events {
		if fe := l.schema.ValidateEvent(events[i]); fe != nil {
			return &EventError{Index: i, Err: fe}
		}
	}
	for i := range events {
		e := &events[i]
		si := l.schema.signalIndex(e.Signal)
		class[i] = int8(si)
		var rec idRecord
		var ok bool
		if hashes != nil {
			rec, ok = l.rememberedHashed(e.ID, hashes[i])
		} else {
			rec, ok = l.remembered(e.ID)
		}
		if ok {
			if rec.entity != e.Entity || int(rec.signal) != si || math.Float64bits(rec.weight) != math.Float64bits(e.Weight) {
				return l.conflict(i, e, l.location(e.ID, rec))
			}
			class[i] = isDuplicate
			continue
		}
		j := -1
		if table != nil {
			for k := hashes[i] & tmask; ; k = (k + 1) & tmask {
				p := table[k]
				if p == 0 {
					table[k] = int32(i + 1)
					break
				}
				if events[p-1].ID == e.ID {
					j = int(p - 1)
					break
				}
			}
		} else {
			for p := range i {
				if events[p].ID == e.ID {
					j = p
					break
				}
			}
		}
		if j >= 0 {
			p := &events[j]
			if p.Entity != e.Entity || p.Signal != e.Signal || math.Float64bits(p.Weight) != math.Float64bits(e.Weight) {
				return l.conflict(i, e, Location{ID: p.ID, Position: j, Entity: p.Entity, Signal: p.Signal, Weight: p.Weight})
			}
			class[i] = isDuplicate
		}
	}
	return nil
}

// linearSeenMax is the largest batch whose in-batch duplicates classify
// finds by a linear scan; a variable so tests can compare the two ways.
var linearSeenMax = 16

// seenTableSize is the slots classify's in-batch table has for n events:
// a power of two, at most half full.
func seenTableSize(n int) int {
	size := 32
	for size < 2*n {
		size *= 2
	}
	return size
}

func (l *Ledger) conflict(i int, e *Event, prev Location) error {
	return &ConflictError{Index: i, ID: e.ID, Entity: e.Entity, Signal: e.Signal, Weight: e.Weight, Previous: prev}
}

func (l *Ledger) remembered(id string) (idRecord, bool) {
	if rec, ok := l.cur.get(id); ok {
		return rec, true
	}
	return l.old.get(id)
}

func (l *Ledger) rememberedHashed(id string, hash uint64) (idRecord, bool) {
	if rec, ok := l.cur.getHashed(id, hash); ok {
		return rec, true
	}
	return l.old.getHashed(id, hash)
}

func (l *Ledger) fold(e *Event, si int) {
	slot := l.entitySlot(e.Entity)
	if slot < 0 {
		slot = l.addEntity(e.Entity)
	}
	spec := &l.sigs[si]
	c := l.cellAt(slot, si)
	if c.count == 0 {
		l.present(c, spec, e.TS)
	}
	c.count++
	c.weightSum += e.Weight
	c.decayed, c.anchor = foldDecayed(c.decayed, c.anchor, e.TS, e.Weight, spec.halfLifeMs)
	ws := l.cellWins(c, spec)
	for _, w := range spec.windows {
		if w.bucket < 0 {
			continue
		}
		r := &ws[w.bucket]
		bs := l.winBuckets(r)
		before := len(bs)
		bs = addToBuckets(bs, e.TS/w.width, c.anchor/w.width)
		l.setWinBuckets(r, bs)
		l.buckets += len(bs) - before
	}
}

// addToBuckets counts one event in bucket k of a window whose newest
// bucket is top, pruning buckets that no read at or after the anchor can
// reach (k < top - BucketsPerWindow).
func addToBuckets(bs []bucket, k, top int64) []bucket {
	lo := top - BucketsPerWindow
	drop := 0
	for drop < len(bs) && bs[drop].k < lo {
		drop++
	}
	if drop > 0 {
		bs = bs[:copy(bs, bs[drop:])]
	}
	if k < lo {
		return bs
	}
	i := len(bs)
	for i > 0 && bs[i-1].k > k {
		i--
	}
	if i > 0 && bs[i-1].k == k {
		bs[i-1].n++
		return bs
	}
	if bs == nil {
		bs = make([]bucket, 0, 4)
	}
	if len(bs) == cap(bs) {
		// Past a record's inline buckets: room for a few more at once.
		bs = slices.Grow(bs, max(4, len(bs)))
	}
	bs = append(bs, bucket{})
	copy(bs[i+1:], bs[i:])
	bs[i] = bucket{k: k, n: 1}
	return bs
}

// windowCount sums the buckets a read at `at` covers: the bucket holding
// at and the BucketsPerWindow before it.
func windowCount(bs []bucket, width, at int64) uint64 {
	top := at / width
	if at%width != 0 && at < 0 {
		top-- // floor division: at comes from callers and may be anything
	}
	if bugs.Active(bugs.WindowOffByOneBucket) {
		top-- // planted: the window ends a bucket early, so it starts one early too
	}
	lo := top - BucketsPerWindow
	var n uint64
	for _, b := range bs {
		if b.k >= lo && b.k <= top {
			n += b.n
		}
	}
	return n
}

// AppliedIndex is the log index of the last entry applied or marked
// consumed.
func (l *Ledger) AppliedIndex() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.applied
}

// SetApplied records that the entries up to index were consumed, and the
// entry at index finished, without folding signals (raft no-ops,
// configuration changes, a batch Apply rejected). Setting the current
// index again only finishes its entry, so callers may call it after
// every entry; going backwards panics, since it means entries are being
// replayed into a state that already holds them.
func (l *Ledger) SetApplied(index uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if index < l.applied {
		panic(fmt.Sprintf("ledger: SetApplied(%d) below applied index %d", index, l.applied))
	}
	l.applied, l.nextPos = index, entryDone
}

// EntryOpen reports whether the entry at the applied index has commands
// applied (ApplyAt, Consume) but is not finished (FinishEntry). State is
// only ever captured at an entry boundary, where it is false: a snapshot
// records the applied index alone, and restores to a finished entry.
func (l *Ledger) EntryOpen() bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.nextPos != entryDone
}

// EntityView is what the ledger knows about one entity at a given time.
// Signals holds every signal type of the schema, zero when no event of
// that type was applied.
type EntityView struct {
	Entity  uint64
	Signals map[string]SignalView
}

// SignalView holds one (entity, signal) pair's aggregates. Score is the
// decayed score and Windows the windowed counts, both evaluated at the
// time the view was asked for; Windows has one entry per schema window.
type SignalView struct {
	Count     uint64
	WeightSum float64
	Score     float64
	Windows   map[string]uint64
}

// Get returns the entity's aggregates evaluated at `at` (unix ms).
func (l *Ledger) Get(entity uint64, at int64) EntityView {
	l.mu.RLock()
	defer l.mu.RUnlock()
	v := EntityView{Entity: entity, Signals: make(map[string]SignalView, len(l.sigs))}
	slot := l.entitySlot(entity)
	for si := range l.sigs {
		spec := &l.sigs[si]
		var c *cell
		if slot >= 0 {
			if c = l.cellAt(slot, si); c.count == 0 {
				c = nil
			}
		}
		sv := SignalView{Windows: make(map[string]uint64, len(spec.windows))}
		for _, w := range spec.windows {
			sv.Windows[w.name] = l.windowValue(c, spec, w, at)
		}
		if c != nil {
			sv.Count, sv.WeightSum = c.count, c.weightSum
			sv.Score = decayedAt(c.decayed, c.anchor, at, spec.halfLifeMs)
		}
		v.Signals[spec.name] = sv
	}
	return v
}

func (l *Ledger) windowValue(c *cell, spec *sigSpec, w winSpec, at int64) uint64 {
	switch {
	case c == nil:
		return 0
	case w.bucket < 0:
		return c.count
	default:
		return windowCount(l.winBuckets(&l.cellWins(c, spec)[w.bucket]), w.width, at)
	}
}

// Ranked is one entry of a top-k answer.
type Ranked struct {
	Entity uint64
	Value  float64
}

// Top returns the k entities with the highest value for the signal: the
// decayed score at `at` when window is "", otherwise the count in that
// window at `at`. Ties go to the lower entity id; entities whose value is
// zero are left out. The scan is exhaustive (O(entities · log k)).
func (l *Ledger) Top(signal, window string, k int, at int64) ([]Ranked, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	si := l.schema.signalIndex(signal)
	if si < 0 {
		return nil, &FieldError{Field: "signal", Message: fmt.Sprintf("unknown signal %q (schema declares %s)", signal, l.schema.signalNames())}
	}
	spec := &l.sigs[si]
	wi := -1
	if window != "" {
		for i, w := range spec.windows {
			if w.name == window {
				wi = i
			}
		}
		if wi < 0 {
			names := make([]string, len(spec.windows))
			for i, w := range spec.windows {
				names[i] = w.name
			}
			return nil, &FieldError{Field: "window", Message: fmt.Sprintf("signal %q has no window %q (expected \"\" for the decayed score or one of %q)", signal, window, names)}
		}
	}
	if k <= 0 {
		return nil, &FieldError{Field: "k", Message: fmt.Sprintf("expected k >= 1, found %d", k)}
	}
	h := make(rankHeap, 0, min(k, len(l.ids)))
	for slot, id := range l.ids {
		c := l.cellAt(slot, si)
		if c.count == 0 {
			continue
		}
		var v float64
		if wi < 0 {
			v = decayedAt(c.decayed, c.anchor, at, spec.halfLifeMs)
		} else {
			v = float64(l.windowValue(c, spec, spec.windows[wi], at))
		}
		if v == 0 {
			continue
		}
		r := Ranked{Entity: id, Value: v}
		if len(h) < k {
			h.push(r)
		} else if ranksBefore(r, h[0]) {
			h[0] = r
			h.down(0)
		}
	}
	out := []Ranked(h)
	sort.Slice(out, func(i, j int) bool { return ranksBefore(out[i], out[j]) })
	return out, nil
}

func ranksBefore(a, b Ranked) bool {
	if a.Value != b.Value {
		return a.Value > b.Value
	}
	return a.Entity < b.Entity
}

// rankHeap is a min-heap by rank: the root is the entry that ranks last,
// the one a better candidate evicts.
type rankHeap []Ranked

func (h *rankHeap) push(r Ranked) {
	*h = append(*h, r)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !ranksBefore(s[p], s[i]) {
			break
		}
		s[p], s[i] = s[i], s[p]
		i = p
	}
}

func (h rankHeap) down(i int) {
	for {
		worst := i
		for _, c := range []int{2*i + 1, 2*i + 2} {
			if c < len(h) && ranksBefore(h[worst], h[c]) {
				worst = c
			}
		}
		if worst == i {
			return
		}
		h[i], h[worst] = h[worst], h[i]
		i = worst
	}
}

// Location is where an applied event landed. Position is the event's
// place in its entry's batch.
type Location struct {
	ID       string
	Index    uint64
	Term     uint64
	Position int
	Entity   uint64
	Signal   string
	Weight   float64
}

func (l *Ledger) location(id string, r idRecord) Location {
	return Location{ID: id, Index: r.index, Term: r.term, Position: int(r.pos), Entity: r.entity, Signal: l.sigs[r.signal].name, Weight: r.weight}
}

// Lookup reports where the event with this id was applied, if the id is
// still remembered (see the package documentation for how long that is).
func (l *Ledger) Lookup(id string) (Location, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	rec, ok := l.remembered(id)
	if !ok {
		return Location{}, false
	}
	return l.location(id, rec), true
}

// AuditEvents calls fn for every remembered applied event id in (index,
// position) order, stopping at fn's first error. It is CaptureAudit
// followed by the capture's Each: fn runs without the lock.
func (l *Ledger) AuditEvents(fn func(Location) error) error {
	return l.CaptureAudit().Each(fn)
}

// AuditLog is the id memory as it was at one moment, to be walked later
// without the ledger's lock while Apply goes on. It shares the
// generations' records the way Captured does (ids are only appended, a
// full generation is replaced rather than reused), so capturing one costs
// a copy of each generation's chunk headers, not of its ids.
type AuditLog struct {
	sigs     []sigSpec
	applied  uint64
	old, cur generation // chunk headers only; no index
}

// CaptureAudit takes the id memory as it is now (see AuditLog), holding
// the shared lock for a copy of the chunk headers.
func (l *Ledger) CaptureAudit() *AuditLog {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return &AuditLog{sigs: l.sigs, applied: l.applied, old: l.old.frozen(), cur: l.cur.frozen()}
}

// AppliedIndex is the applied index of the ledger at the capture.
func (a *AuditLog) AppliedIndex() uint64 { return a.applied }

// Each calls fn for every id the ledger remembered at the capture, in
// (index, position) order, stopping at fn's first error. It may be
// called more than once, from any goroutine.
func (a *AuditLog) Each(fn func(Location) error) error {
	for _, gen := range []*generation{&a.old, &a.cur} {
		for ci := range gen.chunks {
			c := &gen.chunks[ci]
			for i := range c.recs {
				r := &c.recs[i]
				loc := Location{ID: string(gen.idAt(r, c)), Index: r.index, Term: r.term, Position: int(r.pos),
					Entity: r.entity, Signal: a.sigs[r.signal].name, Weight: r.weight}
				if err := fn(loc); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Stats summarises the state's size.
type Stats struct {
	AppliedIndex     uint64
	Entities         int // entities with at least one event
	Keys             int // (entity, signal) pairs with at least one event
	Buckets          int // window buckets held
	IDs              int // event ids remembered, both generations
	IDsCurrent       int // ids in the current generation
	IDsPerGeneration int // at most 2·IDsPerGeneration + (one entry's batch) ids are remembered
}

// Stats returns the current sizes.
func (l *Ledger) Stats() Stats {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return Stats{
		AppliedIndex:     l.applied,
		Entities:         len(l.ids),
		Keys:             l.keys,
		Buckets:          l.buckets,
		IDs:              l.cur.len() + l.old.len(),
		IDsCurrent:       l.cur.len(),
		IDsPerGeneration: l.idsPerGen,
	}
}
