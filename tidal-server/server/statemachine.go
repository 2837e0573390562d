package server

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// StateMachine is tidal's replicated state: the signal ledger, the
// embedding store, and the memory of embedding write ids. It implements
// replica.StateMachine; reads take the read lock, apply the write lock.
//
// Invariant: the state after applying entries 1..n is a function of those
// entries alone (no clock, no randomness, no map iteration order), so
// equal logs give equal Digests on every node.
type StateMachine struct {
	mu      sync.RWMutex
	schema  ledger.Schema
	ledger  *ledger.Ledger
	vectors *vectors.Store
	embeds  *writeMemory
	applied uint64
	opts    ledger.Options
	planted plantedState // empty unless built with -tags tidalbugs

	// Apply's scratch (under mu): the decoded events of one entry, and
	// the schema's signal names that decoded events share instead of
	// allocating their own.
	events      []ledger.Event
	signalNames []string
	packNext    uint32       // the position after the last command applied of the entry being applied (ledger.Span)
	format2     format2Entry // the format-2 packed entry being applied (format2.go)

	// digesting serializes Digest's hashing (see Digest); never held
	// with mu by anything but Digest, which takes it first.
	digesting sync.Mutex
	idsMemo   struct { // under digesting: the encoding of ids
		ids writeIDs
		enc []byte
	}

	// afterLedgerDigest, when set (tests only, before any Digest), runs
	// in Digest between hashing the ledger and hashing the vectors, with
	// the lock released; it is given the applied index pinned.
	afterLedgerDigest func(applied uint64)
}

// SignalsResult is what applying a signals command returns to its proposer.
type SignalsResult struct {
	Applied, Duplicates int
	Err                 error // *ledger.ConflictError, or a decode error
}

// EmbeddingResult is what applying an embedding put returns.
type EmbeddingResult struct {
	Duplicate bool
	Err       error // *EmbeddingConflictError, or a validation/decode error
}

// EmbeddingConflictError reports an embedding write id reused for another
// entity or vector.
type EmbeddingConflictError struct {
	ID            string
	Entity        uint64
	PreviousIndex uint64
}

// Conflict names the field at fault for the API.
func (e *EmbeddingConflictError) Conflict() string { return "id" }

func (e *EmbeddingConflictError) Error() string {
	return fmt.Sprintf("id: embedding write id %q was applied at log index %d with a different entity or vector (entity %d)", e.ID, e.PreviousIndex, e.Entity)
}

// NewStateMachine returns an empty state for schema.
func NewStateMachine(schema ledger.Schema, opts ledger.Options) *StateMachine {
	names := make([]string, len(schema.Signals))
	for i, st := range schema.Signals {
		names[i] = st.Name
	}
	return &StateMachine{
		signalNames: names,
		schema:      schema,
		ledger:      ledger.New(schema, opts),
		vectors:     vectors.New(schema.EmbeddingDim),
		embeds:      newWriteMemory(opts.IDsPerGeneration),
		opts:        opts,
	}
}

// Apply implements replica.StateMachine.
func (s *StateMachine) Apply(index, term uint64, data []byte) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(replica.AppEntry{Index: index, Term: term, Data: data, Subs: 1})
}

// ApplyBatch implements replica.BatchStateMachine: the entries of one raft
// Ready are applied under one lock, exactly as Apply would one by one.
// A packed entry's commands always arrive whole within one call
// (replica.AppEntry), so the state between calls — all a snapshot can
// capture — is at an entry boundary.
func (s *StateMachine) ApplyBatch(entries []replica.AppEntry) []any {
	out := make([]any, len(entries))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, e := range entries {
		out[i] = s.applyLocked(e)
	}
	return out
}

// applyLocked applies one command of the entry at e.Index: the entry's
// only one, or command e.Sub of a packed entry.
//
// Every command of an entry takes a span of the entry's positions
// (ledger.Span: one per event of a signals command, one for any other
// command), consecutive from 0 in packed order, whatever the command's
// kind and outcome. The span is a function of the entry alone — packNext
// restarts at every entry's first command — so a replay of the entry,
// live or after a restore, presents every command at the same position
// again, and the ledger, which holds the one applied position of the
// whole state, refuses each as ErrAlreadyApplied. A packed entry in the
// envelope of entry format 2 keeps that format's rule (format2.go).
func (s *StateMachine) applyLocked(e replica.AppEntry) any {
	if e.PackFormat == replica.PackedEntryFormat {
		return s.applyFormat2(e)
	}
	if e.Sub == 0 {
		s.packNext = 0
	}
	first := s.packNext
	res, span := s.applyCommand(e.Index, e.Term, first, e.Data)
	s.packNext = first + span
	if e.Index > s.applied {
		s.applied = e.Index
	}
	if e.Sub == e.Subs-1 {
		// The last command ends the entry, whatever its outcome: the id
		// memory rotates at entry boundaries only.
		s.ledger.FinishEntry()
	}
	return res
}

