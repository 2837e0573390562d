package replica

import (
	"fmt"
	"sync/atomic"

	"go.etcd.io/raft/v3/raftpb"
)

// Entry formats. Every normal entry's data starts with
// an envelope byte (envelopeVersion, confMarkerVersion, ...): the kind of
// framing that follows. Each envelope belongs to an entry format, a number
// that only grows; a build reads every format up to EntryFormat. Format 1
// is the envelope and the conf change marker; raft's own conf change
// entries belong to format 1 too.
//
// The contract for a new kind of entry (packed proposals, say):
//
//  1. Give it a new envelope byte, belonging to entry format N =
//     EntryFormat+1, in envelopeFormats, and raise EntryFormat to N.
//  2. Propose it only while Replica.EntryFormatAllowed(N): every current
//     member (voter or learner) advertised, on the peer plane, that it
//     reads format N. A member not heard from yet counts as format 1,
//     as does a member of a release before the handshake. Otherwise
//     propose the format-1 equivalent. The check is made at proposal
//     time by the proposing node, so a node of an older release added
//     later stops new format-N proposals from then on; entries already
//     in the log stay.
//  3. Nothing else: the peer plane withholds an append carrying an entry
//     of a format its peer has not advertised, drops on receipt a MsgApp
//     carrying an entry whose format the receiver cannot read
//     (tidal_peer_messages_dropped_total{reason="entry_format"}), and an
//     entry of an unknown format that
//     reaches apply anyway (a log written under a newer release, then
//     downgraded) stops the node with an *EntryFormatError instead of
//     skipping it — a skipped entry is a replica that diverged.
//
// Format 2 adds packed proposals (pack.go, envelope packedVersion) whose
// commands take positions under format 2's rule: an embedding put takes
// none. Format 3 adds the packed envelope packedSpansVersion, the same
// framing, whose commands take positions under ledger.Span's rule: every
// command takes at least one. An entry keeps the rule of the envelope it
// was written in (AppEntry.PackFormat), so a log written while some member
// read only format 2 replays identically on every release.
const EntryFormat = 3

// Entry formats of the packed envelopes.
const (
	// PackedEntryFormat is the format of envelope packedVersion: packed
	// proposals under format 2's position rule.
	PackedEntryFormat = 2
	// PackedSpansEntryFormat is the format of envelope packedSpansVersion:
	// packed proposals under ledger.Span's position rule.
	PackedSpansEntryFormat = 3
)

// envelopeFormats maps each envelope byte to the entry format that
// introduced it.
var envelopeFormats = map[byte]uint32{
	envelopeVersion:    1,
	confMarkerVersion:  1,
	packedVersion:      PackedEntryFormat,
	packedSpansVersion: PackedSpansEntryFormat,
}

// EntryFormatOf returns the entry format an entry needs to be read: 1 for
// raft's own entries (conf changes, the empty entry of a new leader), the
// format of its envelope otherwise. known is false for an envelope this
// build does not know, which a newer release wrote.
func EntryFormatOf(typ raftpb.EntryType, data []byte) (format uint32, known bool) {
	if typ != raftpb.EntryNormal || len(data) == 0 {
		return 1, true
	}
	f, ok := envelopeFormats[data[0]]
	return f, ok
}

// EntryFormatError is an entry this build cannot read, met at apply.
type EntryFormatError struct {
	Index, Term uint64
	Envelope    byte
}

func (e *EntryFormatError) Error() string {
	return fmt.Sprintf("entry at log index %d (term %d) has envelope %d, which no entry format up to %d (this build's) defines: "+
		"a newer tidal-server wrote it. Run a release that reads it on this node; the entry is not skipped, since skipping it would make "+
		"this replica diverge", e.Index, e.Term, e.Envelope, EntryFormat)
}

// PeerFormats is what a transport learned of its peers' formats (the peer
// plane's version handshake). A Transport that implements it lets the
// replica apply the minimum-entry-format rule; one that does not makes
// every peer count as format 1.
type PeerFormats interface {
	// PeerEntryFormat is the newest entry format peer id advertised it
	// reads; false when it advertised nothing yet.
	PeerEntryFormat(id uint64) (uint32, bool)
}

// testEntryFormat stands for EntryFormat under SetTestNewerEntryFormat (a
// tidalbugs build's hooks_tidalbugs.go), zero meaning "not set". Atomic: a test restores it while the goroutines
// of the nodes it started (closed only by its cleanup) still read it.
var testEntryFormat atomic.Uint32

// ReadableEntryFormat is the newest entry format this process reads (and
// advertises): EntryFormat, except under SetTestNewerEntryFormat.
func ReadableEntryFormat() uint32 {
	if f := testEntryFormat.Load(); f != 0 {
		return f
	}
	return EntryFormat
}

// ClusterEntryFormat is the newest entry format every current member
// reads, as this node knows: the minimum of what each advertised (1 for a
// member that advertised nothing) and of its own.
func (r *Replica) ClusterEntryFormat() uint32 {
	min := ReadableEntryFormat()
	pf, _ := r.cfg.Transport.(PeerFormats)
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.members.Members {
		if id == r.cfg.ID {
			continue
		}
		f := uint32(1)
		if pf != nil {
			if adv, ok := pf.PeerEntryFormat(id); ok {
				f = adv
			}
		}
		if f < min {
			min = f
		}
	}
	return min
}

// EntryFormatAllowed says whether this node may propose entries of format
// n now: every current member reads it (the minimum-entry-format rule).
func (r *Replica) EntryFormatAllowed(n uint32) bool { return n <= r.ClusterEntryFormat() }
