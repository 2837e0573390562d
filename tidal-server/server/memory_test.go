package server

import (
	"context"
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/client"
)

// TestMemoryGaugesFollowTheStore: on a running node the memory gauges and
// /cluster/status's memory move with the store: new entities raise
// tidal_vectors_bytes by their raw size, an overwrite leaves it as it
// was, and a snapshot makes raft's held snapshot bytes at least the
// vectors' size.
func TestMemoryGaugesFollowTheStore(t *testing.T) {
	srv, _ := startNode(t, Config{OpenProbes: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := client.New(srv.ClientAddr(), client.WithBinaryVectors())
	defer cl.CloseIdleConnections()
	for {
		if err := cl.Ready(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("node never became ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	dim := srv.node.schema.EmbeddingDim
	vec := func(seed int) []float32 {
		v := make([]float32, dim)
		for i := range v {
			v[i] = float32(seed + i%3 + 1)
		}
		return v
	}
	gauge := func(sample string) float64 {
		t.Helper()
		body, err := cl.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(body)
		if m == nil {
			t.Fatalf("%s not in /metrics", sample)
		}
		f, _ := strconv.ParseFloat(string(m[1]), 64)
		return f
	}
	if got := gauge("tidal_vectors_bytes"); got != 0 {
		t.Fatalf("empty store: tidal_vectors_bytes = %v, want 0", got)
	}
	for e := 1; e <= 3; e++ {
		if _, err := cl.PutEmbedding(ctx, uint64(e), fmt.Sprintf("p%d", e), vec(e)); err != nil {
			t.Fatal(err)
		}
	}
	raw := float64(3 * dim * 4)
	if got := gauge("tidal_vectors_bytes"); got != raw {
		t.Fatalf("3 vectors: tidal_vectors_bytes = %v, want %v", got, raw)
	}
	overhead := gauge("tidal_vectors_index_overhead_bytes")
	if overhead <= 0 {
		t.Fatalf("3 vectors in a 4 MiB chunk: tidal_vectors_index_overhead_bytes = %v, want > 0", overhead)
	}
	if _, err := cl.PutEmbedding(ctx, 2, "p2-again", vec(9)); err != nil {
		t.Fatal(err)
	}
	if got := gauge("tidal_vectors_bytes"); got != raw {
		t.Fatalf("after an overwrite: tidal_vectors_bytes = %v, want %v (unchanged)", got, raw)
	}
	if _, _, err := cl.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if got := gauge(`tidal_snapshot_bytes_held{where="raft"}`); got < raw {
		t.Fatalf("after a snapshot: raft's snapshot bytes held = %v, want at least the vectors' %v", got, raw)
	}
	t.Run("Regression: reading snapshot memory copies the snapshot", func(t *testing.T) {
		// raft's MemoryStorage.Snapshot clones the snapshot, data and all:
		// a reading through it allocated the whole snapshot every scrape,
		// status and memory-bound reading.
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range 10 {
			srv.replica.SnapshotMemory()
		}
		runtime.ReadMemStats(&after)
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<10 {
			t.Fatalf("10 readings of the snapshot memory allocated %d bytes; expected none (the snapshot is %v bytes)", grew, raw)
		}
	})
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m := st.Memory
	if m == nil || m.VectorBytes != int64(raw) || m.RSS <= 0 || m.GoHeap <= 0 || m.SnapshotBytesHeld < int64(raw) || m.MaxMemory != 0 {
		t.Fatalf("/cluster/status memory: expected %v vector bytes, RSS and Go heap > 0, snapshot bytes >= vectors, no bound; found %+v", raw, m)
	}
}
