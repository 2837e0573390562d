//go:build tidalbugs

package server

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// replayedTwice is how many signal entries apply-twice-after-restart folds
// a second time: the first ones a restarted node applies, which are the
// head of its replayed log (the entries after its newest snapshot).
const replayedTwice = 5

// plantedState is what the defects of a tidalbugs build need to know.
// Both fields are touched only by the apply goroutine, or before it
// starts (noteRestart), under StateMachine.mu.
type plantedState struct {
	restarted   bool // the data dir held a WAL when the process started
	foldedTwice int  // entries apply-twice-after-restart has doubled so far
}

// noteRestart records whether this process started on an existing data
// dir: "after a restart" for both restart defects.
func (s *StateMachine) noteRestart(dataDir string) {
	_, err := os.Stat(filepath.Join(dataDir, "wal"))
	s.planted.restarted = err == nil
}

// plantedRefold returns the batch a defective node folds instead of
// events. The ledger's id memory cannot be switched off from outside its
// package (and must not be, in a normal build), so a second fold is made
// by a copy of the event under a derived id: the aggregates count the
// event twice, exactly as a state machine without the id check would,
// and the node's audit lists the derived id (an id no client sent).
func (s *StateMachine) plantedRefold(index uint64, events []ledger.Event) []ledger.Event {
	if !s.planted.restarted || len(events) == 0 {
		return events
	}
	out := events
	if bugs.Active(bugs.ApplyTwiceAfterRestart) && s.planted.foldedTwice < replayedTwice {
		s.planted.foldedTwice++
		out = append(append([]ledger.Event(nil), events...), events...)
		for i := len(events); i < len(out); i++ {
			out[i].ID = derivedID(out[i].ID, "again", index)
		}
	}
	if bugs.Active(bugs.DropDedupOnRestart) {
		copied := len(out) != len(events)
		for i := range out {
			if _, seen := s.ledger.Lookup(out[i].ID); !seen {
				continue
			}
			if !copied {
				out, copied = slices.Clone(out), true
			}
			out[i].ID = derivedID(out[i].ID, "refold", index)
		}
	}
	return out
}

func derivedID(id, why string, index uint64) string {
	suffix := fmt.Sprintf("~%s@%d", why, index)
	if len(id)+len(suffix) > ledger.MaxIDLen {
		id = id[:ledger.MaxIDLen-len(suffix)]
	}
	return id + suffix
}
