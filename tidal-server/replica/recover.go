package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/tidaldb/tidal/tidal-server/atomicfile"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// Survivor is what a stopped node's data dir holds, as ForceNewCluster
// (and its dry run) reads it: the basis of a new cluster after the
// quorum was lost.
type Survivor struct {
	// SnapshotIndex is the newest snapshot's index (0: none).
	SnapshotIndex uint64
	// LastIndex and LastTerm are the end of its log: every entry up to
	// there is kept. Commit is the newest commit index it knew; entries
	// in (Commit, LastIndex] were in its log but not known committed.
	LastIndex, LastTerm, Commit uint64
	// Members is its applied membership as of LastIndex (conf changes
	// in the log included), Removed the ids removed before.
	Members []Member
	Removed []uint64
}

// ReadSurvivor replays a stopped node's data dir into sm — the newest
// snapshot, then every entry of its log, committed or not, in order — and
// says what it found. Nothing is written. An entry of a format this build
// cannot read is an *EntryFormatError; damage is the WAL's
// *wal.CorruptionError (repair or choose another survivor).
func ReadSurvivor(dataDir string, sm StateMachine) (*Survivor, error) {
	if err := CheckDataDirFormat(dataDir); err != nil {
		return nil, err
	}
	rec, err := wal.Read(filepath.Join(dataDir, "wal"))
	if err != nil {
		return nil, fmt.Errorf("read the WAL of %s: %w", dataDir, err)
	}
	// Recovery rebuilds the default group alone, and ForceNewCluster sets
	// the whole WAL aside: on a node hosting other groups too, it would
	// drop theirs.
	for g := range rec.Groups {
		if g != wal.DefaultGroup {
			return nil, fmt.Errorf("the WAL of %s holds raft group %d besides group %d: recovery rebuilds a node of one group only, and would set the other groups' logs aside", dataDir, g, wal.DefaultGroup)
		}
	}
	s := &Survivor{Commit: rec.HardState.Commit}
	mem := newMembership()
	if rec.Snapshot.Index > 0 {
		snaps := &snapStore{dir: filepath.Join(dataDir, "snap")}
		snap, err := snaps.load(rec.Snapshot.Term, rec.Snapshot.Index)
		if err != nil {
			return nil, err
		}
		if mem, err = snapshotMembership(snap); err != nil {
			return nil, err
		}
		data := snap.GetData()
		n := 4 + int(binary.BigEndian.Uint32(data)) // snapshotMembership checked the bound
		if err := sm.Restore(bytes.NewReader(data[n:])); err != nil {
			return nil, fmt.Errorf("snapshot at index %d: restore the state: %w", rec.Snapshot.Index, err)
		}
		s.SnapshotIndex, s.LastIndex, s.LastTerm = rec.Snapshot.Index, rec.Snapshot.Index, rec.Snapshot.Term
	}
	for _, e := range rec.Entries {
		if e.Index <= s.SnapshotIndex {
			continue
		}
		re := fromWALEntry(e)
		switch re.GetType() {
		case raftpb.EntryNormal:
			data := re.GetData()
			if _, known := EntryFormatOf(raftpb.EntryNormal, data); !known {
				return nil, &EntryFormatError{Index: e.Index, Term: e.Term, Envelope: data[0]}
			}
			if err := replayNormal(sm, e.Index, e.Term, data); err != nil {
				return nil, err
			}
		case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
			if err := mem.replay(re); err != nil {
				return nil, err
			}
			sm.SetApplied(e.Index)
		}
		s.LastIndex, s.LastTerm = e.Index, e.Term
	}
	if s.LastIndex == 0 {
		return nil, fmt.Errorf("%s holds no state (no snapshot, no log entries): it cannot found a new cluster", dataDir)
	}
	s.Members = mem.sorted()
	for id := range mem.Removed {
		s.Removed = append(s.Removed, id)
	}
	slices.Sort(s.Removed)
	return s, nil
}

// replayNormal applies one normal entry as the apply loop does
// (decodeFrame): a proposal, the proposals a packed entry carries (in one
// ApplyBatch, as the loop hands them over), or nothing (markers, raft's
// empty entries, and what the loop would skip as malformed).
func replayNormal(sm StateMachine, index, term uint64, data []byte) error {
	f := decodeFrame(nil, index, term, data)
	if f.kind != frameProposals {
		sm.SetApplied(index)
		return nil
	}
	if len(f.run) == 1 && f.run[0].Subs == 1 {
		sm.Apply(index, term, f.run[0].Data)
		return nil
	}
	bsm, ok := sm.(BatchStateMachine)
	if !ok {
		return fmt.Errorf("entry %d packs %d proposals, and this state machine cannot apply packed entries (no ApplyBatch)", index, len(f.run))
	}
	ents := make([]AppEntry, len(f.run))
	for i := range f.run {
		ents[i] = f.run[i].AppEntry
	}
	bsm.ApplyBatch(ents)
	return nil
}

// ForceNewCluster rewrites a stopped survivor's data dir as the data dir
// of a new one-member cluster whose only member is self and whose state is
// the survivor's whole log applied (state, a StateMachine.Snapshot of the
// sm ReadSurvivor filled, at index s.LastIndex). Every other member of the
// old cluster is recorded as removed, so if one comes back it is refused
// and told so (and stops, exit status 5) instead of talking to the new
// cluster. The old wal/ and snap/ are moved, not deleted, into
// <data-dir>/pre-recover-<time>/ (returned): the way back.
func ForceNewCluster(dataDir string, self Member, s *Survivor, state []byte) (aside string, err error) {
	aside = filepath.Join(dataDir, "pre-recover-"+time.Now().UTC().Format("20060102T150405"))
	if _, err := os.Stat(aside); err == nil {
		return "", fmt.Errorf("%s already exists: wait a second and run again", aside)
	}
	if err := wal.MkdirAllDurable(aside); err != nil {
		return "", err
	}
	for _, sub := range []string{"wal", "snap"} {
		if err := os.Rename(filepath.Join(dataDir, sub), filepath.Join(aside, sub)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return aside, fmt.Errorf("keep the old %s aside: %w", sub, err)
		}
	}
	for _, d := range []string{aside, dataDir} {
		if err := atomicfile.SyncDir(d); err != nil {
			return aside, err
		}
	}
	removed := slices.Clone(s.Removed)
	for _, m := range s.Members {
		if m.ID != self.ID {
			removed = append(removed, m.ID)
		}
	}
	return aside, restoreDataDir(dataDir, self, s.LastIndex, state, removed)
}
