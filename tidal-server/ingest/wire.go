package ingest

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// The messages of tidal.v1.Ingest/Stream are a compact hand-written
// binary encoding, not protobuf, as the peer plane's are (docs/
// ARCHITECTURE.md, "Ingest stream"): gRPC carries them through a codec
// that passes bytes (rawCodec). All integers little-endian.
//
//	Request  = u8 version (1) | u64 request id | u32 n | n × Event
//	Event    = u8 flags | u64 entity | u16 len | id | u16 len | signal
//	           | f64 weight (flags & 1) | i64 ts (flags & 2)
//	Response = u8 version (1) | u64 request id | u16 status | Outcome
//	Outcome  = status 200: u64 index | u64 term | u64 node | u32 duplicates
//	         | otherwise:  u16 retry-after seconds | u64 leader id
//	                       | u16 len | code | u16 len | field | u32 len | message
//	                       | u16 len | leader client address
//
// The status and code are the HTTP API's (400 invalid_argument, 409,
// 413, 503 with retry-after, 504 timeout, ...). Request id 0 is
// reserved: a Response with id 0 answers no request but is a notice about
// the stream itself (code stream_max_age: send new requests on a new
// stream). Package client holds its
// own copy of this encoding (it imports no tidal package); the tests in
// this package check one against the other.
const (
	wireVersion   = 1
	flagWeight    = 1
	flagTS        = 2
	requestHeader = 1 + 8 + 4
	eventFixed    = 1 + 8 + 2 + 2
)

// requestID reads a request's version and id: enough to answer it, even
// when the rest does not decode.
func requestID(msg []byte) (uint64, error) {
	if len(msg) < 1+8 {
		return 0, fmt.Errorf("request of %d bytes: shorter than its header (version, request id)", len(msg))
	}
	if msg[0] != wireVersion {
		return 0, fmt.Errorf("request version %d: this node reads version %d", msg[0], wireVersion)
	}
	return binary.LittleEndian.Uint64(msg[1:]), nil
}

// eventDecoder turns a request's events into ledger events, checking each
// as the HTTP API checks a JSON event (checks names the field at fault).
type eventDecoder interface {
	MaxBatch() int
	CheckEvent(i int, e ledger.Event, tsGiven bool) error
	InternSignal(name []byte) string
	Invalid(field, format string, args ...any) error
	TooLarge(field, format string, args ...any) error
}

// decodeEvents decodes the events of a request whose header requestID
// accepted.
func decodeEvents(msg []byte, in eventDecoder) ([]ledger.Event, error) {
	if len(msg) < requestHeader {
		return nil, in.Invalid("events", "request of %d bytes: shorter than its header", len(msg))
	}
	n := binary.LittleEndian.Uint32(msg[9:])
	if n == 0 {
		return nil, in.Invalid("events", "empty batch; expected at least one event")
	}
	if int64(n) > int64(in.MaxBatch()) {
		return nil, in.TooLarge("events", "batch exceeds the limit of %d events", in.MaxBatch())
	}
	rest := msg[requestHeader:]
	// Every event takes at least eventFixed bytes: a count the message
	// cannot hold is refused before anything is allocated for it.
	if uint64(n)*eventFixed > uint64(len(rest)) {
		return nil, in.Invalid("events", "request declares %d events but holds %d bytes", n, len(rest))
	}
	events := make([]ledger.Event, n)
	// Every id is a substring of one copy of the events: one allocation
	// per request instead of one per event (101 → 2 for 100 events), as
	// the HTTP API's decoder does.
	all := string(rest)
	for i := range events {
		field := func(key string) string { return fmt.Sprintf("events[%d].%s", i, key) }
		if len(rest) < 1+8 {
			return nil, in.Invalid(fmt.Sprintf("events[%d]", i), "truncated event")
		}
		flags := rest[0]
		if flags&^(flagWeight|flagTS) != 0 {
			return nil, in.Invalid(fmt.Sprintf("events[%d]", i), "unknown flags 0x%02x", flags)
		}
		e := ledger.Event{Entity: binary.LittleEndian.Uint64(rest[1:]), Weight: 1}
		rest = rest[9:]
		idAt := len(all) - len(rest) + 2 // the id's bytes, after their u16 length
		id, r, ok := str16(rest)
		if !ok {
			return nil, in.Invalid(field("id"), "truncated")
		}
		signal, r, ok := str16(r)
		if !ok {
			return nil, in.Invalid(field("signal"), "truncated")
		}
		rest = r
		e.ID = all[idAt : idAt+len(id)]
		e.Signal = in.InternSignal(signal)
		if flags&flagWeight != 0 {
			if len(rest) < 8 {
				return nil, in.Invalid(field("weight"), "truncated")
			}
			e.Weight = math.Float64frombits(binary.LittleEndian.Uint64(rest))
			rest = rest[8:]
		}
		if flags&flagTS != 0 {
			if len(rest) < 8 {
				return nil, in.Invalid(field("ts"), "truncated")
			}
			e.TS = int64(binary.LittleEndian.Uint64(rest))
			rest = rest[8:]
		}
		if err := in.CheckEvent(i, e, flags&flagTS != 0); err != nil {
			return nil, err
		}
		events[i] = e
	}
	if len(rest) != 0 {
		return nil, in.Invalid("events", "%d bytes after the last event", len(rest))
	}
	return events, nil
}

