package peer

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
)

// header is what the transport reads of a marshalled raftpb.Message to
// decide whether raft may see it: who sent it, to whom, its kind and term.
type header struct {
	Type raftpb.MessageType
	To   uint64
	From uint64
	Term uint64
}

// raftpb.Message field numbers (raft.proto).
const (
	fieldType protowire.Number = 1
	fieldTo   protowire.Number = 2
	fieldFrom protowire.Number = 3
	fieldTerm protowire.Number = 4
)

// groupDepthLimit is protowire's recursion limit for skipping groups
// (protowire.DefaultRecursionLimit, unexported there).
const groupDepthLimit = 10000

// wireSource is what the header scanner reads from: a byte slice while
// messages are in memory, a buffered spool file for snapshots.
type wireSource interface {
	io.ByteReader
	// Discard skips n bytes; fewer than n is an error.
	Discard(n int) (int, error)
}

// sliceSource reads a byte slice without copying.
type sliceSource struct {
	b   []byte
	off int
}

func (s *sliceSource) ReadByte() (byte, error) {
	if s.off >= len(s.b) {
		return 0, io.EOF
	}
	c := s.b[s.off]
	s.off++
	return c, nil
}

func (s *sliceSource) Discard(n int) (int, error) {
	if left := len(s.b) - s.off; n > left {
		s.off = len(s.b)
		return left, io.ErrUnexpectedEOF
	}
	s.off += n
	return n, nil
}

var errTruncated = errors.New("truncated")

// parseHeader reads the header of a marshalled raftpb.Message without
// decoding the rest: it walks the top-level fields and skips entries,
// snapshot and context by their length, so a 4 MiB append costs as much
// as a heartbeat (see BenchmarkHeader).
func parseHeader(b []byte) (header, error) {
	return scanHeader(&sliceSource{b: b})
}

// readHeader is parseHeader over a stream (a spooled snapshot).
func readHeader(r *bufio.Reader) (header, error) { return scanHeader(r) }

// scanHeader must agree exactly with proto.Unmarshal into a
// raftpb.Message about the four fields it returns, or the transport would
// check one sender and raft would see another: FuzzHeaderMatchesProto
// holds it to that. So it follows the protobuf runtime's rules: the last
// occurrence of a field wins; a field of a known number but another wire
// type is an unknown field (ignored); a field number outside
// 1..2^29-1, a reserved wire type, a truncated value or an unbalanced
// group is an error; the enum is read as int32 (proto2 closed enums are
// not checked by the Go runtime). It may accept bytes proto.Unmarshal
// refuses (a malformed entry, say): raft then refuses them itself.
func scanHeader(r wireSource) (header, error) {
	var h header
	for {
		tag, err := readVarint(r)
		if errors.Is(err, io.EOF) {
			return h, nil
		}
		if err != nil {
			return header{}, fmt.Errorf("raft message: field tag: %w", err)
		}
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		if tag>>3 < uint64(protowire.MinValidNumber) || tag>>3 > uint64(protowire.MaxValidNumber) {
			return header{}, fmt.Errorf("raft message: field number %d out of range", tag>>3)
		}
		if typ == protowire.VarintType && num >= fieldType && num <= fieldTerm {
			v, err := readVarint(r)
			if err != nil {
				return header{}, fmt.Errorf("raft message: field %d: %w", num, noEOF(err))
			}
			switch num {
			case fieldType:
				h.Type = raftpb.MessageType(int32(v))
			case fieldTo:
				h.To = v
			case fieldFrom:
				h.From = v
			case fieldTerm:
				h.Term = v
			}
			continue
		}
		if err := skipField(r, num, typ, groupDepthLimit); err != nil {
			return header{}, fmt.Errorf("raft message: field %d (wire type %d): %w", num, typ, err)
		}
	}
}

// skipField skips one field's value as protowire.ConsumeFieldValue does.
func skipField(r wireSource, num protowire.Number, typ protowire.Type, depth int) error {
	switch typ {
	case protowire.VarintType:
		_, err := readVarint(r)
		return noEOF(err)
	case protowire.Fixed32Type:
		return discard(r, 4)
	case protowire.Fixed64Type:
		return discard(r, 8)
	case protowire.BytesType:
		n, err := readVarint(r)
		if err != nil {
			return noEOF(err)
		}
		if n > math.MaxInt32 {
			// No gRPC message or snapshot we accept is that long.
			return fmt.Errorf("length %d: %w", n, errTruncated)
		}
		return discard(r, int(n))
	case protowire.StartGroupType:
		if depth < 0 {
			return errors.New("groups nested too deep")
		}
		for {
			tag, err := readVarint(r)
			if err != nil {
				return noEOF(err)
			}
			if tag>>3 > math.MaxInt32 || tag>>3 < uint64(protowire.MinValidNumber) {
				return fmt.Errorf("field number %d out of range in group", tag>>3)
			}
			num2, typ2 := protowire.Number(tag>>3), protowire.Type(tag&7)
			if typ2 == protowire.EndGroupType {
				if num2 != num {
					return fmt.Errorf("group %d ended by %d", num, num2)
				}
				return nil
			}
			if err := skipField(r, num2, typ2, depth-1); err != nil {
				return err
			}
		}
	case protowire.EndGroupType:
		return errors.New("end of a group never started")
	}
	return fmt.Errorf("reserved wire type %d", typ)
}

func discard(r wireSource, n int) error {
	if _, err := r.Discard(n); err != nil {
		return noEOF(err)
	}
	return nil
}

// readVarint reads a varint as protowire.ConsumeVarint: at most 10
// bytes, the tenth at most 1. io.EOF means no byte at all.
func readVarint(r wireSource) (uint64, error) {
	var v uint64
	for i := 0; i < 10; i++ {
		c, err := r.ReadByte()
		if err != nil {
			if i > 0 && errors.Is(err, io.EOF) {
				return 0, errTruncated
			}
			return 0, err
		}
		if i == 9 && c > 1 {
			return 0, errors.New("varint overflows 64 bits")
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v, nil
		}
	}
	return 0, errors.New("varint overflows 64 bits")
}

// noEOF turns an end of input inside a field into a truncation.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errTruncated
	}
	return err
}