// applyCommand applies the command data at positions first.. of the entry
// at index and returns its result and span.
func (s *StateMachine) applyCommand(index, term uint64, first uint32, data []byte) (any, uint32) {
	if len(data) == 0 {
		s.ledger.Consume(index, first, ledger.Span(0)) // a replay of nothing is nothing
		return nil, ledger.Span(0)
	}
	switch data[0] {
	case kindSignals:
		events, err := decodeSignalsInto(s.events[:0], data, s.signalNames)
		s.events = events[:0]
		defer clear(events) // the next entry must not see (or retain) these
		if err != nil {
			// Undecodable: no events, so the span of a command without any.
			return SignalsResult{Err: s.consumeRefused(index, first, ledger.Span(0), err)}, ledger.Span(0)
		}
		events = s.plantedRefold(index, events)
		span := ledger.Span(len(events))
		res, err := s.ledger.ApplyAt(index, term, first, events)
		if err != nil {
			// A conflict leaves the ledger as it was, on every node alike;
			// the span is still consumed.
			return SignalsResult{Err: s.consumeRefused(index, first, span, err)}, span
		}
		return SignalsResult{Applied: res.Applied, Duplicates: res.Duplicates}, span
	case kindEmbedding:
		span := ledger.Span(0)
		if err := s.ledger.Consume(index, first, span); err != nil {
			return EmbeddingResult{Err: err}, span
		}
		p, err := decodeEmbedding(data)
		if err != nil {
			return EmbeddingResult{Err: err}, span
		}
		return s.applyEmbedding(index, p), span
	}
	err := fmt.Errorf("unknown command kind %d at index %d", data[0], index)
	return SignalsResult{Err: s.consumeRefused(index, first, ledger.Span(0), err)}, ledger.Span(0)
}

// consumeRefused takes the span of a command refused with err and returns
// the error to answer: err, or the replay error if the command was
// applied already (ApplyAt reports a replay before any other refusal).
func (s *StateMachine) consumeRefused(index uint64, first, span uint32, err error) error {
	if errors.Is(err, ledger.ErrAlreadyApplied) {
		return err
	}
	if cerr := s.ledger.Consume(index, first, span); cerr != nil {
		return cerr
	}
	return err
}

func (s *StateMachine) applyEmbedding(index uint64, p embeddingPut) EmbeddingResult {
	h := vectorHash(p.Entity, p.Vector)
	if prev, ok := s.embeds.get(p.ID); ok {
		if prev.hash == h {
			return EmbeddingResult{Duplicate: true}
		}
		return EmbeddingResult{Err: &EmbeddingConflictError{ID: p.ID, Entity: p.Entity, PreviousIndex: prev.index}}
	}
	if fe := s.vectors.Validate(p.Vector); fe != nil {
		return EmbeddingResult{Err: fe}
	}
	if bugs.Active(bugs.IgnoreEmbeddingOverwrite) {
		if _, had := s.vectors.Get(p.Entity); had {
			s.embeds.put(p.ID, writeRecord{index: index, hash: h}) // planted: acknowledged, old vector kept
			return EmbeddingResult{}
		}
	}
	if err := s.vectors.Put(p.Entity, p.Vector); err != nil {
		return EmbeddingResult{Err: err}
	}
	s.embeds.put(p.ID, writeRecord{index: index, hash: h})
	return EmbeddingResult{}
}

func vectorHash(entity uint64, v []float32) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], entity)
	h.Write(b[:])
	for _, f := range v {
		binary.LittleEndian.PutUint32(b[:4], math.Float32bits(f))
		h.Write(b[:4])
	}
	return h.Sum64()
}

// SetApplied implements replica.StateMachine.
func (s *StateMachine) SetApplied(index uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applied = index
	s.ledger.SetApplied(index)
}

// Snapshot format: "TSM1" | u64 applied | 3 × (u64 len | section), the
// sections being the ledger, the vectors and the embedding write ids.
const smMagic = "TSM1"

