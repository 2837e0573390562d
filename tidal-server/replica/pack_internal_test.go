package replica

import (
	"encoding/binary"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

func packedEntry(origin uint64, cmds ...[]byte) []byte {
	return packedEntryIn(packedVersion, origin, cmds...)
}

func packedEntryIn(envelope byte, origin uint64, cmds ...[]byte) []byte {
	b := []byte{envelope}
	b = binary.BigEndian.AppendUint64(b, origin)
	b = binary.BigEndian.AppendUint32(b, uint32(len(cmds)))
	for i, c := range cmds {
		b = binary.BigEndian.AppendUint64(b, uint64(100+i))
		b = binary.BigEndian.AppendUint32(b, uint32(len(c)))
		b = append(b, c...)
	}
	return b
}

// unpack takes a packed entry apart into its commands, in order, and
// refuses (appending nothing) every malformed one: a node must never
// apply part of an entry.
func TestUnpack(t *testing.T) {
	good := packedEntry(7, []byte("a"), nil, []byte("ccc"))
	for envelope, format := range map[byte]uint32{packedVersion: PackedEntryFormat, packedSpansVersion: PackedSpansEntryFormat} {
		run, err := unpack(make([]pendingApp, 1), 9, 2, packedEntryIn(envelope, 7, []byte("a"), nil, []byte("ccc")))
		if err != nil {
			t.Fatal(err)
		}
		if len(run) != 4 {
			t.Fatalf("expected 1 + 3 commands, found %d", len(run))
		}
		for i, want := range []string{"a", "", "ccc"} {
			p := run[1+i]
			if string(p.Data) != want || p.Index != 9 || p.Term != 2 || p.Sub != i || p.Subs != 3 || p.origin != 7 || p.request != uint64(100+i) || p.PackFormat != format {
				t.Errorf("envelope %d, command %d: %+v, expected data %q at (9, 2), sub %d of 3, origin 7, request %d, pack format %d", envelope, i, p, want, i, 100+i, format)
			}
		}
	}
	bad := map[string][]byte{
		"empty":          {},
		"header only":    good[:packedHeader-1],
		"zero commands":  packedEntry(7),
		"count too high": append(append([]byte{}, good[:9]...), 0, 0, 1, 0),
		"truncated data": good[:len(good)-1],
		"trailing bytes": append(append([]byte{}, good...), 0),
		"wrong version":  append([]byte{envelopeVersion}, good[1:]...),
	}
	for name, data := range bad {
		run, err := unpack(make([]pendingApp, 1), 9, 2, data)
		if err == nil || len(run) != 1 {
			t.Errorf("%s: expected an error and nothing appended, found %v and %d commands", name, err, len(run)-1)
		}
	}
}

// A leader packs in the newest packed envelope every member reads: a
// member that reads format 2 at most (the release before format 3) gets
// the format-2 envelope, whose entries every node applies under format
// 2's rule, exactly as that release would have written them; none at all
// while a member reads format 1 only.
func TestPackedEnvelopeFollowsTheClusterFormat(t *testing.T) {
	for cluster, want := range map[uint32]byte{1: 0, 2: packedVersion, 3: packedSpansVersion, 4: packedSpansVersion} {
		if got := packedEnvelope(cluster); got != want {
			t.Errorf("packedEnvelope(%d) = %d, expected %d", cluster, got, want)
		}
		if want != 0 {
			if f, known := EntryFormatOf(raftpb.EntryNormal, []byte{want}); !known || f > cluster {
				t.Errorf("envelope %d for cluster format %d is of entry format %d (known %v): the cluster cannot read it", want, cluster, f, known)
			}
		}
	}
}
