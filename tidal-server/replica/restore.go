package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/tidaldb/tidal/tidal-server/wal"
)

// RestoreDataDir creates dir as the data dir of a new single-node cluster
// whose only member is m and whose state machine starts from state (a
// StateMachine.Snapshot taken at applied index). Like etcd's snapshot
// restore, the result shares no raft identity with the cluster the backup
// came from: grow it with /admin/members.
func RestoreDataDir(dir string, m Member, index uint64, state []byte) error {
	return restoreDataDir(dir, m, index, state, nil)
}

// restoreDataDir is RestoreDataDir with ids to record as removed in the
// new cluster's membership.
func restoreDataDir(dir string, m Member, index uint64, state []byte, removed []uint64) error {
	if entries, err := os.ReadDir(filepath.Join(dir, "wal")); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s already holds a WAL; restore into an empty data dir", dir)
	}
	if index == 0 {
		// Index 0 means "no snapshot" to raft.
		index = 1
	}
	mem := newMembership()
	mem.Members[m.ID] = m
	for _, id := range removed {
		if id != m.ID {
			mem.Removed[id] = true
		}
	}
	mb, err := mem.marshal()
	if err != nil {
		return err
	}
	var data bytes.Buffer
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(mb)))
	data.Write(n[:])
	data.Write(mb)
	data.Write(state)
	const term = 1
	snap := &raftpb.Snapshot{
		Data: data.Bytes(),
		Metadata: &raftpb.SnapshotMetadata{
			Index:     proto.Uint64(index),
			Term:      proto.Uint64(term),
			ConfState: &raftpb.ConfState{Voters: []uint64{m.ID}},
		},
	}
	snaps, err := newSnapStore(filepath.Join(dir, "snap"), nil)
	if err != nil {
		return err
	}
	if err := snaps.save(snap); err != nil {
		return err
	}
	w, _, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{})
	if err != nil {
		return err
	}
	err = w.Save(context.Background(), wal.Batch{
		Snapshot:  &wal.SnapshotMark{Index: index, Term: term},
		HardState: &wal.HardState{Term: term, Commit: index},
	}, true)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// StoredMembers reads the membership a stopped node's data dir holds,
// without opening it for writing: the table of the newest snapshot the WAL
// names, changed by the committed conf changes logged after it. index is
// the log position that table reflects; members is nil for a data dir with
// no state yet. If the WAL is damaged, the part before the damage is read
// and the *wal.CorruptionError is returned with what it gave.
func StoredMembers(dataDir string) (members []Member, index uint64, err error) {
	cfg, err := ReadStoredConfig(dataDir)
	return cfg.Members, cfg.Index, err
}

// StoredConfig is the configuration a stopped node's data dir holds.
type StoredConfig struct {
	// Members are the current members, voters and learners, by id.
	Members []Member
	// Voters are the ids among Members that vote, ascending; the rest are
	// learners.
	Voters []uint64
	// Index is the log position the configuration reflects; 0 (and no
	// members) for a data dir with no state yet.
	Index uint64
}

