package server

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// A command is the application payload of one raft entry:
//
//	u8 kind | body
//
//	kindSignals:   u32 n | n × (u16 len, id | u64 entity | u16 len, signal | u64 weight bits | i64 ts)
//	kindEmbedding: u16 len, id | u64 entity | u32 dim | dim × u32 float bits
//
// Little-endian throughout. The encoding is deliberately explicit (no
// reflection, no JSON) because every node decodes every entry on the apply
// path, and because a decoder that bounds every length cannot be made to
// allocate more than the entry's own size.
const (
	kindSignals   byte = 1
	kindEmbedding byte = 2
)

type embeddingPut struct {
	ID     string
	Entity uint64
	Vector []float32
}

func encodeSignals(events []ledger.Event) []byte {
	size := 1 + 4
	for _, e := range events {
		size += 2 + len(e.ID) + 8 + 2 + len(e.Signal) + 8 + 8
	}
	b := make([]byte, 0, size)
	b = append(b, kindSignals)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(events)))
	for _, e := range events {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(e.ID)))
		b = append(b, e.ID...)
		b = binary.LittleEndian.AppendUint64(b, e.Entity)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(e.Signal)))
		b = append(b, e.Signal...)
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.Weight))
		b = binary.LittleEndian.AppendUint64(b, uint64(e.TS))
	}
	return b
}

func encodeEmbedding(p embeddingPut) []byte {
	b := make([]byte, 0, 1+2+len(p.ID)+8+4+4*len(p.Vector))
	b = append(b, kindEmbedding)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(p.ID)))
	b = append(b, p.ID...)
	b = binary.LittleEndian.AppendUint64(b, p.Entity)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(p.Vector)))
	for _, f := range p.Vector {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) need(n int, what string) bool {
	if d.err != nil {
		return false
	}
	if n < 0 || len(d.b)-d.off < n {
		d.err = fmt.Errorf("command truncated at offset %d: need %d bytes for %s, have %d", d.off, n, what, len(d.b)-d.off)
		return false
	}
	return true
}

func (d *decoder) u16(what string) int {
	if !d.need(2, what) {
		return 0
	}
	v := binary.LittleEndian.Uint16(d.b[d.off:])
	d.off += 2
	return int(v)
}

func (d *decoder) u32(what string) uint32 {
	if !d.need(4, what) {
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b[d.off:])
	d.off += 4
	return v
}

func (d *decoder) u64(what string) uint64 {
	if !d.need(8, what) {
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b[d.off:])
	d.off += 8
	return v
}

func (d *decoder) str(what string) string {
	n := d.u16(what + " length")
	if !d.need(n, what) {
		return ""
	}
	s := string(d.b[d.off : d.off+n])
	d.off += n
	return s
}

func decodeSignals(b []byte) ([]ledger.Event, error) {
	return decodeSignalsInto(nil, b, nil)
}

// decodeSignalsInto appends the command's events to dst. It allocates at
// most one string for the whole command (ids and unknown signal names are
// substrings of it; a signal named in names shares that string), so the
// apply path does not allocate per event. The events may be retained (an
// error names its id), which keeps that one string alive, not the entry.
func decodeSignalsInto(dst []ledger.Event, b []byte, names []string) ([]ledger.Event, error) {
	d := &decoder{b: b, off: 1}
	n := d.u32("event count")
	// Each event takes at least 28 bytes, so a count beyond that is a lie
	// we must not allocate for.
	if d.err == nil && uint64(n)*28 > uint64(len(b)) {
		return dst, fmt.Errorf("command claims %d events in %d bytes", n, len(b))
	}
	all := string(b)
	// The names are constants: building what+" length" here allocated
	// twice per event on every node's apply path (4% of a follower's
	// CPU in a profile).
	sub := func(what, whatLength string) string {
		n := d.u16(whatLength)
		if !d.need(n, what) {
			return ""
		}
		v := all[d.off : d.off+n]
		d.off += n
		return v
	}
	dst = slices.Grow(dst, int(n))
	for i := uint32(0); i < n && d.err == nil; i++ {
		var e ledger.Event
		e.ID = sub("id", "id length")
		e.Entity = d.u64("entity")
		e.Signal = sub("signal", "signal length")
		for _, name := range names {
			if name == e.Signal {
				e.Signal = name
				break
			}
		}
		e.Weight = math.Float64frombits(d.u64("weight"))
		e.TS = int64(d.u64("ts"))
		dst = append(dst, e)
	}
	if d.err == nil && d.off != len(b) {
		d.err = fmt.Errorf("command has %d trailing bytes after %d events", len(b)-d.off, n)
	}
	return dst, d.err
}

func decodeEmbedding(b []byte) (embeddingPut, error) {
	d := &decoder{b: b, off: 1}
	var p embeddingPut
	p.ID = d.str("id")
	p.Entity = d.u64("entity")
	dim := d.u32("dimension")
	if d.err == nil && uint64(dim)*4 != uint64(len(b)-d.off) {
		return p, fmt.Errorf("embedding command: dimension %d needs %d bytes, have %d", dim, uint64(dim)*4, len(b)-d.off)
	}
	if d.err != nil {
		return p, d.err
	}
	p.Vector = make([]float32, dim)
	for i := range p.Vector {
		p.Vector[i] = math.Float32frombits(d.u32("vector"))
	}
	return p, d.err
}
