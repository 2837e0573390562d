package ledger

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"math"
	"slices"
	"time"
)

// Snapshot format, version 1. All integers are unsigned varints unless
// noted; floats are their IEEE-754 bits as 8 little-endian bytes. Maps are
// written in sorted order so that equal states give equal bytes.
//
//	magic "TIDALLDG", version
//	signal count, then per signal: name, half-life ns, window count,
//	    per window: name, duration ns            (the schema's signal part)
//	ids per generation, applied index
//	entity count, then per entity in ascending id order:
//	    entity id, bitmask of signals present,
//	    per present signal: count, weight sum (f64), anchor ts (zig-zag),
//	        decayed sum (f64), per bucketed window: bucket count,
//	        per bucket in ascending order: k, n
//	previous generation, then current generation of the id memory, each:
//	    id count, per id in (index, position) order:
//	    id, index, term, position, entity, signal index, weight (f64)
//	sha256 of all the above (32 bytes)
//
// Strings are a length followed by the bytes.
const (
	snapshotMagic   = "TIDALLDG"
	snapshotVersion = 1
)

// Snapshot writes the whole state in the canonical encoding above. Equal
// states give equal bytes. It is Capture followed by the capture's
// Snapshot: the lock is held only while capturing.
func (l *Ledger) Snapshot(w io.Writer) error {
	return l.Capture().Snapshot(w)
}

// Digest is the hex sha256 of the canonical encoding of the state: the
// applied index, every aggregate, the id memory and the options that shape
// them. Replicas that applied the same log prefix report the same digest;
// it equals the checksum that ends a Snapshot of the same state.
func (l *Ledger) Digest() string {
	return l.Capture().Digest()
}

// Captured is the ledger's state at one instant, taken by Capture and
// encoded later by its Snapshot, without the ledger's lock, while Apply
// goes on (a snapshot encoded on the apply path stopped every
// write's acknowledgement for as long as the encoding took, hundreds of
// milliseconds for a few hundred thousand remembered ids).
//
// Capturing copies the entity state, which Apply changes in place (slots,
// cells, window buckets: a few bytes per key), and shares the id memory,
// which it does not: a generation only ever appends ids — a record below
// a chunk's captured length, and the arena bytes it points at, never
// change, and an append that outgrows an arena moves it and leaves the
// captured one as it was — and a full generation is replaced, not reused.
// So a capture costs a copy of the aggregates plus a copy of each
// generation's chunk headers, not an encoding of every id.
type Captured struct {
	schema    Schema
	idsPerGen int
	applied   uint64
	ids       []uint64
	// aggs holds copies of the ledger's cell and window-record chunks and
	// of its spill arena (sigs, cells, wins, spills only), so that the
	// ledger's own accessors (cellAt, cellWins, winBuckets) read them.
	aggs     *Ledger
	old, cur generation // chunk headers only; no index
}

// Capture takes the state as it is now for a later Snapshot. It holds the
// shared lock while copying the aggregates (see Captured).
func (l *Ledger) Capture() *Captured {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return &Captured{
		schema:    l.schema,
		idsPerGen: l.idsPerGen,
		applied:   l.applied,
		ids:       slices.Clone(l.ids),
		aggs: &Ledger{
			sigs:   l.sigs,
			cells:  cloneUsed(l.cells, len(l.ids)*len(l.sigs)),
			wins:   cloneUsed(l.wins, l.nwins),
			spills: spillArena{chunks: cloneUsed(l.spills.chunks, l.spills.n)},
		},
		old: l.old.frozen(),
		cur: l.cur.frozen(),
	}
}

// cloneUsed copies the first used elements of chunks, fixed-size arrays
// the ledger changes in place and fills in order: the chunks before the
// last in full, the last only as far as it is used (a small ledger's one
// chunk is mostly empty, and a capture per Digest must not cost a
// megabyte).
func cloneUsed[T any](chunks [][]T, used int) [][]T {
	out := make([][]T, len(chunks))
	for i, c := range chunks {
		n := min(len(c), used)
		out[i] = slices.Clone(c[:n])
		used -= n
	}
	return out
}

// AppliedIndex is the applied index of the captured state.
func (c *Captured) AppliedIndex() uint64 { return c.applied }

