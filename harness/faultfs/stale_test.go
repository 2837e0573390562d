package faultfs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHelperServeMount is not a test: TestReapStaleUnmountsDeadMounts runs
// the test binary with FAULTFS_HELPER_MOUNT set, so that a separate
// process serves a mount and can be killed -9 under it.
func TestHelperServeMount(t *testing.T) {
	dir := os.Getenv("FAULTFS_HELPER_MOUNT")
	if dir == "" {
		t.Skip("helper process for TestReapStaleUnmountsDeadMounts")
	}
	if _, err := Mount(dir, dir, Options{}); err != nil {
		os.Stderr.WriteString("mount: " + err.Error() + "\n")
		os.Exit(3)
	}
	os.WriteFile(filepath.Join(dir, "ready"), []byte("1"), 0o644)
	// Said outside the mount, once nothing of this process's own is in
	// flight on it (see TestMountOverADeadMount).
	os.WriteFile(os.Getenv("FAULTFS_HELPER_SERVED"), nil, 0o644)
	select {} // until killed
}

// A harness killed -9 leaves its faultfs mounts behind, dead ("transport
// endpoint is not connected"); the next run on the store must take them
// down, and must leave a live mount of another process alone: a stale
// mount from a killed run must not wedge the next run.
func TestReapStaleUnmountsDeadMounts(t *testing.T) {
	requireFUSE(t)
	root := t.TempDir()
	dead := filepath.Join(root, "run1", "n1", "data")
	if err := os.MkdirAll(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dead, "kept"), []byte("x"), 0o644)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestHelperServeMount$")
	served := filepath.Join(root, "served")
	cmd.Env = append(os.Environ(), "FAULTFS_HELPER_MOUNT="+dead, "FAULTFS_HELPER_SERVED="+served)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); killedChildExits(t, cmd.Process.Pid, dead, exited) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(served); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the helper never mounted")
		}
		time.Sleep(50 * time.Millisecond)
	}
	live, _, liveMnt := mountForTest(t, Options{})
	_ = live
	liveUnder := filepath.Join(root, "live")
	if err := os.Mkdir(liveUnder, 0o755); err != nil {
		t.Fatal(err)
	}
	fs2, err := Mount(liveUnder, liveUnder, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs2.Unmount() })

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killedChildExits(t, cmd.Process.Pid, dead, exited)
	if _, err := os.Stat(dead); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("after kill -9 of its server: expected the mount dead (ENOTCONN), found %v", err)
	}
	if err := os.RemoveAll(filepath.Join(root, "run1")); err == nil {
		t.Fatal("expected removing a run directory with a dead mount in it to fail (that is what wedged the next run)")
	}

	mounts, err := Mounts(root)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(mounts, dead) || !slices.Contains(mounts, liveUnder) || slices.Contains(mounts, liveMnt) {
		t.Fatalf("Mounts(%s): expected %s and %s (and not %s, outside root), found %v", root, dead, liveUnder, liveMnt, mounts)
	}
	// The mounts name their servers, so the dead one is known dead
	// without touching it (touching one can hang; see ReapStale).
	infos, err := mountInfos(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range infos {
		alive, known := m.ServerAlive()
		switch m.Mountpoint {
		case dead:
			if m.PID != cmd.Process.Pid || !known || alive {
				t.Errorf("dead mount: expected server pid %d known and dead, found %+v (alive %t, known %t)", cmd.Process.Pid, m, alive, known)
			}
		case liveUnder:
			if m.PID != os.Getpid() || !alive {
				t.Errorf("live mount: expected this process serving it, alive, found %+v (alive %t)", m, alive)
			}
		}
	}
	reaped, err := ReapStale(root)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reaped, []string{dead}) {
		t.Fatalf("ReapStale: expected only the dead mount %s, found %v", dead, reaped)
	}
	if b, err := os.ReadFile(filepath.Join(dead, "kept")); err != nil || string(b) != "x" {
		t.Fatalf("after reaping, the backing directory should show again: read kept = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(liveUnder, ".")); err != nil {
		t.Fatalf("the live mount must be left alone: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(root, "run1")); err != nil {
		t.Fatalf("after reaping, the run directory should be removable: %v", err)
	}
}

// Regression: go-fuse left the /dev/fuse descriptor of
// a direct mount without close-on-exec, so every node the harness started
// inherited every mount's FUSE connection; after the harness was killed
// the connections stayed open, the killed nodes could not exit, and
// anything touching a mount hung. A process started after Mount must hold
// no /dev/fuse.
func TestChildrenDoNotInheritTheFUSEConnection(t *testing.T) {
	mountForTest(t, Options{})
	out, err := exec.Command("sh", "-c", "ls -l /proc/$$/fd").CombinedOutput()
	if err != nil {
		t.Fatalf("list the child's descriptors: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "/dev/fuse") {
		t.Fatalf("a child started after Mount holds the FUSE connection:\n%s", out)
	}
}
