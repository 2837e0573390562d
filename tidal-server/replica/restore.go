package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// RestoreDataDir creates dir as the data dir of a new single-node cluster
// whose only member is m and whose state machine starts from state (a
// StateMachine.Snapshot taken at applied index). Like etcd's snapshot
// restore, the result shares no raft identity with the cluster the backup
// came from: grow it with /admin/members.
func RestoreDataDir(dir string, m Member, index uint64, state []byte) error {
	if entries, err := os.ReadDir(filepath.Join(dir, "wal")); err == nil && len(entries) > 0 {
		return fmt.Errorf("%s already holds a WAL; restore into an empty data dir", dir)
	}
	if index == 0 {
		// Index 0 means "no snapshot" to raft.
		index = 1
	}
	mem := newMembership()
	mem.Members[m.ID] = m
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
	snaps, err := newSnapStore(filepath.Join(dir, "snap"))
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