// Digest is what Ledger.Digest returned at the moment of the capture. It
// may be called from any goroutine while Apply goes on.
func (c *Captured) Digest() string {
	h := sha256.New()
	enc := &encoder{h: h}
	c.encode(enc)
	enc.flush()
	return hex.EncodeToString(h.Sum(nil))
}

// Snapshot writes the captured state in the canonical encoding: the bytes
// Ledger.Snapshot would have written at the moment of the capture. It may
// be called more than once, from any goroutine.
func (c *Captured) Snapshot(w io.Writer) error {
	h := sha256.New()
	enc := &encoder{w: w, h: h}
	c.encode(enc)
	if enc.err == nil {
		enc.flush()
	}
	if enc.err != nil {
		return fmt.Errorf("ledger: writing snapshot: %w", enc.err)
	}
	if _, err := w.Write(h.Sum(nil)); err != nil {
		return fmt.Errorf("ledger: writing snapshot: %w", err)
	}
	return nil
}

func (c *Captured) encode(e *encoder) {
	e.raw([]byte(snapshotMagic))
	e.uvarint(snapshotVersion)
	e.uvarint(uint64(len(c.schema.Signals)))
	for _, st := range c.schema.Signals {
		e.str(st.Name)
		e.uvarint(uint64(st.HalfLife))
		e.uvarint(uint64(len(st.Windows)))
		for _, w := range st.Windows {
			e.str(w.Name)
			e.uvarint(uint64(w.Duration))
		}
	}
	e.uvarint(uint64(c.idsPerGen))
	e.uvarint(c.applied)

	// Slots in ascending entity id order.
	order := make([]uint32, len(c.ids))
	for s := range order {
		order[s] = uint32(s)
	}
	slices.SortFunc(order, func(a, b uint32) int { return cmp.Compare(c.ids[a], c.ids[b]) })
	e.uvarint(uint64(len(order)))
	v := c.aggs
	nsig := len(v.sigs)
	for _, slot := range order {
		id := c.ids[slot]
		var mask uint64
		for si := range nsig {
			if v.cellAt(int(slot), si).count != 0 {
				mask |= 1 << si
			}
		}
		e.uvarint(id)
		e.uvarint(mask)
		for si := range nsig {
			cl := v.cellAt(int(slot), si)
			if cl.count == 0 {
				continue
			}
			e.uvarint(cl.count)
			e.f64(cl.weightSum)
			e.varint(cl.anchor)
			e.f64(cl.decayed)
			ws := v.cellWins(cl, &v.sigs[si])
			for i := range ws {
				bs := v.winBuckets(&ws[i])
				e.uvarint(uint64(len(bs)))
				for _, b := range bs {
					e.varint(b.k)
					e.uvarint(b.n)
				}
			}
		}
		if e.err != nil {
			return
		}
	}
	for _, gen := range []*generation{&c.old, &c.cur} {
		e.uvarint(uint64(gen.len()))
		gen.each(func(id []byte, r *idRecord) {
			e.uvarint(uint64(len(id)))
			e.raw(id)
			e.uvarint(r.index)
			e.uvarint(r.term)
			e.uvarint(uint64(r.pos))
			e.uvarint(r.entity)
			e.uvarint(uint64(r.signal))
			e.f64(r.weight)
		})
	}
}

// encoder buffers the encoding and feeds it to the hash and, when w is
// set, to the snapshot writer. The first write error sticks.
type encoder struct {
	w   io.Writer
	h   hash.Hash
	buf []byte
	err error
}

func (e *encoder) maybeFlush() {
	if len(e.buf) >= 64<<10 {
		e.flush()
	}
}

func (e *encoder) flush() {
	if e.err != nil {
		return
	}
	e.h.Write(e.buf)
	if e.w != nil {
		_, e.err = e.w.Write(e.buf)
	}
	e.buf = e.buf[:0]
}

func (e *encoder) raw(p []byte)     { e.buf = append(e.buf, p...); e.maybeFlush() }
func (e *encoder) uvarint(v uint64) { e.buf = binary.AppendUvarint(e.buf, v); e.maybeFlush() }
func (e *encoder) varint(v int64)   { e.buf = binary.AppendVarint(e.buf, v); e.maybeFlush() }
func (e *encoder) f64(v float64) {
	e.buf = binary.LittleEndian.AppendUint64(e.buf, math.Float64bits(v))
	e.maybeFlush()
}
func (e *encoder) str(s string) {
	e.uvarint(uint64(len(s)))
	e.buf = append(e.buf, s...)
	e.maybeFlush()
}

