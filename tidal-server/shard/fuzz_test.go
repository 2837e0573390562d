package shard

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"testing"
)

// FuzzDecode: Decode never panics on any input, and whatever it accepts is
// a valid map that re-encodes to exactly the input (the encoding is
// canonical) and survives its JSON form. Each input is decoded as it is
// and also as a payload wrapped in a correct envelope (magic, version,
// length, CRC), since random bytes rarely pass the CRC and the payload
// parser must be just as robust.
func FuzzDecode(f *testing.F) {
	for _, c := range []struct{ s, r, n int }{{1, 1, 1}, {1, 3, 3}, {6, 3, 6}, {7, 3, 5}, {2, 1, 2}} {
		nodes := make([]NodeID, c.n)
		for i := range nodes {
			nodes[i] = NodeID(i + 1)
		}
		m, err := Bootstrap(c.s, c.r, nodes)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(m.Encode())
	}
	f.Add([]byte("TSHM"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecoded(t, b)
		if len(b) > headerLen+trailerLen && bytes.Equal(b[:4], magic[:]) {
			checkDecoded(t, wrap(b[headerLen:len(b)-trailerLen]))
		}
		checkDecoded(t, wrap(b))
	})
}

// wrap puts payload in a version-1 envelope with a correct CRC.
func wrap(payload []byte) []byte {
	b := append([]byte{}, magic[:]...)
	b = binary.LittleEndian.AppendUint16(b, FormatVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// checkDecoded holds what FuzzDecode states for one input.
func checkDecoded(t *testing.T, b []byte) {
	t.Helper()
	m, err := Decode(b)
	if err != nil {
		return
	}
	if verr := m.Validate(); verr != nil {
		t.Fatalf("Decode returned an invalid map: %v", verr)
	}
	if again := m.Encode(); !bytes.Equal(again, b) {
		t.Fatalf("re-encoding differs from the decoded input:\n in %x\nout %x", b, again)
	}
	j, err := json.Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	var back Map
	if err := json.Unmarshal(j, &back); err != nil {
		t.Fatalf("the JSON form of a decoded map does not parse: %v\n%s", err, j)
	}
	if !bytes.Equal(back.Encode(), b) {
		t.Fatalf("JSON round trip changed the map: %s", j)
	}
	// Routing never panics on a decoded map.
	for _, e := range []uint64{0, 1, 1 << 40, ^uint64(0)} {
		_ = m.GroupOf(e)
	}
	_ = m.SplitBatch([]uint64{1, 2, 3})
}

// FuzzDecodeRouteError: a client parsing any body never panics, and an
// epoch mismatch it accepts carries a valid map.
func FuzzDecodeRouteError(f *testing.F) {
	m, err := Bootstrap(3, 1, []NodeID{1, 2})
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range []error{m.CheckRoute(1, 1, []uint64{2}), m.NotLeaderOf(1, 0)} {
		body, _ := EncodeRouteError(e)
		f.Add(body)
	}
	f.Add([]byte(`{"error":{"code":"not_leader","not_leader":{}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := DecodeRouteError(body)
		if err != nil {
			return
		}
		if em, ok := e.(*EpochMismatch); ok {
			if verr := em.Current.Validate(); verr != nil {
				t.Fatalf("accepted an epoch mismatch with an invalid map: %v", verr)
			}
		}
		_ = e.Error()
	})
}
