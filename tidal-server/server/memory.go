package server

import (
	"bytes"
	"fmt"
	"os"
	"runtime/metrics"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// VectorMemory reports what the embedding store holds now (vectors.Memory).
func (s *StateMachine) VectorMemory() vectors.Memory {
	s.mu.RLock()
	v := s.vectors // replaced whole by Restore
	s.mu.RUnlock()
	return v.Memory()
}

// snapshotBufferer is a transport that holds snapshot bytes of its own
// (peer.Transport).
type snapshotBufferer interface {
	SnapshotBuffers() (inbound, outbound int64)
}

// memorySources are what a node's memory figures are read from.
type memorySources struct {
	sm        *StateMachine
	r         *replica.Replica
	transport snapshotBufferer // nil: a one-node process without peers
	rss       func() (int64, error)
}

// Memory implements api.MemoryReporter.
func (n *node) Memory() api.Memory {
	return n.mem.read()
}

func (ms *memorySources) read() api.Memory {
	vm := ms.sm.VectorMemory()
	sn := ms.r.SnapshotMemory()
	m := api.Memory{VectorBytes: vm.Vectors, IndexOverhead: vm.Overhead,
		SnapshotBytesHeld: sn.Total(), SnapshotEncoding: sn.Encoding, GoHeap: goHeapBytes()}
	if ms.transport != nil {
		in, out := ms.transport.SnapshotBuffers()
		m.SnapshotBytesHeld += in + out
	}
	rss, err := ms.rss()
	if err != nil {
		// No /proc (not Linux): what the Go runtime has mapped and not
		// returned, an upper bound of its share of RSS.
		rss = goMappedBytes()
	}
	m.RSS = rss
	return m
}

// readRSS is the process's resident set size from /proc/self/statm
// (its second field, in pages).
func readRSS() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/self/statm: expected at least 2 fields, found %q", b)
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/self/statm: resident pages: %w", err)
	}
	return pages * int64(os.Getpagesize()), nil
}

func readRuntime(names ...string) []metrics.Sample {
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	return s
}

// goHeapBytes is the Go heap held by objects, live or not yet swept.
func goHeapBytes() int64 {
	return int64(readRuntime("/memory/classes/heap/objects:bytes")[0].Value.Uint64())
}

// goMappedBytes is what the Go runtime has mapped, less what it returned
// to the OS.
func goMappedBytes() int64 {
	s := readRuntime("/memory/classes/total:bytes", "/memory/classes/heap/released:bytes")
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}

// registerMemoryMetrics exports the memory figures (docs/ARCHITECTURE.md,
// "Memory"). Each is read at scrape time. RSS itself is the process
// collector's process_resident_memory_bytes.
func registerMemoryMetrics(reg *prometheus.Registry, ms *memorySources, maxMemory int64) {
	const snapHelp = "Snapshot bytes held in memory, by where: raft (the snapshot raft's storage keeps), encoding (one being encoded), " +
		"inbound (received from a peer, not yet taken by raft), outbound (raft's copy for a snapshot being streamed to a peer)."
	gauge := func(name, help string, labels prometheus.Labels, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f)
	}
	reg.MustRegister(
		gauge("tidal_vectors_bytes", "Raw embedding bytes held: entities x dimension x 4.", nil,
			func() float64 { return float64(ms.sm.VectorMemory().Vectors) }),
		gauge("tidal_vectors_index_overhead_bytes", "What the vector store holds beyond the raw vectors: chunk slack, slot arrays and map, undo records of pinned views, chunks frozen for a snapshot.", nil,
			func() float64 { return float64(ms.sm.VectorMemory().Overhead) }),
		gauge("tidal_snapshot_bytes_held", snapHelp,
			prometheus.Labels{"where": "raft"}, func() float64 { return float64(ms.r.SnapshotMemory().Raft) }),
		gauge("tidal_snapshot_bytes_held", snapHelp,
			prometheus.Labels{"where": "encoding"}, func() float64 { return float64(ms.r.SnapshotMemory().Encoding) }),
		gauge("tidal_memory_limit_bytes", "--max-memory: embedding writes that would pass it are refused (0: no bound).", nil,
			func() float64 { return float64(maxMemory) }),
	)
	if ms.transport != nil {
		reg.MustRegister(
			gauge("tidal_snapshot_bytes_held", snapHelp,
				prometheus.Labels{"where": "inbound"}, func() float64 { in, _ := ms.transport.SnapshotBuffers(); return float64(in) }),
			gauge("tidal_snapshot_bytes_held", snapHelp,
				prometheus.Labels{"where": "outbound"}, func() float64 { _, out := ms.transport.SnapshotBuffers(); return float64(out) }),
		)
	}
}
