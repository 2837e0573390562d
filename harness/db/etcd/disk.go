package etcd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/nemesis"
)

// Disk faults. With db.Env.DiskFaults every slot's data dir
// (nodes/<name>/data, etcd's --data-dir) is a faultfs mount over itself,
// as for tidal-server's nodes (package cluster): faultfs serves any
// process, and etcd's WAL (fdatasync per batch, preallocated segments)
// and bbolt backend (fdatasync per commit) go through it unchanged. So
// power cuts drop what etcd never made durable, fsync errors reach its
// WAL and backend, and a full or slow disk is its own. The mounts live in
// the harness's process; teardown kills the nodes, waits for their exits
// and unmounts every one, writing its counters to nodes/<name>/faultfs.json.

var _ nemesis.DiskCluster = (*Cluster)(nil)

func dataDir(n *node) string { return filepath.Join(n.dir, "data") }

// mountDisks mounts faultfs over every slot's data dir, before any node
// starts (a slot added back as a new member runs on the same mount).
func (c *Cluster) mountDisks() error {
	if err := faultfs.Available(); err != nil {
		return fmt.Errorf("etcd: disk faults need faultfs: %w", err)
	}
	c.disks = map[string]*faultfs.FS{}
	for _, n := range c.nodes {
		dir := dataDir(n)
		// etcd wants its data dir private (it warns otherwise).
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		fs, err := faultfs.Mount(dir, dir, faultfs.Options{})
		if err != nil {
			return fmt.Errorf("etcd: %s: %w", n.name, err)
		}
		c.disks[n.name] = fs
		c.log.Info("faultfs mounted", "node", n.name, "dir", dir)
	}
	return nil
}

// unmountDisks writes each mount's counters beside its node and unmounts
// it; the nodes must have exited.
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
			errs = append(errs, fmt.Errorf("etcd: unmount %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// HasDisks implements nemesis.DiskCluster.
func (c *Cluster) HasDisks() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.disks != nil
}

// Disk implements nemesis.DiskCluster.
func (c *Cluster) Disk(name string) (nemesis.NodeDisk, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.node(name); err != nil {
		return nil, err
	}
	if c.disks == nil {
		return nil, fmt.Errorf("etcd: %s: expected a faultfs mount on its data dir, found none (the cluster was started without disk faults)", name)
	}
	return c.disks[name], nil
}

// PowerCut implements nemesis.DiskCluster as cluster.Cluster.PowerCut
// does: every running target is frozen first, then every disk at once
// loses what was never made durable and is mounted afresh, then the
// frozen processes are killed -9 (killing first would let fsyncs already
// inside faultfs complete). The nodes are left Killed; Start brings each
// back on what survived.
func (c *Cluster) PowerCut(names []string, o faultfs.PowerCutOptions) (map[string]faultfs.PowerCutReport, error) {
	disks := make([]*faultfs.FS, len(names))
	c.mu.Lock()
	for i, name := range names {
		if c.disks == nil || c.disks[name] == nil {
			c.mu.Unlock()
			return nil, fmt.Errorf("etcd: power cut %s: expected a faultfs mount, found none", name)
		}
		disks[i] = c.disks[name]
	}
	c.mu.Unlock()
	var errs []error
	for _, name := range names {
		if c.State(name) == cluster.Running {
			if err := c.Pause(name); err != nil {
				errs = append(errs, fmt.Errorf("freeze %s: %w", name, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("etcd: power cut: %w", err)
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
		if st := c.State(name); st == cluster.Running || st == cluster.Paused {
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
		reports[name] = reps[i]
		c.log.Info("power cut", "node", name, "files", reps[i].Files, "bytes_discarded", reps[i].BytesDiscarded, "torn", reps[i].Torn)
	}
	if err := errors.Join(errs...); err != nil {
		return reports, fmt.Errorf("etcd: power cut: %w", err)
	}
	return reports, nil
}

// Revive implements nemesis.DiskCluster: starts name again if its process
// exited on its own while the harness believed it running (etcd exits on
// a failed fsync of its WAL, and refuses to start on a corrupt one).
func (c *Cluster) Revive(name string) (bool, error) {
	c.mu.Lock()
	n, err := c.node(name)
	if err != nil {
		c.mu.Unlock()
		return false, err
	}
	if n.state != cluster.Running || n.handle == nil {
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
	c.set(n, cluster.Stopped)
	return true, c.Start(name)
}

// wipe empties a stopped slot's data dir. On a faultfs mount it removes
// what is inside (the mountpoint itself stays) and makes that durable, so
// that no later power cut brings the old member's data back under a new
// one.
func (c *Cluster) wipe(n *node) error {
	c.mu.Lock()
	fs := c.disks[n.name]
	c.mu.Unlock()
	if fs == nil {
		return os.RemoveAll(dataDir(n))
	}
	entries, err := os.ReadDir(dataDir(n))
	if err != nil {
		return fmt.Errorf("etcd: wipe %s: %w", n.name, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dataDir(n), e.Name())); err != nil {
			return fmt.Errorf("etcd: wipe %s: %w", n.name, err)
		}
	}
	return fs.Sync()
}

// waitExited waits up to d for every started node's process to exit.
func (c *Cluster) waitExited(d time.Duration) {
	c.mu.Lock()
	var hs []cluster.Handle
	for _, n := range c.nodes {
		if n.handle != nil {
			hs = append(hs, n.handle)
		}
	}
	c.mu.Unlock()
	deadline := time.After(d)
	for _, h := range hs {
		select {
		case <-h.Exited():
		case <-deadline:
			return
		}
	}
}
