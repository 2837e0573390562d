package runner

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/nemesis"
)

// The harness's nodes get small WAL segments (each node
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

// --faultfs: auto mounts exactly when a disk kind is
// scheduled; off refuses a disk kind; on, and auto with a disk kind,
// refuse a machine without FUSE, naming why.
func TestMountFaultFS(t *testing.T) {
	saved := nemesis.DiskSupport
	t.Cleanup(func() { nemesis.DiskSupport = saved })
	nemesis.DiskSupport = func() error { return nil }
	cases := []struct {
		mode  string
		kinds []string
		want  bool
		err   string
	}{
		{FaultFSAuto, []string{"partition-halves"}, false, ""},
		{FaultFSAuto, []string{"partition-halves", "power-cut-all"}, true, ""},
		{FaultFSOn, []string{"kill-one"}, true, ""},
		{FaultFSOff, []string{"kill-one"}, false, ""},
		{FaultFSOff, []string{"fsync-error"}, false, "--faultfs off, but the schedule has disk faults"},
	}
	for _, c := range cases {
		got, err := Config{FaultFS: c.mode}.mountFaultFS(c.kinds)
		if got != c.want || (err == nil) != (c.err == "") || err != nil && !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s %v: expected %t, %q; found %t, %v", c.mode, c.kinds, c.want, c.err, got, err)
		}
	}
	nemesis.DiskSupport = func() error { return errors.New("/dev/fuse not found") }
	if _, err := (Config{FaultFS: FaultFSOn}).mountFaultFS(nil); err == nil || !strings.Contains(err.Error(), "/dev/fuse not found") {
		t.Errorf("--faultfs on without FUSE: expected a refusal naming /dev/fuse, found %v", err)
	}
	if _, err := (Config{FaultFS: FaultFSAuto}).mountFaultFS([]string{"power-cut-all"}); err == nil || !strings.Contains(err.Error(), "/dev/fuse not found") {
		t.Errorf("a disk kind without FUSE: expected a refusal naming /dev/fuse, found %v", err)
	}
	cfg := Config{Nodes: 3, Nemesis: []string{"power-cut-all"}}
	if _, err := cfg.ParseNemesis(); err == nil || !strings.Contains(err.Error(), "power-cut-all needs faultfs: /dev/fuse not found") {
		t.Errorf("ParseNemesis without FUSE: expected power-cut-all refused, found %v", err)
	}
	nemesis.DiskSupport = func() error { return nil }
	// Disk faults run on docker too: faultfs is mounted on the host
	// under each container's bind-mounted node directory, so the docker
	// backend takes the disk kinds as the process backend does.
	cfg.Backend = BackendDocker
	if _, err := cfg.ParseNemesis(); err != nil {
		t.Errorf("docker backend: expected disk kinds accepted, found %v", err)
	}
	if on, err := (Config{Backend: BackendDocker}).mountFaultFS([]string{"power-cut-one"}); !on || err != nil {
		t.Errorf("docker backend, power-cut-one: expected faultfs mounted, found %t, %v", on, err)
	}
	if _, err := ParseFaultFS("maybe"); err == nil {
		t.Error("expected --faultfs maybe refused")
	}
}
