package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
	if name := c.cfg.Backend.Name(); name != "process" {
		return fmt.Errorf("cluster: disk faults: expected the process backend (faultfs mounts the nodes' data dirs on this machine), found %s", name)
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
		fs, err := faultfs.Mount(dir, dir, faultfs.Options{})
		if err != nil {
			return fmt.Errorf("cluster: %s: %w", n.Name, err)
		}
		c.disks[n.Name] = fs
		c.log.Info("faultfs mounted", "node", n.Name, "dir", dir)
	}
	return nil
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
// (or is paused) is killed -9 first, all before any disk is touched, as
// one power loss would; then each disk loses what was never made durable
// (faultfs.FS.PowerCut) and is mounted afresh, as found at boot. The
// nodes are left Killed: Start brings each back on its surviving data.
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
	var errs []error
	for _, name := range names {
		if st := c.State(name); st == Running || st == Paused {
			if err := c.Kill(name); err != nil {
				errs = append(errs, fmt.Errorf("kill %s: %w", name, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("cluster: power cut: %w", err)
	}
	reports := map[string]faultfs.PowerCutReport{}
	for i, name := range names {
		oi := o
		if oi.TornWrites && oi.Seed != 0 {
			oi.Seed += int64(i)
		}
		rep, err := disks[i].PowerCut(oi)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
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