// ReadStoredConfig is StoredMembers with the voters: the ConfState of the
// newest snapshot the WAL names, changed by the committed conf changes
// logged after it the way the apply loop changes it (a change the
// membership table refuses changes nothing). Errors as StoredMembers.
func ReadStoredConfig(dataDir string) (StoredConfig, error) {
	rec, walErr := wal.Read(filepath.Join(dataDir, "wal"))
	if rec == nil {
		return StoredConfig{}, walErr
	}
	mem := newMembership()
	voters := map[uint64]bool{}
	var index uint64
	if rec.Snapshot.Index > 0 {
		snaps := &snapStore{dir: filepath.Join(dataDir, "snap")}
		snap, err := snaps.load(rec.Snapshot.Term, rec.Snapshot.Index)
		if err != nil {
			return StoredConfig{}, err
		}
		if mem, err = snapshotMembership(snap); err != nil {
			return StoredConfig{}, err
		}
		for _, id := range snap.GetMetadata().GetConfState().GetVoters() {
			voters[id] = true
		}
		index = rec.Snapshot.Index
	}
	for _, e := range rec.Entries {
		if e.Index > rec.HardState.Commit {
			break
		}
		index = e.Index
		t := raftpb.EntryType(e.Type)
		if t != raftpb.EntryConfChange && t != raftpb.EntryConfChangeV2 {
			continue
		}
		re := fromWALEntry(e)
		cc, err := decodeConfChange(re)
		if err != nil {
			return StoredConfig{}, err
		}
		// Decided against the table as it was before this entry, as
		// the apply loop decides.
		refused := make([]bool, len(cc.GetChanges()))
		for i, ch := range cc.GetChanges() {
			refused[i] = mem.refuse(ch.GetType(), ch.GetNodeId()) != ""
		}
		if err := mem.replay(re); err != nil {
			return StoredConfig{}, err
		}
		for i, ch := range cc.GetChanges() {
			id := ch.GetNodeId()
			if refused[i] || id == 0 {
				continue
			}
			switch ch.GetType() {
			case raftpb.ConfChangeType_ConfChangeAddNode:
				voters[id] = true
			case raftpb.ConfChangeType_ConfChangeRemoveNode:
				delete(voters, id)
			}
		}
	}
	if index == 0 {
		return StoredConfig{}, walErr
	}
	cfg := StoredConfig{Members: mem.sorted(), Index: index}
	for _, m := range cfg.Members {
		if voters[m.ID] {
			cfg.Voters = append(cfg.Voters, m.ID)
		}
	}
	return cfg, walErr
}

// snapshotMembership decodes the membership table framed ahead of the
// state machine in a raft snapshot's data (u32 length | JSON | state).
func snapshotMembership(snap *raftpb.Snapshot) (*membership, error) {
	data := snap.GetData()
	if len(data) < 4 {
		return nil, fmt.Errorf("snapshot at index %d: %d bytes, too short for its header", snap.GetMetadata().GetIndex(), len(data))
	}
	n := binary.BigEndian.Uint32(data)
	if uint64(n)+4 > uint64(len(data)) {
		return nil, fmt.Errorf("snapshot at index %d: membership length %d exceeds %d bytes", snap.GetMetadata().GetIndex(), n, len(data))
	}
	return unmarshalMembership(data[4 : 4+n])
}

// replay applies one committed conf change entry to the table the way
// the apply loop does (a re-added removed id changes nothing), for a
// reader that does not run raft.
func (m *membership) replay(e *raftpb.Entry) error {
	cc, err := decodeConfChange(e)
	if err != nil {
		return err
	}
	var cctx confContext
	if len(cc.GetContext()) > 0 {
		// A context that is not JSON carries no addresses; the ids
		// still count.
		_ = json.Unmarshal(cc.GetContext(), &cctx)
	}
	for _, ch := range cc.GetChanges() {
		switch ch.GetType() {
		case raftpb.ConfChangeType_ConfChangeAddNode, raftpb.ConfChangeType_ConfChangeAddLearnerNode:
			if m.Removed[ch.GetNodeId()] {
				return nil
			}
		}
	}
	for _, ch := range cc.GetChanges() {
		id := ch.GetNodeId()
		switch ch.GetType() {
		case raftpb.ConfChangeType_ConfChangeAddNode, raftpb.ConfChangeType_ConfChangeAddLearnerNode:
			mem, known := m.Members[id]
			if cctx.Member.ID == id {
				mem = cctx.Member
			} else if !known {
				mem = Member{ID: id}
			}
			m.Members[id] = mem
		case raftpb.ConfChangeType_ConfChangeRemoveNode:
			delete(m.Members, id)
			m.Removed[id] = true
		}
	}
	return nil
}
