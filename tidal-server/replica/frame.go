package replica

import (
	"encoding/binary"

	"go.etcd.io/raft/v3/raftpb"
)

// frameKind is what a normal entry's data holds.
type frameKind uint8

const (
	// frameNothing is raft's empty entry (a new leader's, or the one raft
	// puts in place of a dropped conf change).
	frameNothing frameKind = iota
	// frameProposals is application commands: one proposal in the
	// envelope, or the commands of a packed entry.
	frameProposals
	// frameConfMarker is the marker proposed ahead of a conf change.
	frameConfMarker
	// frameUnknown is an envelope byte no entry format of this build
	// defines: a newer release wrote it.
	frameUnknown
	// frameMalformed is a known envelope that does not decode (cut short,
	// or a packed entry whose commands do not add up). Entries a node
	// framed never are (the log is checksummed); every node skips one
	// alike rather than wedge.
	frameMalformed
)

// frame is a normal entry's data decoded: for frameProposals the commands
// appended to the run passed in, for frameConfMarker the marker.
type frame struct {
	kind   frameKind
	run    []pendingApp
	marker confMarker
	err    error // why a frameMalformed entry does not decode
}

// decodeFrame reads the data of the normal entry at index. It is the one
// reading of an entry's framing: the apply loop and the replay of a
// stopped node's log (ReadSurvivor) both go through it, so a log replays
// exactly as it was applied. Proposals are appended to run (whose
// backing array the caller may reuse); on any other kind run comes back
// unchanged.
func decodeFrame(run []pendingApp, index, term uint64, data []byte) frame {
	switch {
	case len(data) == 0:
		return frame{kind: frameNothing, run: run}
	case data[0] == envelopeVersion || data[0] == confMarkerVersion:
		if len(data) < envelopeHeader {
			return frame{kind: frameMalformed, run: run}
		}
		origin := binary.BigEndian.Uint64(data[1:9])
		request := binary.BigEndian.Uint64(data[9:17])
		if data[0] == confMarkerVersion {
			return frame{kind: frameConfMarker, run: run, marker: confMarker{index: index, term: term, origin: origin, request: request}}
		}
		return frame{kind: frameProposals, run: append(run, pendingApp{
			AppEntry: AppEntry{Index: index, Term: term, Data: data[envelopeHeader:], Subs: 1},
			origin:   origin,
			request:  request,
		})}
	case isPacked(data[0]):
		out, err := unpack(run, index, term, data)
		if err != nil {
			return frame{kind: frameMalformed, run: run, err: err}
		}
		return frame{kind: frameProposals, run: out}
	}
	if _, known := EntryFormatOf(raftpb.EntryNormal, data); !known {
		return frame{kind: frameUnknown, run: run}
	}
	return frame{kind: frameMalformed, run: run}
}
