package peer

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// Frames on the Messages stream. One gRPC message is one frame, in one of
// two formats, told apart by their first four bytes:
//
//	legacy:  u32 n | n × (u32 len | msg)
//	grouped: u32 groupedMagic | uvarint n | n × (uvarint group | uvarint len | msg)
//
// A legacy frame carries no group field, so every message in it is group
// 1's (LegacyGroup): a frame of the format every earlier release sends
// means group 1. groupedMagic can never begin a legacy frame: a legacy
// count is followed by at least 4 bytes per message, and no frame is
// 4 × 0xFFFFFF01 bytes long (maxMessageBytes is far below), so the older
// decoder refuses a grouped frame as "claims N messages" instead of
// misreading it. Frames of later formats take other values at or above
// 1<<30 for the same reason.
//
// A sender writes a legacy frame whenever every message in it is group
// 1's — so a node hosting only group 1 (--shards 1) sends exactly the
// bytes it always did, to every peer — and a grouped frame only to a peer
// that advertised groupedProtocol (see version.go); messages of other
// groups to an older peer are withheld (sender.go).
const groupedMagic uint32 = 0xFFFF_FF01

// LegacyGroup is the raft group of a message that carries no group: every
// message of a legacy frame, a snapshot stream without a group, and what
// Transport.Send sends. With --shards 1 it is the only data group.
const LegacyGroup uint64 = 1

// outMsg is one message queued for a peer node: its group, the raft id it
// is addressed to within that group (for ReportUnreachable), and its bytes.
type outMsg struct {
	group, to uint64
	data      []byte
}

// inMsg is one message read from a frame.
type inMsg struct {
	group uint64
	data  []byte
}

// encodeFrame encodes msgs as one frame: legacy when all are group 1,
// grouped otherwise. Callers send a grouped frame only to a peer that
// reads it.
func encodeFrame(msgs []outMsg) []byte {
	grouped := false
	size := 4
	for _, m := range msgs {
		if m.group != LegacyGroup {
			grouped = true
		}
		size += 4 + len(m.data)
	}
	if !grouped {
		b := make([]byte, 0, size)
		b = binary.BigEndian.AppendUint32(b, uint32(len(msgs)))
		for _, m := range msgs {
			b = binary.BigEndian.AppendUint32(b, uint32(len(m.data)))
			b = append(b, m.data...)
		}
		return b
	}
	size = 4 + protowire.SizeVarint(uint64(len(msgs)))
	for _, m := range msgs {
		size += protowire.SizeVarint(m.group) + protowire.SizeVarint(uint64(len(m.data))) + len(m.data)
	}
	b := make([]byte, 0, size)
	b = binary.BigEndian.AppendUint32(b, groupedMagic)
	b = protowire.AppendVarint(b, uint64(len(msgs)))
	for _, m := range msgs {
		b = protowire.AppendVarint(b, m.group)
		b = protowire.AppendVarint(b, uint64(len(m.data)))
		b = append(b, m.data...)
	}
	return b
}

// encodeBatch encodes a legacy frame (all group 1).
func encodeBatch(msgs [][]byte) []byte {
	out := make([]outMsg, len(msgs))
	for i, m := range msgs {
		out[i] = outMsg{group: LegacyGroup, data: m}
	}
	return encodeFrame(out)
}

// decodeFrame reads a frame of either format. The messages alias b.
func decodeFrame(b []byte) ([]inMsg, error) {
	if len(b) >= 4 && binary.BigEndian.Uint32(b) == groupedMagic {
		return decodeGrouped(b[4:])
	}
	return decodeLegacy(b)
}

// decodeLegacy reads a legacy frame as decodeBatch does, every message
// group 1's.
func decodeLegacy(b []byte) ([]inMsg, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("batch of %d bytes has no count", len(b))
	}
	n := binary.BigEndian.Uint32(b)
	off := 4
	if uint64(n)*4 > uint64(len(b)) {
		return nil, fmt.Errorf("batch claims %d messages in %d bytes", n, len(b))
	}
	out := make([]inMsg, 0, n)
	for i := uint32(0); i < n; i++ {
		if len(b)-off < 4 {
			return nil, fmt.Errorf("batch truncated at message %d of %d (offset %d)", i, n, off)
		}
		l := int(binary.BigEndian.Uint32(b[off:]))
		off += 4
		if l < 0 || len(b)-off < l {
			return nil, fmt.Errorf("batch message %d claims %d bytes, %d left (offset %d)", i, l, len(b)-off, off)
		}
		out = append(out, inMsg{group: LegacyGroup, data: b[off : off+l]})
		off += l
	}
	if off != len(b) {
		return nil, fmt.Errorf("batch has %d trailing bytes", len(b)-off)
	}
	return out, nil
}

// decodeGrouped reads a grouped frame after its magic. Errors name the
// message and the offset in the frame (counting the magic).
func decodeGrouped(b []byte) ([]inMsg, error) {
	n, k := protowire.ConsumeVarint(b)
	if k < 0 {
		return nil, fmt.Errorf("grouped frame of %d bytes: bad message count", len(b)+4)
	}
	off := k
	// Each message takes at least two bytes (group and length).
	if n > uint64(len(b)-off)/2 {
		return nil, fmt.Errorf("grouped frame claims %d messages in %d bytes", n, len(b)+4)
	}
	out := make([]inMsg, 0, n)
	for i := uint64(0); i < n; i++ {
		g, k := protowire.ConsumeVarint(b[off:])
		if k < 0 {
			return nil, fmt.Errorf("grouped frame truncated at the group of message %d of %d (offset %d)", i, n, off+4)
		}
		off += k
		l, k := protowire.ConsumeVarint(b[off:])
		if k < 0 {
			return nil, fmt.Errorf("grouped frame truncated at the length of message %d of %d (offset %d)", i, n, off+4)
		}
		off += k
		if l > uint64(len(b)-off) {
			return nil, fmt.Errorf("grouped frame message %d claims %d bytes, %d left (offset %d)", i, l, len(b)-off, off+4)
		}
		out = append(out, inMsg{group: g, data: b[off : off+int(l)]})
		off += int(l)
	}
	if off != len(b) {
		return nil, fmt.Errorf("grouped frame has %d trailing bytes", len(b)-off)
	}
	return out, nil
}

// decodeBatch reads a legacy frame as every release before groups did
// (the tests hold frames sent to an older peer to it).
func decodeBatch(b []byte) ([][]byte, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("batch of %d bytes has no count", len(b))
	}
	n := binary.BigEndian.Uint32(b)
	off := 4
	if uint64(n)*4 > uint64(len(b)) {
		return nil, fmt.Errorf("batch claims %d messages in %d bytes", n, len(b))
	}
	out := make([][]byte, 0, n)
	for i := uint32(0); i < n; i++ {
		if len(b)-off < 4 {
			return nil, fmt.Errorf("batch truncated at message %d of %d (offset %d)", i, n, off)
		}
		l := int(binary.BigEndian.Uint32(b[off:]))
		off += 4
		if l < 0 || len(b)-off < l {
			return nil, fmt.Errorf("batch message %d claims %d bytes, %d left (offset %d)", i, l, len(b)-off, off)
		}
		out = append(out, b[off:off+l])
		off += l
	}
	if off != len(b) {
		return nil, fmt.Errorf("batch has %d trailing bytes", len(b)-off)
	}
	return out, nil
}
