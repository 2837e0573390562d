package replica

// SnapshotMemory is the snapshot bytes a replica holds in memory.
type SnapshotMemory struct {
	// Raft is the capacity of the data of the snapshot raft's storage
	// holds: the newest one taken or received, kept whole for sending to
	// a follower that needs it, until the next replaces it. Capacity, not
	// length: a snapshot taken here is the encoder's buffer, which
	// bytes.Buffer may have grown to twice what it holds.
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
	return SnapshotMemory{Raft: r.snapHeld.Load(), Encoding: r.snapEncoding.Load()}
}