// Snapshot implements replica.StateMachine. The lock is held only while
// the state is captured (CaptureSnapshot), not while it is encoded.
func (s *StateMachine) Snapshot(w io.Writer) error {
	encode, err := s.CaptureSnapshot()
	if err != nil {
		return err
	}
	return encode(w)
}

// CaptureSnapshot implements replica.SnapshotCapturer: it takes the state
// as it is now, under the read lock, and returns what encodes it later
// (into the bytes Snapshot would have written now), from any goroutine
// and while Apply goes on. The two large sections are taken without being
// encoded: the ledger copied (ledger.Captured: aggregates copied, the
// append-only id memory shared) and the vector store frozen
// (vectors.Store.Freeze: copy-on-write chunks); only the embedding write
// ids, which are small, are encoded here.
func (s *StateMachine) CaptureSnapshot() (func(io.Writer) error, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ledger.EntryOpen() {
		// Never: ApplyBatch applies a packed entry whole under the lock.
		// A snapshot records the applied index alone, which means "that
		// entry whole"; one taken inside an entry would, once restored,
		// skip the entry's remaining commands.
		return nil, fmt.Errorf("state snapshot at applied index %d: the entry there is partly applied (expected capture at an entry boundary)", s.applied)
	}
	applied := s.applied
	led := s.ledger.Capture()
	store := s.vectors
	if bugs.Active(bugs.DropVectorsInSnapshot) {
		store = vectors.New(s.schema.EmbeddingDim) // planted: an empty store in place of ours
	}
	vecs := store.Freeze()
	ids := s.embeds.capture()
	return func(w io.Writer) error {
		var ebuf bytes.Buffer
		if err := ids.encode(&ebuf); err != nil {
			return err
		}
		if b, ok := w.(snapshotBuffer); ok {
			return encodeInto(b, applied, led, vecs, &ebuf)
		}
		var lbuf bytes.Buffer
		if err := led.Snapshot(&lbuf); err != nil {
			return err
		}
		bw := bufio.NewWriter(w)
		bw.WriteString(smMagic)
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], applied)
		bw.Write(n[:])
		binary.LittleEndian.PutUint64(n[:], uint64(lbuf.Len()))
		bw.Write(n[:])
		bw.Write(lbuf.Bytes())
		binary.LittleEndian.PutUint64(n[:], uint64(vecs.Size()))
		bw.Write(n[:])
		if _, err := vecs.WriteTo(bw); err != nil {
			return err
		}
		binary.LittleEndian.PutUint64(n[:], uint64(ebuf.Len()))
		bw.Write(n[:])
		bw.Write(ebuf.Bytes())
		return bw.Flush()
	}, nil
}

// snapshotBuffer is a bytes.Buffer, or a writer around one (the replica
// paces its encoder: replica.pacedBuffer), whose bytes can be patched
// after they are written.
type snapshotBuffer interface {
	io.Writer
	io.StringWriter
	Len() int
	Bytes() []byte
}

// encodeInto writes the snapshot into b with the ledger's section, the
// largest after the vectors, encoded in place and its length filled in
// afterwards, so that the section is not built in a buffer of its own and
// copied: a snapshot is encoded (by the replica, into a buffer) while the
// node serves. The frozen vectors write straight into b.
func encodeInto(b snapshotBuffer, applied uint64, led *ledger.Captured, vecs *vectors.View, ebuf *bytes.Buffer) error {
	var n [8]byte
	b.WriteString(smMagic)
	binary.LittleEndian.PutUint64(n[:], applied)
	b.Write(n[:])
	at := b.Len()
	b.Write(n[:]) // the ledger section's length, once known
	if err := led.Snapshot(b); err != nil {
		return err
	}
	binary.LittleEndian.PutUint64(b.Bytes()[at:], uint64(b.Len()-at-8))
	binary.LittleEndian.PutUint64(n[:], uint64(vecs.Size()))
	b.Write(n[:])
	if _, err := vecs.WriteTo(b); err != nil {
		return err
	}
	binary.LittleEndian.PutUint64(n[:], uint64(ebuf.Len()))
	b.Write(n[:])
	b.Write(ebuf.Bytes())
	return nil
}

