package peer

import (
	"bufio"
	"bytes"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func appendMessage(entries, entrySize int) *raftpb.Message {
	m := &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(7),
		LogTerm: proto.Uint64(7), Index: proto.Uint64(1000), Commit: proto.Uint64(990)}
	for i := 0; i < entries; i++ {
		m.Entries = append(m.Entries, &raftpb.Entry{Term: proto.Uint64(7), Index: proto.Uint64(uint64(1001 + i)),
			Type: raftpb.EntryNormal.Enum(), Data: bytes.Repeat([]byte{byte(i)}, entrySize)})
	}
	return m
}

// headerCorpus holds marshalled messages and hand-made encodings that
// test the protobuf rules scanHeader must share with proto.Unmarshal.
func headerCorpus(t testing.TB) [][]byte {
	tag := func(b []byte, num protowire.Number, typ protowire.Type) []byte {
		return protowire.AppendTag(b, num, typ)
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(nil, num, protowire.VarintType), v)
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	return [][]byte{
		marshal(t, heartbeat(1, 2, 3)),
		marshal(t, appendMessage(3, 10)),
		marshal(t, &raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: proto.Uint64(2), To: proto.Uint64(1),
			Snapshot: &raftpb.Snapshot{Data: []byte("state")}}),
		{},
		// From twice: the last wins.
		cat(varint(3, 1), varint(3, 9), varint(2, 2)),
		// From as fixed64 is an unknown field, not the sender.
		cat(varint(3, 2), protowire.AppendFixed64(tag(nil, 3, protowire.Fixed64Type), 1)),
		// From inside a group is not the message's From.
		cat(varint(3, 2), tag(nil, 15, protowire.StartGroupType), varint(3, 1), tag(nil, 15, protowire.EndGroupType)),
		// A header after the entries.
		cat(protowire.AppendBytes(tag(nil, 7, protowire.BytesType), mustMarshal(t, &raftpb.Entry{Index: proto.Uint64(1)})), varint(3, 4)),
		// An unknown enum value, a non-minimal varint, a field 12 context.
		cat(varint(1, 1<<40), []byte{3 << 3, 0x85, 0x80, 0x00}, protowire.AppendBytes(tag(nil, 12, protowire.BytesType), []byte("ctx"))),
		// Broken: truncated varint, bytes longer than the rest, unmatched group.
		{3 << 3, 0x80},
		cat(tag(nil, 12, protowire.BytesType), []byte{5, 1}),
		cat(tag(nil, 15, protowire.StartGroupType), varint(3, 1)),
		cat(tag(nil, 15, protowire.EndGroupType)),
	}
}

func checkHeaderAgrees(t *testing.T, b []byte) {
	t.Helper()
	h, herr := parseHeader(b)
	hs, serr := readHeader(bufio.NewReaderSize(bytes.NewReader(b), 16))
	if (herr == nil) != (serr == nil) || h != hs {
		t.Fatalf("%x: in memory %+v (%v), streamed %+v (%v); expected the same", b, h, herr, hs, serr)
	}
	var m raftpb.Message
	if err := proto.Unmarshal(b, &m); err != nil {
		return // raft refuses it too
	}
	if herr != nil {
		t.Fatalf("%x: proto decodes it (from %d) but the header scan fails: %v", b, m.GetFrom(), herr)
	}
	want := header{Type: m.GetType(), To: m.GetTo(), From: m.GetFrom(), Term: m.GetTerm()}
	if h != want {
		t.Fatalf("%x: header scan reads %+v, proto reads %+v", b, h, want)
	}
}

// The sender checked is the sender raft sees.
func TestHeaderMatchesProto(t *testing.T) {
	corpus := headerCorpus(t)
	for _, b := range corpus {
		checkHeaderAgrees(t, b)
	}
	if h, err := parseHeader(corpus[4]); err != nil || h.From != 9 {
		t.Errorf("duplicate From: read %d (%v); expected the last, 9", h.From, err)
	}
	if h, err := parseHeader(corpus[5]); err != nil || h.From != 2 {
		t.Errorf("From as fixed64: read %d (%v); expected the varint 2", h.From, err)
	}
	for _, b := range corpus[len(corpus)-4:] {
		if _, err := parseHeader(b); err == nil {
			t.Errorf("%x: header scan accepted broken bytes", b)
		}
	}
}

// FuzzHeaderMatchesProto holds the header scan to proto.Unmarshal: on
// any bytes proto decodes as a raftpb.Message, both read the same type,
// to, from and term, in memory and streamed.
func FuzzHeaderMatchesProto(f *testing.F) {
	for _, b := range headerCorpus(f) {
		f.Add(b)
	}
	f.Fuzz(checkHeaderAgrees)
}

func BenchmarkHeader(b *testing.B) {
	for _, c := range []struct {
		name string
		msg  *raftpb.Message
	}{
		{"heartbeat", heartbeat(1, 2, 3)},
		{"append-64x1KiB", appendMessage(64, 1024)},
		{"append-512x8KiB", appendMessage(512, 8192)},
	} {
		data := marshal(b, c.msg)
		b.Run(c.name+"/scan", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseHeader(data); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/unmarshal", func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				var m raftpb.Message
				if err := proto.Unmarshal(data, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
