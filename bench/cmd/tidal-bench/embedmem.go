package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tidaldb/tidal/tidal-server/client"
)

// nodeMemory is one member's memory once the load is in: its own figures
// (GET /cluster/status, "memory") and its peak RSS (VmHWM) over the run.
type nodeMemory struct {
	Node              int     `json:"node"`
	RSS               int64   `json:"rss_bytes"`
	PeakRSS           int64   `json:"peak_rss_bytes"`
	GoHeap            int64   `json:"go_heap_bytes"`
	VectorBytes       int64   `json:"vector_bytes"`
	IndexOverhead     int64   `json:"index_overhead_bytes"`
	SnapshotBytesHeld int64   `json:"snapshot_bytes_held"`
	RSSOverVectors    float64 `json:"rss_over_vectors"`
	PeakOverVectors   float64 `json:"peak_rss_over_vectors"`
	HeapProfile       string  `json:"heap_profile,omitempty"` // file name in the working directory
	// After a forced collection (the heap profile's ?gc=1): the live heap,
	// and RSS then (pages the runtime has not yet returned stay resident).
	LiveHeapAfterGC int64 `json:"live_heap_after_gc_bytes,omitempty"`
	RSSAfterGC      int64 `json:"rss_after_gc_bytes,omitempty"`
}

// collectMemory waits until every member has applied what the leader
// committed and none is encoding a snapshot (so the figures are the
// steady state, not an encoding's transient; the peak shows that), then
// reads each member's memory and, when the nodes serve /debug/pprof
// (--enable-pprof in -embed-flags), saves its heap profile to dir.
func collectMemory(ctx context.Context, c *cluster, dir string) ([]nodeMemory, error) {
	deadline := time.Now().Add(2 * time.Minute)
	var sts []*client.Status
	for {
		sts = sts[:0]
		var commit, minApplied uint64 = 0, ^uint64(0)
		encoding := false
		for _, addr := range c.clients {
			cl := client.New(addr, client.WithRetries(0), client.WithTimeout(10*time.Second))
			st, err := cl.Status(ctx)
			cl.CloseIdleConnections()
			if err != nil {
				return nil, err
			}
			if st.Memory == nil {
				return nil, fmt.Errorf("node at %s reports no memory in /cluster/status (an older tidal-server?)", addr)
			}
			sts = append(sts, st)
			commit, minApplied = max(commit, st.Commit), min(minApplied, st.Applied)
			encoding = encoding || st.Memory.SnapshotEncoding > 0
		}
		if minApplied >= commit && !encoding {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("members not settled after 2 minutes: applied %d of commit %d, encoding a snapshot %v", minApplied, commit, encoding)
		}
		time.Sleep(time.Second)
	}
	out := make([]nodeMemory, len(sts))
	for i, st := range sts {
		m := st.Memory
		nm := nodeMemory{Node: int(st.Node), RSS: m.RSS, GoHeap: m.GoHeap, VectorBytes: m.VectorBytes,
			IndexOverhead: m.IndexOverhead, SnapshotBytesHeld: m.SnapshotBytesHeld}
		nm.PeakRSS, _ = peakRSS(c.nodes[i].PID())
		if m.VectorBytes > 0 {
			nm.RSSOverVectors = float64(m.RSS) / float64(m.VectorBytes)
			nm.PeakOverVectors = float64(nm.PeakRSS) / float64(m.VectorBytes)
		}
		name := fmt.Sprintf("heap-node%d.pprof", i+1)
		if err := fetchHeapProfile(ctx, c.clients[i], filepath.Join(dir, name)); err == nil {
			nm.HeapProfile = name
			cl := client.New(c.clients[i], client.WithRetries(0), client.WithTimeout(10*time.Second))
			if after, err := cl.Status(ctx); err == nil && after.Memory != nil {
				nm.LiveHeapAfterGC, nm.RSSAfterGC = after.Memory.GoHeap, after.Memory.RSS
			}
			cl.CloseIdleConnections()
		}
		out[i] = nm
	}
	return out, nil
}

// peakRSS is VmHWM of process pid: the most it was ever resident.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM line", pid)
}

// fetchHeapProfile saves addr's /debug/pprof/heap, taken after a forced
// collection (?gc=1: the live heap now, not as of the last cycle, which
// may have run in the middle of a snapshot's encoding), to file; an error
// when the node does not serve pprof.
func fetchHeapProfile(ctx context.Context, addr, file string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/heap?gc=1", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/heap: %s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func memorySummary(b *strings.Builder, ms []nodeMemory) {
	if len(ms) == 0 {
		return
	}
	mb := func(n int64) string { return fmt.Sprintf("%.0f", float64(n)/(1<<20)) }
	fmt.Fprintf(b, "\nMemory per node once every member applied the load and no snapshot was being encoded (MiB; /cluster/status \"memory\"; peak = VmHWM over the run):\n\n")
	fmt.Fprintf(b, "| node | raw vectors | RSS | RSS ÷ vectors | peak RSS | peak ÷ vectors | Go heap | index overhead | snapshot bytes held | live heap after a forced GC | RSS then |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, m := range ms {
		live, rssGC := "-", "-"
		if m.HeapProfile != "" {
			live, rssGC = mb(m.LiveHeapAfterGC), mb(m.RSSAfterGC)
		}
		fmt.Fprintf(b, "| %d | %s | %s | %.2f | %s | %.2f | %s | %s | %s | %s | %s |\n", m.Node, mb(m.VectorBytes), mb(m.RSS), m.RSSOverVectors,
			mb(m.PeakRSS), m.PeakOverVectors, mb(m.GoHeap), mb(m.IndexOverhead), mb(m.SnapshotBytesHeld), live, rssGC)
	}
}