// Restore implements replica.StateMachine.
func (s *StateMachine) Restore(r io.Reader) error {
	br := bufio.NewReader(r)
	head := make([]byte, len(smMagic)+8)
	if _, err := io.ReadFull(br, head); err != nil {
		return fmt.Errorf("state snapshot header: %w", err)
	}
	if string(head[:4]) != smMagic {
		return fmt.Errorf("state snapshot: magic %q, expected %q", head[:4], smMagic)
	}
	applied := binary.LittleEndian.Uint64(head[4:])
	l := ledger.New(s.schema, s.opts)
	v := vectors.New(s.schema.EmbeddingDim)
	e := newWriteMemory(s.opts.IDsPerGeneration)
	names := []string{"ledger", "vectors", "embedding ids"}
	restores := []func(io.Reader) error{l.Restore, v.Restore, e.restore}
	for i, restore := range restores {
		var n [8]byte
		if _, err := io.ReadFull(br, n[:]); err != nil {
			return fmt.Errorf("state snapshot: %s section length: %w", names[i], err)
		}
		size := binary.LittleEndian.Uint64(n[:])
		lr := io.LimitReader(br, int64(size))
		if err := restore(lr); err != nil {
			return fmt.Errorf("state snapshot: %s section: %w", names[i], err)
		}
		// Sections must consume exactly their length.
		if rest, _ := io.Copy(io.Discard, lr); rest != 0 {
			return fmt.Errorf("state snapshot: %s section has %d unread bytes", names[i], rest)
		}
	}
	s.mu.Lock()
	s.ledger, s.vectors, s.embeds, s.applied = l, v, e, applied
	s.mu.Unlock()
	return nil
}

// Digest is a hash of the whole canonical state and the index it reflects.
//
// The state is pinned under the read lock, which costs O(chunks), not
// O(state): the ledger captured (ledger.Captured), the vectors pinned
// (vectors.QueryView) and the embedding write ids cut at their length
// (writeIDs). Hashing all of it, hundreds of megabytes with a large
// vector store, happens after the lock is released, so Apply goes on
// meanwhile, and the digest is still exactly the state's at the applied
// index it returns.
//
// One digest hashes at a time (digesting): each keeps a core busy for
// its whole length, and concurrent callers must not take every core of a
// small node from apply; a caller that waits pins the state as of its own
// turn. (The node also paces the digests it serves: node.Digest.) The
// embedding ids' encoding is remembered between digests while they do
// not change (idsMemo).
func (s *StateMachine) Digest() (uint64, string) {
	s.digesting.Lock()
	defer s.digesting.Unlock()
	s.mu.RLock()
	applied := s.applied
	led := s.ledger.Capture()
	vecs := s.vectors.PinQuery()
	ids := s.embeds.capture()
	s.mu.RUnlock()
	defer vecs.Release()

	h := sha256.New()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], applied)
	h.Write(n[:])
	h.Write([]byte(led.Digest()))
	if s.afterLedgerDigest != nil {
		s.afterLedgerDigest(applied)
	}
	h.Write([]byte(vecs.Digest()))
	if s.idsMemo.enc == nil || !s.idsMemo.ids.same(ids) {
		var b bytes.Buffer
		ids.encode(&b)
		s.idsMemo.ids, s.idsMemo.enc = ids, b.Bytes()
	}
	h.Write(s.idsMemo.enc)
	return applied, hex.EncodeToString(h.Sum(nil))
}

// Read runs fn under the read lock.
func (s *StateMachine) Read(fn func(l *ledger.Ledger, v *vectors.Store, applied uint64)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	fn(s.ledger, s.vectors, s.applied)
}

// writeMemory remembers embedding write ids the way the ledger remembers
// event ids: two generations rotated by count of ids applied, which is a
// function of log position, never of wall-clock time.
//
// Each generation keeps its ids in a log that is only appended to (the
// map indexes it), and a full generation is replaced, never reused, so a
// capture (writeIDs) is two slice headers: readers sort and encode it
// without the state machine's lock while Apply goes on appending.
type writeMemory struct {
	perGen  int
	current *writeGen
	older   *writeGen
}

type writeGen struct {
	at  map[string]int32 // id -> its place in log
	log []writeEntry
}

type writeEntry struct {
	id string
	writeRecord
}

type writeRecord struct {
	index uint64
	hash  uint64
}

func newWriteGen() *writeGen { return &writeGen{at: map[string]int32{}} }

func (g *writeGen) add(e writeEntry) {
	g.at[e.id] = int32(len(g.log))
	g.log = append(g.log, e)
}

func newWriteMemory(perGen int) *writeMemory {
	if perGen <= 0 {
		perGen = 500000
	}
	return &writeMemory{perGen: perGen, current: newWriteGen(), older: newWriteGen()}
}

