package vectors

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"slices"
	"unsafe"
)

// Snapshot format, version 1 (all integers little-endian):
//
//	header   magic "tidalvec" | version uint32 | dim uint32 | count uint64
//	record   entity uint64 | dim × float32 (IEEE-754 bits)      × count
//	trailer  CRC-32C (Castagnoli) of every byte before it, uint32
//
// Records are in strictly ascending entity order, so the encoding is a
// function of the state alone: equal states give equal bytes, and Digest is
// the SHA-256 of these bytes. The length is fixed by the header, so Restore
// reads exactly what Snapshot wrote and a snapshot can sit inside a larger
// stream.
const (
	snapshotMagic   = "tidalvec"
	snapshotVersion = 1
	headerSize      = 8 + 4 + 4 + 8
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot writes the canonical encoding of the store to w.
func (s *Store) Snapshot(w io.Writer) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.viewLocked().encode(w)
}

// Digest returns the hex SHA-256 of the canonical encoding (see Snapshot):
// two stores have equal digests exactly when they hold the same vectors
// for the same entities, bit for bit.
func (s *Store) Digest() string {
	h := sha256.New()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.viewLocked().encode(h); err != nil {
		// hash.Hash.Write never fails.
		panic(fmt.Sprintf("vectors: hashing state: %v", err))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// View is the store's state frozen at one moment, to be encoded later
// without holding the store's lock (a 100,000-vector store is
// 614 MB; encoding it on the apply goroutine stalled every node). Freeze
// costs one slice header per chunk; the store copies a chunk only when a
// Put overwrites a vector in it while a View may still read it. A View is
// read-only and safe to encode from any one goroutine while the store
// goes on changing.
type View struct {
	dim      int
	perChunk int
	entities []uint64    // slot -> entity, frozen length
	chunks   [][]float32 // frozen chunk headers
}

// Freeze returns a View of the store as it is now (see View).
func (s *Store) Freeze() *View {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.shared {
		s.shared[c] = true
	}
	return s.viewLocked()
}

// viewLocked returns the current state as a View without protecting it
// from later Puts: callers encode it before they release the lock, or
// mark the chunks shared (Freeze).
func (s *Store) viewLocked() *View {
	return &View{dim: s.dim, perChunk: s.perChunk,
		entities: s.entities[:len(s.entities):len(s.entities)],
		chunks:   slices.Clone(s.chunks)}
}

// Size is the exact length in bytes of the View's encoding.
func (v *View) Size() int64 {
	return headerSize + int64(len(v.entities))*int64(8+4*v.dim) + 4
}

// Len is the number of entities in the View.
func (v *View) Len() int { return len(v.entities) }

func (v *View) vec(i int) []float32 {
	c := v.chunks[i/v.perChunk]
	off := (i % v.perChunk) * v.dim
	return c[off : off+v.dim : off+v.dim]
}

// WriteTo writes the View's canonical encoding (the format Snapshot
// writes) to w.
func (v *View) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	err := v.encode(cw)
	return cw.n, err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func (v *View) encode(w io.Writer) error {
	return encodeSorted(w, v.dim, v.entities, func(slots []int32, buf []byte) {
		for k, i := range slots {
			putRecord(buf[k*recordSize(v.dim):], v.entities[i], v.vec(int(i)))
		}
	})
}

// recordBatch is how many records an encoder takes from its source at a
// time: a QueryView copies one batch under the store's read lock (about
// 400 KB at dimension 1536) and hashes or writes it without the lock.
const recordBatch = 64

func recordSize(dim int) int { return 8 + 4*dim }

// putRecord encodes one record (entity, then the vector's IEEE-754 bits)
// at the start of rec.
func putRecord(rec []byte, entity uint64, vec []float32) {
	binary.LittleEndian.PutUint64(rec, entity)
	if littleEndian && len(vec) > 0 {
		// The in-memory bytes are already the encoding.
		copy(rec[8:], unsafe.Slice((*byte)(unsafe.Pointer(&vec[0])), 4*len(vec)))
		return
	}
	for j, x := range vec {
		binary.LittleEndian.PutUint32(rec[8+4*j:], math.Float32bits(x))
	}
}

// littleEndian is whether this machine stores a float32's IEEE-754 bits
// in the snapshot's byte order.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// encodeSorted writes the canonical encoding (see Snapshot) of the slots
// 0..len(entities)-1, entities[i] being slot i's entity, to w. fill puts
// the records of the given slots into buf, back to back; it is called
// with at most recordBatch slots at a time, in ascending entity order.
// entities is only read.
func encodeSorted(w io.Writer, dim int, entities []uint64, fill func(slots []int32, buf []byte)) error {
	// Records go out a batch per Write, to w and to the checksum, with no
	// buffer between: a batch is already hundreds of kilobytes.
	crc := crc32.New(castagnoli)
	bw := io.MultiWriter(w, crc)

	var hdr [headerSize]byte
	copy(hdr[:8], snapshotMagic)
	binary.LittleEndian.PutUint32(hdr[8:], snapshotVersion)
	binary.LittleEndian.PutUint32(hdr[12:], uint32(dim))
	binary.LittleEndian.PutUint64(hdr[16:], uint64(len(entities)))
	if _, err := bw.Write(hdr[:]); err != nil {
		return fmt.Errorf("vectors: writing snapshot header: %w", err)
	}

	// Slots in ascending entity order.
	order := make([]int32, len(entities))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortFunc(order, func(a, b int32) int { return cmp.Compare(entities[a], entities[b]) })
	size := recordSize(dim)
	buf := make([]byte, min(recordBatch, len(order))*size)
	for len(order) > 0 {
		slots := order[:min(recordBatch, len(order))]
		order = order[len(slots):]
		fill(slots, buf)
		if _, err := bw.Write(buf[:len(slots)*size]); err != nil {
			return fmt.Errorf("vectors: writing the snapshot records of entities %d to %d: %w", entities[slots[0]], entities[slots[len(slots)-1]], err)
		}
	}
	// The trailer is not part of what it checksums, so it bypasses crc.
	var trailer [4]byte
	binary.LittleEndian.PutUint32(trailer[:], crc.Sum32())
	if _, err := w.Write(trailer[:]); err != nil {
		return fmt.Errorf("vectors: writing snapshot trailer: %w", err)
	}
	return nil
}

// Restore replaces the store's contents with a snapshot read from r. It
// reads exactly the snapshot's bytes, checks the checksum, the store's
// dimension, the record order and every vector, and on any error leaves
// the store unchanged. Errors name the byte offset in the snapshot.
func (s *Store) Restore(r io.Reader) error {
	crc := crc32.New(castagnoli)
	d := decoder{r: r, crc: crc}

	var hdr [headerSize]byte
	if err := d.read(hdr[:], "header"); err != nil {
		return err
	}
	if magic := string(hdr[:8]); magic != snapshotMagic {
		return fmt.Errorf("vectors: snapshot offset 0: expected magic %q, found %q", snapshotMagic, magic)
	}
	if v := binary.LittleEndian.Uint32(hdr[8:]); v != snapshotVersion {
		return fmt.Errorf("vectors: snapshot offset 8: expected version %d, found %d", snapshotVersion, v)
	}
	if dim := binary.LittleEndian.Uint32(hdr[12:]); dim != uint32(s.dim) {
		return fmt.Errorf("vectors: snapshot offset 12: expected dimension %d (from the schema), found %d", s.dim, dim)
	}
	count := binary.LittleEndian.Uint64(hdr[16:])

	// Capacity grows with what is actually read, so a corrupt count cannot
	// make us allocate memory the stream does not back.
	next := New(s.dim)
	next.perChunk = s.perChunk // its chunks replace ours, laid out alike
	rec := make([]byte, 8+4*s.dim)
	vec := make([]float32, s.dim)
	for n := uint64(0); n < count; n++ {
		at := d.off
		if err := d.read(rec, fmt.Sprintf("record %d of %d", n, count)); err != nil {
			return err
		}
		e := binary.LittleEndian.Uint64(rec)
		if n > 0 && e <= next.entities[n-1] {
			return fmt.Errorf("vectors: snapshot offset %d: record %d: expected entity > %d (ascending order), found %d",
				at, n, next.entities[n-1], e)
		}
		for j := range vec {
			vec[j] = math.Float32frombits(binary.LittleEndian.Uint32(rec[8+4*j:]))
		}
		norm, ferr := next.check(vec)
		if ferr != nil {
			return fmt.Errorf("vectors: snapshot offset %d: record %d (entity %d): %w", at, n, e, ferr)
		}
		next.putLocked(e, vec, norm)
	}

	computed := crc.Sum32()
	var trailer [4]byte
	at := d.off
	d.crc = nil
	if err := d.read(trailer[:], "checksum trailer"); err != nil {
		return err
	}
	if stored := binary.LittleEndian.Uint32(trailer[:]); stored != computed {
		return fmt.Errorf("vectors: snapshot offset %d: checksum mismatch: stored %08x, computed %08x over %d bytes",
			at, stored, computed, at)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	// Views pinned before the Restore keep reading the arrays they pinned,
	// which nothing writes again once they are replaced here; detaching
	// hands each the bookkeeping as of now (putSeq's array and the undo
	// map are replaced too, so they are frozen from here on).
	s.detachViewsLocked()
	s.restores++
	s.slot, s.entities, s.norms, s.chunks, s.shared = next.slot, next.entities, next.norms, next.chunks, next.shared
	// Every restored slot counts as written before any view pinned from
	// now on (seq only grows, so views pinned later have seq >= 0).
	s.putSeq = make([]uint64, len(next.entities))
	return nil
}

// decoder reads exact byte counts, feeding them to a checksum and tracking
// the offset for error messages.
type decoder struct {
	r   io.Reader
	crc hash.Hash32
	off int64
}

func (d *decoder) read(p []byte, what string) error {
	n, err := io.ReadFull(d.r, p)
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("vectors: snapshot offset %d: %s: expected %d bytes, found %d before end of stream",
				d.off, what, len(p), n)
		}
		return fmt.Errorf("vectors: snapshot offset %d: reading %s: %w", d.off, what, err)
	}
	if d.crc != nil {
		d.crc.Write(p)
	}
	d.off += int64(n)
	return nil
}
