package api

import (
	"fmt"
	"sync"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// Memory is a node's memory as /cluster/status reports it and the memory
// bound (Options.MaxMemory) judges it. Every figure is measured when
// asked: RSS from the kernel, the rest from what the store and the
// replica hold (vectors.Memory, replica.SnapshotMemory).
type Memory struct {
	RSS    int64 `json:"rss_bytes"`     // resident set size of the process
	GoHeap int64 `json:"go_heap_bytes"` // live and not yet swept Go heap objects
	// VectorBytes is the raw embedding payload (entities × dim × 4).
	VectorBytes int64 `json:"vector_bytes"`
	// IndexOverhead is what the vector store holds beyond VectorBytes.
	IndexOverhead int64 `json:"index_overhead_bytes"`
	// SnapshotBytesHeld is the snapshot bytes in memory: raft storage's
	// snapshot, an encoding in progress, inbound snapshots not yet taken
	// by raft, and raft's copies of its snapshot being sent to peers.
	SnapshotBytesHeld int64 `json:"snapshot_bytes_held"`
	// SnapshotEncoding is the part of SnapshotBytesHeld that is a
	// snapshot being encoded now.
	SnapshotEncoding int64 `json:"snapshot_encoding_bytes"`
	MaxMemory        int64 `json:"max_memory_bytes"` // --max-memory; 0 = no bound
}

// MemoryReporter is a Backend that can say what memory it holds; without
// it /cluster/status carries no memory figures and Options.MaxMemory has
// nothing to judge (New refuses the combination).
type MemoryReporter interface {
	Memory() Memory
}

// memoryReadEvery is how long one reading of the node's memory serves
// the memory bound: reading costs a file read and a pass over the store's
// chunk headers, too much for every write at tens of thousands a second.
// Between readings the bytes admitted are added to the last reading, so a
// burst cannot slip past the bound in the gap.
const memoryReadEvery = 100 * time.Millisecond

// memoryRetryAfter is the Retry-After of a write refused by the memory
// bound, in seconds: memory is given back by the next snapshot replacing
// the last one and a garbage collection, seconds rather than milliseconds.
const memoryRetryAfter = 5

// snapshotCopies is how many copies of the vectors a snapshot adds while
// it is taken, measured (docs/performance.md, "Memory"): the encoder's
// buffer, which bytes.Buffer may grow past the state it holds (1.15× at
// 50,000 vectors), and the clone of it raft's MemoryStorage.CreateSnapshot
// returns; the previous snapshot is dropped only once both exist. With one
// copy, the multiproc spec's node passed a 192 MiB bound by 26 MiB during
// a snapshot.
const snapshotCopies = 2

// memoryGate refuses embedding writes that would take the node past its
// memory bound. An embedding write is admitted when
//
//	RSS + bytes admitted since the reading + this write + next snapshot ≤ limit
//
// where "next snapshot" is what taking one adds while it is taken:
// snapshotCopies × VectorBytes, less what an encoding in progress already
// holds. A snapshot is taken every --snapshot-every entries whatever the
// load, so a node admitted up to the limit without it would pass the
// limit at its next snapshot.
type memoryGate struct {
	limit int64
	read  func() Memory
	now   func() time.Time

	mu    sync.Mutex
	last  Memory
	at    time.Time // when last was read; zero: never
	since int64     // bytes admitted since last was read
}

// errMemory is the 503 for an embedding write the memory bound refuses.
type errMemory struct {
	m        Memory
	pending  int64 // admitted since the reading, and this write
	headroom int64 // the next snapshot's copies of the vectors
	limit    int64
}

func (e *errMemory) Error() string {
	return fmt.Sprintf("embedding writes refused: this node's memory (RSS %s, of it %s of vectors and %s of index overhead, %s of snapshots held) "+
		"plus %s pending and %s for the next snapshot's copies of the vectors would pass --max-memory %s; signals and reads are still served",
		FormatBytes(e.m.RSS), FormatBytes(e.m.VectorBytes), FormatBytes(e.m.IndexOverhead), FormatBytes(e.m.SnapshotBytesHeld),
		FormatBytes(e.pending), FormatBytes(e.headroom), FormatBytes(e.limit))
}

// admit charges cost bytes, or says why the write would pass the bound.
func (g *memoryGate) admit(cost int64) error {
	if g == nil || g.limit <= 0 {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	if g.at.IsZero() || now.Sub(g.at) >= memoryReadEvery {
		g.last, g.at, g.since = g.read(), now, 0
	}
	headroom := max(0, snapshotCopies*g.last.VectorBytes-g.last.SnapshotEncoding)
	if g.last.RSS+g.since+cost+headroom > g.limit {
		return &errMemory{m: g.last, pending: g.since + cost, headroom: headroom, limit: g.limit}
	}
	g.since += cost
	return nil
}

// statusWithMemory is GET /cluster/status: the replica's view and, when
// the backend reports it, the node's memory.
type statusWithMemory struct {
	replica.Status
	Memory *Memory `json:"memory,omitempty"`
}

// memory is the node's memory now, nil when the backend cannot say.
func (h *handler) memory() *Memory {
	mr, ok := h.b.(MemoryReporter)
	if h.opts.memory == nil && !ok {
		return nil
	}
	var m Memory
	if h.opts.memory != nil {
		m = h.opts.memory()
	} else {
		m = mr.Memory()
	}
	m.MaxMemory = h.opts.MaxMemory
	return &m
}

// FormatBytes writes n in binary units with three significant figures
// ("1.21 GiB"), the way --max-memory reads them.
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), -1
	for f >= unit || f <= -unit {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.3g %ciB", f, "KMGTPE"[i])
}
