package cluster_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/faultfs"
)

func requireFUSE(t *testing.T) {
	t.Helper()
	if err := faultfs.Available(); err != nil {
		t.Skip("disk faults need faultfs: " + err.Error())
	}
}

func dataDirs(dir string, names ...string) []string {
	var out []string
	for _, n := range names {
		out = append(out, filepath.Join(dir, n, "data"))
	}
	return out
}

// With DiskFaults every slot's data dir is a faultfs
// mount; a power cut kills the node and loses what was never fsynced;
// Close unmounts every mount and leaves each one's counters.
func TestDiskFaultsMountPowerCutAndUnmount(t *testing.T) {
	requireFUSE(t)
	be := newStealing(t, 0)
	dir := t.TempDir()
	c, err := cluster.New(cluster.Config{Nodes: 3, Spares: 1, Backend: be, Dir: dir, StatsInterval: -1, DiskFaults: true})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			c.Close()
		}
	})
	mounts, err := faultfs.Mounts(dir)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(mounts)
	if want := dataDirs(dir, "n1", "n2", "n3", "n4"); !slices.Equal(mounts, want) {
		t.Fatalf("mounts: expected every slot's data dir %v, found %v", want, mounts)
	}
	data := filepath.Join(dir, "n1", "data")
	durable := filepath.Join(data, "durable")
	f, err := os.Create(durable)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("kept")
	f.Sync()
	f.Close()
	d, _ := os.Open(data)
	d.Sync()
	d.Close()
	if err := os.WriteFile(filepath.Join(data, "unsynced"), []byte("lost"), 0o644); err != nil {
		t.Fatal(err)
	}

	reps, err := c.PowerCut([]string{"n1"}, faultfs.PowerCutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st := c.State("n1"); st != cluster.Killed || !c.Exited("n1") {
		t.Fatalf("n1 after the power cut: expected killed, found %s (exited %t)", st, c.Exited("n1"))
	}
	if reps["n1"].EntriesRolledBack != 1 {
		t.Errorf("report: expected the unsynced entry rolled back, found %+v", reps["n1"])
	}
	if _, err := os.Stat(filepath.Join(data, "unsynced")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the never-synced file survived the power cut: %v", err)
	}
	if b, err := os.ReadFile(durable); err != nil || string(b) != "kept" {
		t.Errorf("the synced file: expected \"kept\", found %q, %v", b, err)
	}
	if err := c.Start("n1"); err != nil {
		t.Fatal(err)
	}

	// A node that exits on its own (as a fenced one does) reads Running
	// until Revive starts it again.
	syscall.Kill(-nodePID(t, c, "n2"), syscall.SIGKILL)
	deadline := time.Now().Add(30 * time.Second)
	for !c.Exited("n2") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if revived, err := c.Revive("n2"); !revived || err != nil || c.State("n2") != cluster.Running || c.Exited("n2") {
		t.Fatalf("Revive n2: expected it started again, found %t, %v (state %s)", revived, err, c.State("n2"))
	}
	if revived, err := c.Revive("n3"); revived || err != nil {
		t.Fatalf("Revive of a running node: expected nothing done, found %t, %v", revived, err)
	}

	// A wipe through the mount is durable: no later power cut brings the
	// old member's data back under a new one.
	n3 := filepath.Join(dir, "n3", "data")
	os.WriteFile(filepath.Join(n3, "old-member"), []byte("x"), 0o644)
	if err := c.Kill("n3"); err != nil {
		t.Fatal(err)
	}
	if err := c.Wipe("n3"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PowerCut([]string{"n3"}, faultfs.PowerCutOptions{}); err != nil {
		t.Fatal(err)
	}
	if left, err := os.ReadDir(n3); err != nil || len(left) != 0 {
		t.Fatalf("n3 wiped, then a power cut: expected an empty data dir, found %v (%v)", left, err)
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if mounts, _ := faultfs.Mounts(dir); len(mounts) != 0 {
		t.Fatalf("after Close: expected no mount left, found %v", mounts)
	}
	if b, err := os.ReadFile(durable); err != nil || string(b) != "kept" {
		t.Errorf("after Close the data dir holds the node's files: read %q, %v", b, err)
	}
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		if _, err := os.Stat(filepath.Join(dir, n, "faultfs.json")); err != nil {
			t.Errorf("%s: expected its faultfs counters: %v", n, err)
		}
	}
}

func nodePID(t *testing.T, c *cluster.Cluster, name string) int {
	t.Helper()
	pid, ok := c.PID(name)
	if !ok {
		t.Fatalf("%s has no process", name)
	}
	return pid
}

// A start that fails leaves no mount behind (cleanup
// after a failed start).
func TestDiskFaultsUnmountAfterAFailedStart(t *testing.T) {
	requireFUSE(t)
	be := newStealing(t, 0)
	t.Setenv(failEnv, "could not start")
	dir := t.TempDir()
	if _, err := cluster.New(cluster.Config{Nodes: 3, Backend: be, Dir: dir, StatsInterval: -1, DiskFaults: true}); err == nil {
		t.Fatal("expected New to fail")
	}
	if mounts, _ := faultfs.Mounts(dir); len(mounts) != 0 {
		t.Fatalf("after a failed start: expected no mount left, found %v", mounts)
	}
}