func (m *writeMemory) get(id string) (writeRecord, bool) {
	for _, g := range []*writeGen{m.current, m.older} {
		if i, ok := g.at[id]; ok {
			return g.log[i].writeRecord, true
		}
	}
	return writeRecord{}, false
}

func (m *writeMemory) put(id string, r writeRecord) {
	if len(m.current.log) >= m.perGen {
		m.older, m.current = m.current, newWriteGen()
	}
	m.current.add(writeEntry{id: id, writeRecord: r})
}

// writeIDs is the write memory at one moment (see writeMemory): each
// generation's log, cut at its length then. Entries below that length
// are never written again.
type writeIDs struct {
	older, current []writeEntry
}

// same reports whether c and d are the same ids: cut from the same logs
// at the same lengths. A log's entries below a length never change, and
// c holding its array keeps the address from being reused.
func (c writeIDs) same(d writeIDs) bool {
	return unsafe.SliceData(c.older) == unsafe.SliceData(d.older) && len(c.older) == len(d.older) &&
		unsafe.SliceData(c.current) == unsafe.SliceData(d.current) && len(c.current) == len(d.current)
}

// capture takes the ids as they are now; called under the state
// machine's lock, it copies nothing.
func (m *writeMemory) capture() writeIDs {
	o, c := m.older.log, m.current.log
	return writeIDs{older: o[:len(o):len(o)], current: c[:len(c):len(c)]}
}

func (m *writeMemory) snapshot(w io.Writer) error { return m.capture().encode(w) }

// encode writes the canonical encoding: per generation, older first, the
// id count and every (id, index, hash) in ascending id order. It sorts
// copies, never the captured logs, which other captures share.
func (c writeIDs) encode(w io.Writer) error {
	bw := bufio.NewWriter(w)
	for _, gen := range [][]writeEntry{c.older, c.current} {
		sorted := slices.Clone(gen)
		slices.SortFunc(sorted, func(a, b writeEntry) int { return strings.Compare(a.id, b.id) })
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(sorted)))
		bw.Write(n[:])
		for _, e := range sorted {
			binary.LittleEndian.PutUint16(n[:2], uint16(len(e.id)))
			bw.Write(n[:2])
			bw.WriteString(e.id)
			binary.LittleEndian.PutUint64(n[:], e.index)
			bw.Write(n[:])
			binary.LittleEndian.PutUint64(n[:], e.hash)
			bw.Write(n[:])
		}
	}
	return bw.Flush()
}

func (m *writeMemory) restore(r io.Reader) error {
	br := bufio.NewReader(r)
	gens := []*writeGen{newWriteGen(), newWriteGen()}
	for g, gen := range gens {
		var n [8]byte
		if _, err := io.ReadFull(br, n[:]); err != nil {
			return fmt.Errorf("generation %d count: %w", g, err)
		}
		count := binary.LittleEndian.Uint64(n[:])
		for i := uint64(0); i < count; i++ {
			if _, err := io.ReadFull(br, n[:2]); err != nil {
				return fmt.Errorf("generation %d id %d: %w", g, i, err)
			}
			id := make([]byte, binary.LittleEndian.Uint16(n[:2]))
			if _, err := io.ReadFull(br, id); err != nil {
				return fmt.Errorf("generation %d id %d: %w", g, i, err)
			}
			var rec [16]byte
			if _, err := io.ReadFull(br, rec[:]); err != nil {
				return fmt.Errorf("generation %d id %d record: %w", g, i, err)
			}
			e := writeEntry{id: string(id), writeRecord: writeRecord{index: binary.LittleEndian.Uint64(rec[:8]), hash: binary.LittleEndian.Uint64(rec[8:])}}
			if _, dup := gen.at[e.id]; dup {
				// A map held each id once; the log must too, or the
				// encoding would no longer be the state's.
				return fmt.Errorf("generation %d id %d: id %q appears twice", g, i, e.id)
			}
			gen.add(e)
		}
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return errors.New("trailing bytes after embedding ids")
	}
	m.older, m.current = gens[0], gens[1]
	return nil
}

// StateIndex reads the applied index recorded in a state snapshot's header.
func StateIndex(state []byte) (uint64, error) {
	if len(state) < len(smMagic)+8 || string(state[:4]) != smMagic {
		return 0, fmt.Errorf("state snapshot: expected magic %q at offset 0", smMagic)
	}
	return binary.LittleEndian.Uint64(state[4:]), nil
}
