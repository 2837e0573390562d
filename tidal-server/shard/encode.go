package shard

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// The encoded map is what the meta group replicates as a raft command and
// stores in its snapshots, so it is binary and canonical: Validate fixes
// the order of every list, hence equal maps encode to equal bytes and the
// meta group's state digest compares across nodes. Integers are
// little-endian.
//
// The envelope is fixed for every format version, so that any build can
// tell a map it cannot read from a corrupt one:
//
//	magic    [4]byte "TSHM"
//	version  u16     format version of the payload
//	length   u32     payload length in bytes
//	payload  [length]byte
//	crc      u32     CRC-32C (Castagnoli) of everything before it
//
// Payload of format version 1:
//
//	epoch u64 | slots u32 (= NumSlots) | replication factor u32
//	next group id u64
//	nodes: count u32, node id u64 each
//	meta:  count u32, node id u64 each
//	groups: count u32, each:
//	  id u64 | start u32 | end u32 | leader u64
//	  conf epoch u64 | slots epoch u64 | next replica id u64
//	  replicas: count u32, each: node u64 | id u64 | role u8
//
// Decode checks, in this order, the envelope's size and magic, the CRC,
// the version (a version above FormatVersion is refused naming it: a newer
// release wrote it), the payload's shape, the slot count, and Validate.
// It never returns a map that fails Validate, and a map it returns
// re-encodes to the very bytes it was decoded from.

// FormatVersion is the shard map encoding this build writes; it reads
// MinFormatVersion..FormatVersion.
const (
	FormatVersion    = 1
	MinFormatVersion = 1
)

var magic = [4]byte{'T', 'S', 'H', 'M'}

