package replica

// SnapshotMemory is the snapshot bytes a replica holds in memory.
type SnapshotMemory struct {
	// Raft is the data of the snapshot raft's storage holds: the newest
	// one taken or received, kept whole for sending to a follower that
	// needs it. It stays allocated until the next snapshot replaces it.
	Raft int64
	// Encoding is the capacity of the buffer a snapshot is being encoded
	// into, updated as it grows; 0 between snapshots (once persisted the
	// bytes are raft storage's and count under Raft).
	Encoding int64
}

// Total is Raft + Encoding.
func (m SnapshotMemory) Total() int64 { return m.Raft + m.Encoding }

// SnapshotMemory reports the snapshot bytes this replica holds now.
func (r *Replica) SnapshotMemory() SnapshotMemory {
	var m SnapshotMemory
	if snap, err := r.storage.Snapshot(); err == nil {
		m.Raft = int64(cap(snap.GetData()))
	}
	m.Encoding = r.snapEncoding.Load()
	return m
}