// Restore replaces the whole state with a snapshot's. The snapshot is read
// to the end, its checksum verified before anything is decoded, and every
// structural invariant checked (sorted order, bounds, no trailing bytes);
// on any error the ledger is unchanged. A snapshot taken under a different
// schema (signal part) or IDsPerGeneration is refused: folding the log
// that follows it with other parameters would diverge from the replicas
// that took it.
func (l *Ledger) Restore(r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("ledger: restore: reading snapshot: %w", err)
	}
	if len(data) < len(snapshotMagic)+sha256.Size {
		return fmt.Errorf("ledger: restore: snapshot is %d bytes, expected at least %d", len(data), len(snapshotMagic)+sha256.Size)
	}
	body, sum := data[:len(data)-sha256.Size], data[len(data)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return fmt.Errorf("ledger: restore: checksum mismatch over %d bytes: trailer says %x, content hashes to %x", len(body), sum, got)
	}
	fresh := &Ledger{schema: l.schema, sigs: l.sigs, idsPerGen: l.idsPerGen}
	fresh.reset()
	d := &decoder{data: body}
	if err := fresh.decode(d); err != nil {
		return fmt.Errorf("ledger: restore: at offset %d: %w", d.off, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applied, l.nextPos = fresh.applied, entryDone
	l.index, l.ids, l.cells, l.wins, l.nwins, l.spills = fresh.index, fresh.ids, fresh.cells, fresh.wins, fresh.nwins, fresh.spills
	l.keys, l.buckets = fresh.keys, fresh.buckets
	l.cur, l.old = fresh.cur, fresh.old
	return nil
}

func (l *Ledger) decode(d *decoder) error {
	if magic := d.raw(len(snapshotMagic)); string(magic) != snapshotMagic {
		return fmt.Errorf("expected magic %q, found %q", snapshotMagic, magic)
	}
	if v := d.uvarint(); v != snapshotVersion {
		return fmt.Errorf("expected snapshot version %d, found %d", snapshotVersion, v)
	}
	nsig := d.uvarint()
	if d.err == nil && nsig != uint64(len(l.schema.Signals)) {
		return fmt.Errorf("snapshot has %d signal types, this ledger's schema %d", nsig, len(l.schema.Signals))
	}
	for i := 0; i < len(l.schema.Signals) && d.err == nil; i++ {
		want := l.schema.Signals[i]
		got := SignalType{Name: d.str(), HalfLife: time.Duration(d.uvarint())}
		nw := d.uvarint()
		for j := uint64(0); j < nw && j <= MaxWindowsPerSignal && d.err == nil; j++ {
			got.Windows = append(got.Windows, Window{Name: d.str(), Duration: time.Duration(d.uvarint())})
		}
		if d.err == nil && !sameSignalType(want, got) {
			return fmt.Errorf("snapshot signals[%d] is %s, this ledger's schema has %s", i, describeSignal(got), describeSignal(want))
		}
	}
	if n := d.uvarint(); d.err == nil && n != uint64(l.idsPerGen) {
		return fmt.Errorf("snapshot was taken with %d ids per generation, this ledger uses %d", n, l.idsPerGen)
	}
	l.applied = d.uvarint()

	nent := d.uvarint()
	var prev uint64
	for i := uint64(0); i < nent && d.err == nil; i++ {
		id := d.uvarint()
		if i > 0 && id <= prev {
			return fmt.Errorf("entity %d follows entity %d: expected ascending ids", id, prev)
		}
		prev = id
		mask := d.uvarint()
		if d.err == nil && (mask == 0 || (len(l.sigs) < 64 && mask>>len(l.sigs) != 0)) {
			return fmt.Errorf("entity %d: signal mask %#x does not fit %d signal types", id, mask, len(l.sigs))
		}
		if d.err != nil {
			break
		}
		slot := l.addEntity(id)
		for si := range l.sigs {
			if mask&(1<<si) == 0 {
				continue
			}
			c := l.cellAt(slot, si)
			*c = cell{count: d.uvarint(), weightSum: d.f64(), anchor: d.varint(), decayed: d.f64()}
			if d.err == nil && c.count == 0 {
				return fmt.Errorf("entity %d signal %q: count 0 in a present cell", id, l.sigs[si].name)
			}
			anchor := c.anchor
			l.present(c, &l.sigs[si], anchor)
			l.keys-- // counted below, as before
			ws := l.cellWins(c, &l.sigs[si])
			for _, w := range l.sigs[si].windows {
				if w.bucket < 0 {
					continue
				}
				nb := d.uvarint()
				if d.err == nil && nb > BucketsPerWindow+1 {
					return fmt.Errorf("entity %d signal %q window %q: %d buckets, expected at most %d", id, l.sigs[si].name, w.name, nb, BucketsPerWindow+1)
				}
				bs := make([]bucket, 0, nb)
				for j := uint64(0); j < nb && d.err == nil; j++ {
					b := bucket{k: d.varint(), n: d.uvarint()}
					if j > 0 && b.k <= bs[j-1].k {
						return fmt.Errorf("entity %d signal %q window %q: bucket %d follows bucket %d: expected ascending", id, l.sigs[si].name, w.name, b.k, bs[j-1].k)
					}
					bs = append(bs, b)
				}
				l.setWinBuckets(&ws[w.bucket], bs)
				l.buckets += len(bs)
			}
			l.keys++
		}
	}
	var last idRecord
	seen := false
	for g, gen := range []*generation{l.old, l.cur} {
		n := d.uvarint()
		for i := uint64(0); i < n && d.err == nil; i++ {
			id := d.str()
			rec := idRecord{index: d.uvarint(), term: d.uvarint()}
			pos, entity, sig := d.uvarint(), d.uvarint(), d.uvarint()
			rec.entity, rec.weight = entity, d.f64()
			if d.err != nil {
				break
			}
			if rec.index > l.applied {
				return fmt.Errorf("id %q at index %d, above the applied index %d", id, rec.index, l.applied)
			}
			if pos >= MaxBatchLen || sig >= uint64(len(l.sigs)) {
				return fmt.Errorf("id %q: position %d or signal index %d out of range", id, pos, sig)
			}
			rec.pos, rec.signal = uint32(pos), uint16(sig)
			// Log order across both generations: old precedes cur.
			if seen && (rec.index < last.index || rec.index == last.index && rec.pos <= last.pos) {
				return fmt.Errorf("id %q at (%d, %d) follows (%d, %d): expected ascending log order", id, rec.index, rec.pos, last.index, last.pos)
			}
			last, seen = rec, true
			if _, dup := l.remembered(id); dup {
				return fmt.Errorf("id %q remembered twice", id)
			}
			gen.add(id, rec)
		}
		if g == 1 && l.cur.len() >= l.idsPerGen {
			return fmt.Errorf("current id generation holds %d ids, expected fewer than %d (it rotates when full)", l.cur.len(), l.idsPerGen)
		}
	}
	if d.err != nil {
		return d.err
	}
	if d.off != len(d.data) {
		return fmt.Errorf("%d trailing bytes after the id memory", len(d.data)-d.off)
	}
	return nil
}

func sameSignalType(a, b SignalType) bool {
	return a.Name == b.Name && a.HalfLife == b.HalfLife && slices.Equal(a.Windows, b.Windows)
}

func describeSignal(st SignalType) string {
	s := fmt.Sprintf("{%s half_life %v windows [", st.Name, st.HalfLife)
	for i, w := range st.Windows {
		if i > 0 {
			s += " "
		}
		s += w.Name
	}
	return s + "]}"
}

// decoder reads the snapshot body; the first error sticks and later reads
// return zero values, so decode checks d.err where a value steers control.
type decoder struct {
	data []byte
	off  int
	err  error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("truncated or malformed %s", what)
	}
}

func (d *decoder) raw(n int) []byte {
	if d.err != nil || len(d.data)-d.off < n {
		d.fail("bytes")
		return nil
	}
	p := d.data[d.off : d.off+n]
	d.off += n
	return p
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.data[d.off:])
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.data[d.off:])
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) f64() float64 {
	p := d.raw(8)
	if p == nil {
		return 0
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(p))
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.data)-d.off) {
		d.fail("string")
		return ""
	}
	return string(d.raw(int(n)))
}
