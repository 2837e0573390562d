package replica

import (
	"encoding/binary"
	"testing"
)

func envelopeEntry(version byte, origin, request uint64, payload string) []byte {
	b := []byte{version}
	b = binary.BigEndian.AppendUint64(b, origin)
	b = binary.BigEndian.AppendUint64(b, request)
	return append(b, payload...)
}

// decodeFrame reads every kind of normal entry the apply loop and the
// replay of a stopped node's log meet, and appends proposals to the run
// it is given without touching what the run held.
func TestDecodeFrame(t *testing.T) {
	held := []pendingApp{{AppEntry: AppEntry{Index: 8, Data: []byte("held")}}}
	for _, tc := range []struct {
		name  string
		data  []byte
		kind  frameKind
		cmds  []string
		extra func(t *testing.T, f frame)
	}{
		{name: "empty", data: nil, kind: frameNothing},
		{name: "proposal", data: envelopeEntry(envelopeVersion, 3, 44, "cmd"), kind: frameProposals, cmds: []string{"cmd"},
			extra: func(t *testing.T, f frame) {
				if p := f.run[1]; p.origin != 3 || p.request != 44 || p.Subs != 1 || p.Sub != 0 {
					t.Errorf("proposal: %+v, expected origin 3, request 44, sub 0 of 1", p)
				}
			}},
		{name: "conf marker", data: envelopeEntry(confMarkerVersion, 3, 45, ""), kind: frameConfMarker,
			extra: func(t *testing.T, f frame) {
				if f.marker != (confMarker{index: 9, term: 2, origin: 3, request: 45}) {
					t.Errorf("marker %+v, expected index 9 term 2 origin 3 request 45", f.marker)
				}
			}},
		{name: "packed format 2", data: packedEntryIn(packedVersion, 3, []byte("a"), []byte("b")), kind: frameProposals, cmds: []string{"a", "b"}},
		{name: "packed format 3", data: packedEntryIn(packedSpansVersion, 3, []byte("a")), kind: frameProposals, cmds: []string{"a"}},
		{name: "proposal cut short", data: envelopeEntry(envelopeVersion, 3, 44, "")[:envelopeHeader-1], kind: frameMalformed},
		{name: "marker cut short", data: []byte{confMarkerVersion, 0}, kind: frameMalformed},
		{name: "packed cut short", data: packedEntry(3, []byte("abc"))[:packedHeader+2], kind: frameMalformed},
		{name: "unknown envelope", data: []byte{200, 1, 2, 3}, kind: frameUnknown},
	} {
		f := decodeFrame(held, 9, 2, tc.data)
		if f.kind != tc.kind {
			t.Errorf("%s: kind %d, expected %d", tc.name, f.kind, tc.kind)
			continue
		}
		if len(f.run) != 1+len(tc.cmds) || string(f.run[0].Data) != "held" {
			t.Errorf("%s: run of %d, expected the held command and %d more", tc.name, len(f.run), len(tc.cmds))
			continue
		}
		for i, want := range tc.cmds {
			if p := f.run[1+i]; string(p.Data) != want || p.Index != 9 || p.Term != 2 {
				t.Errorf("%s: command %d: %+v, expected %q at (9, 2)", tc.name, i, p, want)
			}
		}
		if tc.kind == frameMalformed && tc.name == "packed cut short" && f.err == nil {
			t.Errorf("%s: expected the reason it does not decode", tc.name)
		}
		if tc.extra != nil {
			tc.extra(t, f)
		}
	}
}