func str16(b []byte) (s, rest []byte, ok bool) {
	if len(b) < 2 {
		return nil, nil, false
	}
	n := int(binary.LittleEndian.Uint16(b))
	if len(b) < 2+n {
		return nil, nil, false
	}
	return b[2 : 2+n], b[2+n:], true
}

// encodeOK is the answer to an applied request.
func encodeOK(req, index, term, node uint64, duplicates int) []byte {
	b := make([]byte, 0, 1+8+2+8+8+8+4)
	b = append(b, wireVersion)
	b = binary.LittleEndian.AppendUint64(b, req)
	b = binary.LittleEndian.AppendUint16(b, 200)
	b = binary.LittleEndian.AppendUint64(b, index)
	b = binary.LittleEndian.AppendUint64(b, term)
	b = binary.LittleEndian.AppendUint64(b, node)
	return binary.LittleEndian.AppendUint32(b, uint32(duplicates))
}

// refusal is a request's error answer.
type refusal struct {
	status     int
	retryAfter int // seconds
	leader     uint64
	code       string
	field      string
	message    string
	leaderAddr string
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func encodeRefusal(req uint64, r refusal) []byte {
	code, field, addr := clip(r.code, math.MaxUint16), clip(r.field, math.MaxUint16), clip(r.leaderAddr, math.MaxUint16)
	msg := clip(r.message, 64<<10)
	b := make([]byte, 0, 1+8+2+2+8+2+len(code)+2+len(field)+4+len(msg)+2+len(addr))
	b = append(b, wireVersion)
	b = binary.LittleEndian.AppendUint64(b, req)
	b = binary.LittleEndian.AppendUint16(b, uint16(r.status))
	b = binary.LittleEndian.AppendUint16(b, uint16(min(max(r.retryAfter, 0), math.MaxUint16)))
	b = binary.LittleEndian.AppendUint64(b, r.leader)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(code)))
	b = append(b, code...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(field)))
	b = append(b, field...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	b = append(b, msg...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(addr)))
	return append(b, addr...)
}

// rawCodec passes []byte through, as the peer plane's does: the messages
// are encoded by hand above.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("ingest codec: expected *[]byte, found %T", v)
	}
	return *b, nil
}

// Unmarshal copies: gRPC may reuse data once it returns, and a request is
// handled after the receive loop has moved on.
func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("ingest codec: expected *[]byte, found %T", v)
	}
	*b = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "tidal-ingest" }
