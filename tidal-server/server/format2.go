package server

import (
	"fmt"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

// The position rule of entry format 2, kept so a log written under it
// replays identically.
//
// A packed entry in the envelope of entry format 2
// (AppEntry.PackFormat == replica.PackedEntryFormat) is applied exactly as
// the releases that write format 2 apply it, on every node of every
// release: a leader writes format 2 while some member of the cluster runs
// such a release, and the replicas stay equal only if they all apply it
// alike — the format-2 rule, defect included. Packed entries of format 3
// take ledger.Span's positions (applyLocked). Under format 2's rule:
//
//   - a signals command's events take positions from where the previous
//     decoded signals command of the entry ended (from 0 for the first),
//     and every other command — an embedding put, an empty or undecodable
//     command, one of an unknown kind — takes none;
//   - every command but the entry's first moves the applied index to the
//     entry, so a signals command at position 0 that is not the entry's
//     first (every command ahead of it took no position) is refused with
//     ledger.ErrAlreadyApplied, not applied, though it never was: the
//     defect format 3 removes;
//   - a signals command without events applies without folding anything.
//
// The ledger knows only ledger.Span's positions; it is told the format-2
// ones: the positions up to a command's first that no earlier command of
// the entry took are consumed (ledger.Consume) before the command is
// applied there (ledger.ApplyAt), and the entry is finished after its
// last command. Events land where format 2 put them, and the state —
// Digest included — is the one a release that writes format 2 reaches.
//
// A replay of a format-2 entry (its index already applied: never on the
// apply path, which skips applied entries) is refused command by command,
// as one of format 3 is.
type format2Entry struct {
	next     uint32 // where the next signals command's events start
	consumed uint32 // positions of the entry the ledger was told of
	replay   bool   // the entry's index was applied before its first command
}

// applyFormat2 applies command e.Sub of a packed entry of entry format 2.
func (s *StateMachine) applyFormat2(e replica.AppEntry) any {
	if e.Sub == 0 {
		s.format2 = format2Entry{replay: e.Index <= s.ledger.AppliedIndex()}
	}
	res := s.applyFormat2Command(e)
	if e.Index > s.applied {
		s.applied = e.Index
	}
	if e.Sub == e.Subs-1 && !s.format2.replay {
		if s.format2.consumed == 0 {
			s.ledger.SetApplied(e.Index) // finishes the entry too
		} else {
			s.ledger.FinishEntry()
		}
	}
	return res
}

func (s *StateMachine) applyFormat2Command(e replica.AppEntry) any {
	f := &s.format2
	index, data := e.Index, e.Data
	if f.replay {
		err := fmt.Errorf("%w: entry index %d, applied index %d", ledger.ErrAlreadyApplied, index, s.ledger.AppliedIndex())
		if len(data) > 0 && data[0] == kindEmbedding {
			return EmbeddingResult{Err: err}
		}
		return SignalsResult{Err: err}
	}
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case kindSignals:
		events, err := decodeSignalsInto(s.events[:0], data, s.signalNames)
		s.events = events[:0]
		defer clear(events) // the next entry must not see (or retain) these
		if err != nil {
			return SignalsResult{Err: err}
		}
		events = s.plantedRefold(index, events)
		first := f.next
		f.next += uint32(len(events))
		if first == 0 && e.Sub > 0 {
			return SignalsResult{Err: fmt.Errorf("%w: entry index %d, applied index %d", ledger.ErrAlreadyApplied, index, index)}
		}
		if len(events) == 0 {
			return SignalsResult{}
		}
		if first > f.consumed {
			if err := s.ledger.Consume(index, f.consumed, first-f.consumed); err != nil {
				return SignalsResult{Err: err}
			}
			f.consumed = first
		}
		res, err := s.ledger.ApplyAt(index, e.Term, first, events)
		if err != nil {
			return SignalsResult{Err: err}
		}
		f.consumed = first + uint32(len(events))
		return SignalsResult{Applied: res.Applied, Duplicates: res.Duplicates}
	case kindEmbedding:
		p, err := decodeEmbedding(data)
		if err != nil {
			return EmbeddingResult{Err: err}
		}
		return s.applyEmbedding(index, p)
	}
	return SignalsResult{Err: fmt.Errorf("unknown command kind %d at index %d", data[0], index)}
}
