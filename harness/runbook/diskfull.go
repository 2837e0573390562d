package runbook

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// exitFenced is tidal-server run's exit status after a failed WAL or
// snapshot write or fsync (tidal-server run --help, "Exit status").
const exitFenced = 4

// BallastName is the file FillFollowerDisk fills the disk with, in the
// node's data directory: an old backup someone left on the data volume.
const BallastName = "tidal-old.backup"

// diskQuota is how much room the follower's disk has left when something
// else starts filling it: more than the node needs to start again (two 4
// MiB WAL segments at the suite's --wal-segment-size, and its snapshots),
// so that moving the ballast off is enough.
const diskQuota = 24 << 20

// FillFollowerDisk fills the disk under a follower's data directory. The
// follower is stopped cleanly, its data directory put on a faultfs mount
// (over itself: the data stays where it is), and the node started again
// and caught up; then the disk gets diskQuota bytes of room, and a ballast
// file (BallastName) written into the data directory takes all of it, as
// a backup written to the wrong volume would. The node's next write that
// needs room (a snapshot, a new WAL segment) fails with ENOSPC, the node
// fences itself and exits with status 4, which the scenario waits for and
// records as the exit it caused; any other exit stays a crash. The mount
// stays, with the quota, until the cluster is closed: only moving the
// ballast off makes room again.
var FillFollowerDisk = Scenario{Name: "fill-follower-disk", Inject: func(ctx context.Context, c *LocalCluster, leader string, members []string) (Injected, error) {
	s, err := followerSlot(c, leader, members)
	if err != nil {
		return Injected{}, err
	}
	name := s.Name
	if err := c.Stop(ctx, s); err != nil {
		return Injected{}, err
	}
	fs, err := faultfs.Mount(s.DataDir, s.DataDir, faultfs.Options{SkipBackingSync: true})
	if err != nil {
		return Injected{}, fmt.Errorf("runbook: faultfs over %s: %w", s.DataDir, err)
	}
	c.OnClose(fs.Unmount)
	if r := c.Exec(ctx, fmt.Sprintf("tidal_start %d\n", s.Index), time.Minute); r.Err != nil {
		return Injected{}, fmt.Errorf("runbook: restarting %s on faultfs: %v\n%s", name, r.Err, r.Output)
	}
	if err := waitReady(ctx, c, s, 2*time.Minute); err != nil {
		return Injected{}, err
	}
	if err := fs.Set(faultfs.Faults{DiskFull: &faultfs.DiskFull{FreeBytes: diskQuota}}); err != nil {
		return Injected{}, err
	}
	pid, ok := c.PID(s)
	if !ok {
		return Injected{}, fmt.Errorf("runbook: %s stopped before its disk filled", name)
	}
	appendEvent(s, "expect-exit %d %d status=%d", pid, time.Now().UnixNano(), exitFenced)
	if err := fillDisk(filepath.Join(s.DataDir, BallastName)); err != nil {
		return Injected{}, err
	}
	return Injected{Target: name}, waitExit(ctx, c, s, pid, exitFenced, 2*time.Minute)
}}

// fillDisk writes path until the disk under it has no room left (ENOSPC).
func fillDisk(path string) error {
	f, err := os.Create(path)
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return nil // already full
		}
		return err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for range 2 * diskQuota / len(buf) {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return fmt.Errorf("runbook: filling the disk with %s: %w", path, err)
		}
	}
	return fmt.Errorf("runbook: wrote %d bytes to %s without filling the disk; expected ENOSPC after %d", 2*diskQuota, path, diskQuota)
}

// waitReady waits until slot s answers /readyz.
func waitReady(ctx context.Context, c *LocalCluster, s Slot, limit time.Duration) error {
	cl := c.AdminClient(s, client.WithRetries(0), client.WithTimeout(2*time.Second))
	defer cl.CloseIdleConnections()
	var last error
	if err := waitFor(ctx, limit, func() bool {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		last = cl.Ready(rctx)
		return last == nil
	}); err != nil {
		return fmt.Errorf("runbook: %s not ready (%v): %w", s.Name, last, err)
	}
	return nil
}

// waitExit waits until process pid of slot s has exited, and checks its
// exit status.
func waitExit(ctx context.Context, c *LocalCluster, s Slot, pid, status int, limit time.Duration) error {
	var exit *NodeExit
	err := waitFor(ctx, limit, func() bool {
		exits, err := c.Exits(time.Now())
		if err != nil {
			return false
		}
		for i := range exits {
			if exits[i].Node == s.Name && exits[i].PID == pid {
				exit = &exits[i]
				return true
			}
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("runbook: %s (pid %d) still runs %s after its disk filled; expected it to fence itself and exit with status %d: %w",
			s.Name, pid, limit, status, err)
	}
	if exit.Status.Code != status {
		return fmt.Errorf("runbook: %s (pid %d) exited with %s after its disk filled; expected status %d (fenced)", s.Name, pid, exit.Status.Text, status)
	}
	return nil
}