const (
	headerLen  = 4 + 2 + 4
	trailerLen = 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode returns the canonical encoding of m, which must be valid.
func (m *Map) Encode() []byte {
	n := 8 + 4 + 4 + 8 + 4 + 8*len(m.Nodes) + 4 + 8*len(m.Meta) + 4
	for i := range m.Groups {
		n += 8 + 4 + 4 + 8 + 8 + 8 + 8 + 4 + 17*len(m.Groups[i].Replicas)
	}
	b := make([]byte, 0, headerLen+n+trailerLen)
	b = append(b, magic[:]...)
	b = binary.LittleEndian.AppendUint16(b, FormatVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	b = binary.LittleEndian.AppendUint64(b, m.Epoch)
	b = binary.LittleEndian.AppendUint32(b, NumSlots)
	b = binary.LittleEndian.AppendUint32(b, uint32(m.ReplicationFactor))
	b = binary.LittleEndian.AppendUint64(b, uint64(m.NextGroupID))
	for _, list := range [][]NodeID{m.Nodes, m.Meta} {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(list)))
		for _, id := range list {
			b = binary.LittleEndian.AppendUint64(b, uint64(id))
		}
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Groups)))
	for i := range m.Groups {
		g := &m.Groups[i]
		b = binary.LittleEndian.AppendUint64(b, uint64(g.ID))
		b = binary.LittleEndian.AppendUint32(b, uint32(g.Start))
		b = binary.LittleEndian.AppendUint32(b, uint32(g.End))
		b = binary.LittleEndian.AppendUint64(b, uint64(g.Leader))
		b = binary.LittleEndian.AppendUint64(b, g.ConfEpoch)
		b = binary.LittleEndian.AppendUint64(b, g.SlotsEpoch)
		b = binary.LittleEndian.AppendUint64(b, uint64(g.NextReplicaID))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(g.Replicas)))
		for _, r := range g.Replicas {
			b = binary.LittleEndian.AppendUint64(b, uint64(r.Node))
			b = binary.LittleEndian.AppendUint64(b, uint64(r.ID))
			b = append(b, byte(r.Role))
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodeError is an encoded map Decode refuses; Offset is the byte offset
// in the input where the problem was found.
type DecodeError struct {
	Offset  int
	Problem string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("shard map encoding at byte %d: %s", e.Offset, e.Problem)
}

// VersionError is an encoded map of a format version this build does not
// read.
type VersionError struct {
	Version uint16
}

func (e *VersionError) Error() string {
	why := "a newer tidal-server wrote it; run a release that reads it"
	if e.Version < MinFormatVersion {
		why = "below every version a release wrote"
	}
	return fmt.Sprintf("shard map format version %d, this build reads %d–%d: %s", e.Version, MinFormatVersion, FormatVersion, why)
}

// Decode parses an encoded map (see Encode) and validates it.
func Decode(b []byte) (Map, error) {
	if len(b) < headerLen+trailerLen {
		return Map{}, &DecodeError{0, fmt.Sprintf("%d bytes, expected at least %d (header and CRC)", len(b), headerLen+trailerLen)}
	}
	if [4]byte(b[:4]) != magic {
		return Map{}, &DecodeError{0, fmt.Sprintf("magic %q, expected %q: not a shard map", b[:4], magic[:])}
	}
	length := binary.LittleEndian.Uint32(b[6:10])
	if want := uint64(headerLen) + uint64(length) + trailerLen; uint64(len(b)) != want {
		return Map{}, &DecodeError{6, fmt.Sprintf("payload length %d makes %d bytes, found %d", length, want, len(b))}
	}
	body := b[:len(b)-trailerLen]
	if got, want := binary.LittleEndian.Uint32(b[len(body):]), crc32.Checksum(body, castagnoli); got != want {
		return Map{}, &DecodeError{len(body), fmt.Sprintf("CRC-32C %08x, computed %08x over the %d bytes before it: corrupt", got, want, len(body))}
	}
	if v := binary.LittleEndian.Uint16(b[4:6]); v < MinFormatVersion || v > FormatVersion {
		return Map{}, &VersionError{Version: v}
	}
	d := decoder{b: body, off: headerLen}
	var m Map
	m.Epoch = d.u64()
	if slots := d.u32(); d.err == nil && slots != NumSlots {
		return Map{}, &DecodeError{d.off - 4, fmt.Sprintf("slot count %d, this build has %d: the slot space is fixed for a cluster", slots, NumSlots)}
	}
	m.ReplicationFactor = int(d.u32())
	m.NextGroupID = GroupID(d.u64())
	m.Nodes = d.nodes(8)
	m.Meta = d.nodes(8)
	ng := d.count(8 + 4 + 4 + 8 + 8 + 8 + 8 + 4)
	for range ng {
		var g Group
		g.ID = GroupID(d.u64())
		g.Start = Slot(d.u32())
		g.End = Slot(d.u32())
		g.Leader = NodeID(d.u64())
		g.ConfEpoch = d.u64()
		g.SlotsEpoch = d.u64()
		g.NextReplicaID = ReplicaID(d.u64())
		nr := d.count(17)
		for range nr {
			g.Replicas = append(g.Replicas, Replica{Node: NodeID(d.u64()), ID: ReplicaID(d.u64()), Role: Role(d.u8())})
		}
		m.Groups = append(m.Groups, g)
	}
	if d.err != nil {
		return Map{}, d.err
	}
	if d.off != len(body) {
		return Map{}, &DecodeError{d.off, fmt.Sprintf("%d bytes after the last group, expected none", len(body)-d.off)}
	}
	if err := m.Validate(); err != nil {
		return Map{}, err
	}
	return m, nil
}

// decoder reads the payload; after the first error every read returns 0
// and err keeps that first error.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b)-d.off < n {
		d.err = &DecodeError{d.off, fmt.Sprintf("payload ends, expected %d more bytes", n)}
		return nil
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

func (d *decoder) u8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

// count reads a list length and checks that many elements of at least
// size bytes each fit in what is left, so a corrupt count cannot make the
// decoder allocate more than the input's size.
func (d *decoder) count(size int) int {
	at := d.off
	n := d.u32()
	if d.err == nil && uint64(n)*uint64(size) > uint64(len(d.b)-d.off) {
		d.err = &DecodeError{at, fmt.Sprintf("count %d of %d-byte elements, but only %d bytes are left", n, size, len(d.b)-d.off)}
		return 0
	}
	return int(n)
}

func (d *decoder) nodes(size int) []NodeID {
	n := d.count(size)
	out := make([]NodeID, 0, n)
	for range n {
		out = append(out, NodeID(d.u64()))
	}
	return out
}
