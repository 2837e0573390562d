package runner

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/harness/cluster"
)

// Issue 9 item 19: the harness's nodes get small WAL segments (each node
// preallocated 64 MiB ones, ~230 MB a run), and the size is recorded in
// the run's config.json so a repro uses the same.
func TestConfigRecordsWALSegmentSize(t *testing.T) {
	cfg := Config{ServerBin: "bin/tidal-server"}
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.WALSegmentSize != cluster.DefaultWALSegmentSize || cluster.DefaultWALSegmentSize != 4<<20 {
		t.Errorf("expected a 4 MiB default segment size, found %d (cluster default %d)", cfg.WALSegmentSize, cluster.DefaultWALSegmentSize)
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"wal_segment_size":4194304`) {
		t.Errorf("expected config.json to record wal_segment_size, found %s", data)
	}
	var back Config
	if err := json.Unmarshal(data, &back); err != nil || back.WALSegmentSize != 4<<20 {
		t.Errorf("expected the size to read back for a repro, found %d, %v", back.WALSegmentSize, err)
	}
}
