package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/tidaldb/tidal/harness/faultfs"
)

// Disk faults. With Config.DiskFaults every slot's data dir
// (nodes/<name>/data) is a faultfs mount over itself: the directory is
// its own backing (faultfs reaches it through a descriptor opened before
// mounting), so after the run, unmounted, it holds the node's files as
// usual and `tidal-server wal verify --data-dir` works on it. The mounts
// live in this process; teardown unmounts every one, after a failed start
// too, and writes each mount's counters to nodes/<name>/faultfs.json. A
// harness killed -9 leaves them behind dead; faultfs.ReapStale, which the
// runner calls once it holds the store, takes them down.

// diskDataDir is a slot's data dir: the mountpoint and its own backing.
func diskDataDir(n *Node) string { return filepath.Join(n.Dir, "data") }

// mountDisks mounts faultfs over every slot's data dir (spares too: a
// slot added back as a new member runs on the same mount).
func (c *Cluster) mountDisks() error {
	if !c.cfg.DiskFaults {
		return nil
	}
	opts, err := diskMountOptions(c.cfg.Backend.Name())
	if err != nil {
		return err
	}
	if err := faultfs.Available(); err != nil {
		return fmt.Errorf("cluster: disk faults need faultfs: %w", err)
	}
	c.disks = map[string]*faultfs.FS{}
	for _, n := range c.nodes {
		dir := diskDataDir(n)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		fs, err := faultfs.Mount(dir, dir, opts)
		if err != nil {
			return fmt.Errorf("cluster: %s: %w", n.Name, err)
		}
		c.disks[n.Name] = fs
		c.log.Info("faultfs mounted", "node", n.Name, "dir", dir)
	}
	return nil
}

// diskMountOptions is how faultfs is mounted for a backend's nodes. A
// process runs as the harness's user, which alone may use a FUSE mount by
// default. A container (package container) sees the mount through the
// bind mount of its node directory — a recursive bind, made when the
// container is created, so the mount must exist by then, as it does:
// every slot is mounted before any node starts, and a power cut's fresh
// mount is in place before the node's new container is created. Its
// process runs as the harness's user, except under a root harness, where
// it runs as the image's uid 65532: then the mount allows other users,
// with the kernel checking permissions against the owners faultfs gives
// new files (their creator's). (A non-root harness could not set
// allow_other without user_allow_other in /etc/fuse.conf, and needs not.)
func diskMountOptions(backend string) (faultfs.Options, error) {
	switch backend {
	case "process":
		return faultfs.Options{}, nil
	case "docker":
		return faultfs.Options{AllowOther: os.Geteuid() == 0}, nil
	}
	return faultfs.Options{}, fmt.Errorf("cluster: disk faults: expected the process or docker backend (faultfs mounts the nodes' data dirs on this machine), found %s", backend)
}

