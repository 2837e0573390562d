package replica

import (
	"encoding/binary"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

func TestDropNoticeRoundTrip(t *testing.T) {
	for _, n := range []dropNotice{
		{cause: dropTransfer, transferee: 2, requests: []uint64{1 << 40, 1<<40 + 1}},
		{cause: dropOverloaded, requests: []uint64{7}},
	} {
		got, err := decodeDropNotice(encodeDropNotice(n))
		if err != nil {
			t.Fatalf("decode(encode(%+v)): %v", n, err)
		}
		if got.cause != n.cause || got.transferee != n.transferee || !slices.Equal(got.requests, n.requests) {
			t.Errorf("decode(encode(%+v)) = %+v", n, got)
		}
	}
}

// A notice that is cut, padded or of another version is refused, never
// read as naming requests it does not carry.
func TestDropNoticeRefusesMalformed(t *testing.T) {
	good := encodeDropNotice(dropNotice{cause: dropTransfer, transferee: 2, requests: []uint64{5, 6}})
	bad := map[string][]byte{
		"empty":     nil,
		"short":     good[:dropNoticeHeader-1],
		"truncated": good[:len(good)-1],
		"padded":    append(slices.Clone(good), 0),
		"version":   append([]byte{dropNoticeVersion + 1}, good[1:]...),
	}
	for name, b := range bad {
		if n, err := decodeDropNotice(b); err == nil {
			t.Errorf("%s: decoded %+v, expected an error", name, n)
		}
	}
}

// proposers reads the origin and request ids of every framing a proposal
// can carry, so a notice names exactly the waiters of the dropped entries.
func TestProposersReadsEveryEnvelope(t *testing.T) {
	r := &Replica{cfg: Config{ID: 3}}
	marker := make([]byte, envelopeHeader)
	marker[0] = confMarkerVersion
	binary.BigEndian.PutUint64(marker[1:], 3)
	binary.BigEndian.PutUint64(marker[9:], 42)
	packed := func(envelope byte) []byte {
		b := []byte{envelope}
		b = binary.BigEndian.AppendUint64(b, 3)
		b = binary.BigEndian.AppendUint32(b, 2)
		for _, req := range []uint64{8, 9} {
			b = binary.BigEndian.AppendUint64(b, req)
			b = binary.BigEndian.AppendUint32(b, 1)
			b = append(b, 'x')
		}
		return b
	}
	for _, tc := range []struct {
		name string
		ents []*raftpb.Entry
		reqs []uint64
	}{
		{"write", []*raftpb.Entry{{Data: r.envelope(7, []byte("cmd"))}}, []uint64{7}},
		{"membership change", []*raftpb.Entry{{Data: marker}, {Type: raftpb.EntryConfChangeV2.Enum(), Data: []byte{1}}}, []uint64{42}},
		{"pack of entry format 2", []*raftpb.Entry{{Data: packed(packedVersion)}}, []uint64{8, 9}},
		{"pack of entry format 3", []*raftpb.Entry{{Data: packed(packedSpansVersion)}}, []uint64{8, 9}},
		{"unframed", []*raftpb.Entry{{Data: []byte("legacy")}}, nil},
	} {
		origin, reqs := proposers(tc.ents)
		if !slices.Equal(reqs, tc.reqs) || (len(tc.reqs) > 0 && origin != 3) {
			t.Errorf("%s: proposers = %d, %v; expected 3, %v", tc.name, origin, reqs, tc.reqs)
		}
	}
}