// unmountDisks writes each mount's counters beside its node and unmounts
// it. The nodes must be dead already: a process still holding a file
// would get EIO.
func (c *Cluster) unmountDisks() error {
	c.mu.Lock()
	disks := c.disks
	c.disks = nil
	c.mu.Unlock()
	var errs []error
	for name, fs := range disks {
		if b, err := json.MarshalIndent(fs.Stats(), "", "  "); err == nil {
			os.WriteFile(filepath.Join(filepath.Dir(fs.Mountpoint()), "faultfs.json"), append(b, '\n'), 0o644)
		}
		if err := fs.Unmount(); err != nil {
			errs = append(errs, fmt.Errorf("cluster: %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// HasDisks reports whether the nodes' data dirs are faultfs mounts.
func (c *Cluster) HasDisks() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.disks != nil
}

// Disk returns the faultfs mount under name's data dir.
func (c *Cluster) Disk(name string) (*faultfs.FS, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.node(name); err != nil {
		return nil, err
	}
	if c.disks == nil {
		return nil, fmt.Errorf("cluster: %s: expected a faultfs mount on its data dir, found none (the cluster was started without DiskFaults)", name)
	}
	return c.disks[name], nil
}

// PowerCut cuts the power of the named nodes at once: every one that runs
// is frozen (SIGSTOP) first, all before any disk is touched; then every
// disk at once loses what was never made durable (faultfs.FS.PowerCut)
// and is mounted afresh, as found at boot; then the frozen processes are
// killed -9. The nodes are left Killed: Start brings each back on its
// surviving data.
// TornWrites tears each disk with its own seed (o.Seed plus the node's
// position in names). The reports are by node; on error some disks may
// not have been cut.
func (c *Cluster) PowerCut(names []string, o faultfs.PowerCutOptions) (map[string]faultfs.PowerCutReport, error) {
	disks := make([]*faultfs.FS, len(names))
	for i, name := range names {
		d, err := c.Disk(name)
		if err != nil {
			return nil, err
		}
		disks[i] = d
	}
	// A power cut stops the CPUs and the disks at the same instant. So
	// every target is frozen first, then every disk is cut at once, and
	// only then are the processes killed. Killing first would not do: a
	// process killed while its fsync is inside the FUSE server dies only
	// once that fsync is answered, so every fsync issued before the "cut"
	// would complete and be durable — and a WAL that acknowledges before
	// its fsync returns (planted ack-before-fsync) would never lose a
	// write. A frozen process's fsync may still be answered, but the
	// process never runs again to act on it.
	var errs []error
	for _, name := range names {
		if c.State(name) == Running {
			if err := c.Pause(name); err != nil {
				errs = append(errs, fmt.Errorf("freeze %s: %w", name, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("cluster: power cut: %w", err)
	}
	reps := make([]faultfs.PowerCutReport, len(names))
	cutErrs := make([]error, len(names))
	var wg sync.WaitGroup
	for i := range names {
		wg.Go(func() {
			oi := o
			if oi.TornWrites && oi.Seed != 0 {
				oi.Seed += int64(i)
			}
			reps[i], cutErrs[i] = disks[i].PowerCut(oi)
		})
	}
	wg.Wait()
	for _, name := range names {
		if st := c.State(name); st == Running || st == Paused {
			if err := c.Kill(name); err != nil {
				errs = append(errs, fmt.Errorf("kill %s: %w", name, err))
			}
		}
	}
	reports := map[string]faultfs.PowerCutReport{}
	for i, name := range names {
		if cutErrs[i] != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, cutErrs[i]))
			continue
		}
		rep := reps[i]
		reports[name] = rep
		c.log.Info("power cut", "node", name, "files", rep.Files, "bytes_discarded", rep.BytesDiscarded,
			"entries_rolled_back", rep.EntriesRolledBack, "torn", rep.Torn)
	}
	if err := errors.Join(errs...); err != nil {
		return reports, fmt.Errorf("cluster: power cut: %w", err)
	}
	return reports, nil
}

// Exited reports whether name's latest process has exited, whatever the
// harness last did to it: a node that fenced itself on a failed fsync
// still reads Running in State.
func (c *Cluster) Exited(name string) bool {
	c.mu.Lock()
	n, err := c.node(name)
	var h Handle
	if err == nil {
		h = n.handle
	}
	c.mu.Unlock()
	if h == nil {
		return true
	}
	select {
	case <-h.Exited():
		return true
	default:
		return false
	}
}

// PID is the process id of name's latest process, if it was started.
func (c *Cluster) PID(name string) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(name)
	if err != nil || n.handle == nil {
		return 0, false
	}
	return n.handle.PID(), true
}

// Revive starts name again if its process exited on its own while the
// harness believed it running (a node that fenced itself, or one that
// refused to open a corrupt log): what a disk fault's heal does once the
// disk is good again. A node the harness stopped, killed or removed is
// left to whoever did that.
func (c *Cluster) Revive(name string) (bool, error) {
	c.mu.Lock()
	n, err := c.node(name)
	if err != nil {
		c.mu.Unlock()
		return false, err
	}
	if n.state != Running || n.handle == nil {
		c.mu.Unlock()
		return false, nil
	}
	h := n.handle
	c.mu.Unlock()
	select {
	case <-h.Exited():
	default:
		return false, nil
	}
	c.setState(n, Stopped)
	return true, c.Start(name)
}

// wipeDisk empties a stopped node's data dir through its mount and makes
// that durable, so that no later power cut brings the old member's data
// back under a new one.
func (c *Cluster) wipeDisk(n *Node, fs *faultfs.FS) error {
	dir := diskDataDir(n)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("cluster: wipe %s: %w", n.Name, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("cluster: wipe %s: %w", n.Name, err)
		}
	}
	return fs.Sync()
}
