package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/history"
)

// Disk faults act on the faultfs mount under each node's data dir (see
// cluster.Config.DiskFaults). Two families, one class (Disk): at most one
// disk fault is active at a time, so a power cut never meets an armed
// fsync error it did not ask for, and heal-power-cut / heal-disk each
// end exactly one window.
//
//   - power-cut-one, -minority, -all (history f "power-cut", kind "one",
//     "minority", "all"): kill -9 the targets, all of them before any disk
//     is touched, then roll each disk back to what was made durable
//     (optionally keeping a torn prefix of the unsynced writes) and mount
//     it afresh, as found at boot. Heal starts each target again on its
//     surviving data.
//   - fsync-error, disk-full, slow-disk, slow-disk-stall, corrupt-read
//     (history f "disk", kind the name): arm the faultfs fault on the
//     targets' disks. Heal clears it (releasing every operation a stall
//     holds at once) and starts again a target whose process exited on
//     its own meanwhile (a node fences itself on a failed fsync or a full
//     disk, and refuses to open a log it reads corrupt). corrupt-read
//     also restarts its target when armed: a running node does not read
//     its log back, a starting one does.
//
// What each fault does is fixed when the schedule is generated
// (Step.Disk), so schedule.json says it and a repro does it again.

// NodeDisk is one node's faultfs mount as the nemesis drives it.
type NodeDisk interface {
	Set(faultfs.Faults) error
	Clear(kinds ...faultfs.Kind)
	Stats() faultfs.Stats
	// Mountpoint is where the node's files are seen (its data dir);
	// corrupt-read reads them there to pick a range.
	Mountpoint() string
}

// DiskCluster is a Cluster whose nodes' data dirs are faultfs mounts.
type DiskCluster interface {
	Cluster
	// HasDisks reports whether the data dirs are mounted through faultfs.
	HasDisks() bool
	Disk(name string) (NodeDisk, error)
	// PowerCut kills the named nodes and rolls their disks back to the
	// durable state (cluster.Cluster.PowerCut).
	PowerCut(names []string, o faultfs.PowerCutOptions) (map[string]faultfs.PowerCutReport, error)
	// Revive starts a node again whose process exited on its own while
	// the harness believed it running; it reports whether it did.
	Revive(name string) (bool, error)
}

func (l LiveCluster) Disk(name string) (NodeDisk, error) {
	d, err := l.Cluster.Disk(name)
	if err != nil {
		return nil, err
	}
	return d, nil
}

var _ DiskCluster = LiveCluster{}

// Fault names (history f) of the disk kinds.
const (
	FPowerCut = history.FPowerCut
	FDisk     = history.FDisk
)

// DiskSpec is what a disk fault does, chosen at generation time.
type DiskSpec struct {
	// PowerCut shapes a power cut (power-cut-*).
	PowerCut *faultfs.PowerCutOptions `json:"power_cut,omitempty"`
	// Faults is what fsync-error, disk-full, slow-disk and corrupt-read
	// arm on each target's disk (the one kind each sets).
	Faults *faultfs.Faults `json:"faults,omitempty"`
	// Corrupt, for corrupt-read, picks the range to corrupt on each
	// target when the fault is injected (it replaces Faults.CorruptRead,
	// the fallback, in what is armed and recorded).
	Corrupt *CorruptPick `json:"corrupt,omitempty"`
}

// DiskSupport says why disk kinds cannot run on this machine (nil: they
// can). A variable so tests can pretend FUSE is missing.
var DiskSupport = faultfs.Available

// needsDisks returns c as a DiskCluster whose data dirs are faultfs
// mounts, or an error naming the kind that needed one.
func needsDisks(c Cluster, kind string) (DiskCluster, error) {
	dc, ok := c.(DiskCluster)
	if !ok || !dc.HasDisks() {
		return nil, fmt.Errorf("%s needs faultfs: the nodes' data dirs are not faultfs mounts (run with --faultfs on or auto)", kind)
	}
	return dc, nil
}

// diskSpec picks what the fault of kind does, for a step.
func diskSpec(kind string, r *rand.Rand) *DiskSpec {
	switch kind {
	case "power-cut-one", "power-cut-minority", "power-cut-all", "stop-then-power-cut", "power-cut-after-election":
		// Half the cuts tear: each disk keeps a random prefix of its
		// unsynced writes, the last one possibly cut at a sector.
		return &DiskSpec{PowerCut: &faultfs.PowerCutOptions{TornWrites: r.IntN(2) == 0, Seed: r.Int64N(1<<62) + 1}}
	case "power-cut-reorder":
		// The disk keeps a seeded half of the pages its unsynced writes
		// touched, in no order: a later page can survive an earlier one.
		return &DiskSpec{PowerCut: &faultfs.PowerCutOptions{OutOfOrder: true, Seed: r.Int64N(1<<62) + 1}}
	case "fsync-error":
		// Every fsync of every file fails until the heal: the node's
		// next WAL sync fails and it must fence itself, whichever file
		// it syncs first.
		return &DiskSpec{Faults: &faultfs.Faults{FsyncError: &faultfs.FsyncError{Sticky: true}}}
	case "disk-full":
		// No space left from the moment it is armed, counting every byte
		// written: the node's next WAL append fails with ENOSPC even into
		// its preallocated segment (without CountOverwrites the segment
		// took every append of a fault window, and the fault seldom bit).
		return &DiskSpec{Faults: &faultfs.Faults{DiskFull: &faultfs.DiskFull{FreeBytes: 0, CountOverwrites: true}}}
	case "slow-disk":
		lat := time.Duration(20+r.IntN(81)) * time.Millisecond
		return &DiskSpec{Faults: &faultfs.Faults{SlowDisk: []faultfs.SlowDisk{{Ops: []faultfs.Op{faultfs.OpFsync, faultfs.OpWrite}, Latency: lat}}}}
	case "slow-disk-stall":
		// The target's writes and fsyncs hang until the heal releases
		// them all at once: it stops acknowledging (its WAL cannot
		// persist), the others go on as a quorum, and it catches up.
		return &DiskSpec{Faults: &faultfs.Faults{SlowDisk: []faultfs.SlowDisk{{Ops: []faultfs.Op{faultfs.OpWrite, faultfs.OpFsync}, Stall: true}}}}
	case "corrupt-read":
		// Bits flipped in what the restarted node reads back: inside a
		// WAL record's body (with a record after it, so it cannot pass
		// for a torn tail), inside the newest snapshot's payload, or in
		// every segment's header (also the fallback the spec arms when
		// the pick finds nothing). The node must refuse it (CRC),
		// naming the file and offset.
		where := []string{CorruptWALRecord, CorruptWALRecord, CorruptSnapshot, CorruptSegmentHeader}[r.IntN(4)]
		return &DiskSpec{Faults: &faultfs.Faults{CorruptRead: []faultfs.CorruptRead{{Path: "*.wal", Offset: 0, Length: 16}}},
			Corrupt: &CorruptPick{Where: where, Seed: r.Int64N(1<<62) + 1}}
	}
	return nil
}

// every picks every node (power-cut-all).
var every = func(_ *rand.Rand, nodes []string) []string { return slices.Clone(nodes) }

// someDisks slows every node's disk half the time, one node's otherwise.
var someDisks = func(r *rand.Rand, nodes []string) []string {
	if r.IntN(2) == 0 {
		return slices.Clone(nodes)
	}
	return one(r, nodes)
}

// ---- power cuts ----

type powerCut struct {
	sub string // "one", "minority", "all"
}

type powerCutParams struct {
	faultfs.PowerCutOptions
	// Reports are what each disk lost, filled in once the cut took effect.
	Reports map[string]faultfs.PowerCutReport `json:"reports,omitempty"`
}

func (p powerCut) Resolve(_ context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: p.sub}
	if _, err := needsDisks(c, s.Kind); err != nil {
		return v, err
	}
	var o faultfs.PowerCutOptions
	if s.Disk != nil && s.Disk.PowerCut != nil {
		o = *s.Disk.PowerCut
	}
	var err error
	v.Params, err = json.Marshal(powerCutParams{PowerCutOptions: o})
	if err != nil {
		return v, err
	}
	switch p.sub {
	case "all":
		// Every member now (the step names every node, or none in a
		// hand-written schedule); a slot churn removed holds no member.
		for _, n := range c.Names() {
			if c.State(n) != cluster.Removed && (len(s.Targets) == 0 || slices.Contains(s.Targets, n)) {
				v.Targets = append(v.Targets, n)
			}
		}
		if len(v.Targets) == 0 {
			return v, fmt.Errorf("%s: expected members to cut, found none", s.Kind)
		}
		return v, nil
	case "minority":
		v.Targets = slices.Clone(s.Targets)
		if n := len(c.Names()); 2*len(s.Targets) >= n {
			return v, fmt.Errorf("%s: expected a minority of %d nodes, found targets %v", s.Kind, n, s.Targets)
		}
		return v, checkTargets(c, s, -1)
	}
	v.Targets = slices.Clone(s.Targets)
	return v, checkTargets(c, s, 1)
}

func (p powerCut) Inject(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	dc, err := needsDisks(c, "power-cut-"+p.sub)
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	var params powerCutParams
	if err := json.Unmarshal(v.Params, &params); err != nil {
		return time.Time{}, NotApplied(fmt.Errorf("power cut params %s: %w", v.Params, err))
	}
	for _, t := range v.Targets {
		if st := c.State(t); st == cluster.Removed {
			return time.Time{}, NotApplied(fmt.Errorf("%s: expected a member, found its slot removed", t))
		}
		if _, err := dc.Disk(t); err != nil {
			return time.Time{}, NotApplied(err)
		}
	}
	reports, err := dc.PowerCut(v.Targets, params.PowerCutOptions)
	params.Reports = reports
	v.Params, _ = json.Marshal(params)
	if err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

// Heal starts every target the cut left down; one something else brought
// back already needs nothing.
func (p powerCut) Heal(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	var errs []error
	for _, t := range v.Targets {
		if st := c.State(t); st == cluster.Killed || st == cluster.Stopped {
			if err := c.Start(t); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", t, err))
			}
		}
	}
	return time.Now(), errors.Join(errs...)
}

// ---- faults armed on the disk ----

type diskFault struct {
	kind faultfs.Kind
	// sub is the history kind when it differs from kind (slow-disk-stall).
	sub string
}

// name is the fault's history kind.
func (d diskFault) name() string {
	if d.sub != "" {
		return d.sub
	}
	return string(d.kind)
}

// diskParams is what the history records of a disk fault: the faults
// armed, and each target's fault counters when they were armed (in the
// ok) and when they were cleared (in the heal's ok). The difference is
// what the fault did to the node — fsyncs failed with EIO, writes refused
// with ENOSPC, reads corrupted — which a checker needs to tell a node that
// carried on after a failed fsync from one the fault never reached.
type diskParams struct {
	faultfs.Faults
	// Corrupt is how corrupt-read picked its ranges, and Picked what each
	// target's range is (CorruptRead above is the last target's).
	Corrupt *CorruptPick                  `json:"corrupt,omitempty"`
	Picked  map[string]PickedRange        `json:"picked,omitempty"`
	Before  map[string]faultfs.FaultStats `json:"before,omitempty"`
	After   map[string]faultfs.FaultStats `json:"after,omitempty"`
	// Effect is After less Before per target, in the heal's ok: what the
	// fault did (ENOSPCs returned, fsyncs failed, operations stalled,
	// reads corrupted); all zero means it never bit.
	Effect map[string]faultfs.FaultStats `json:"effect,omitempty"`
}

// PickedRange is the range corrupt-read armed on one target.
type PickedRange struct {
	faultfs.CorruptRead
	What string `json:"what"`
}

// faultEffect is what a disk fault's counters grew by while it was armed.
func faultEffect(before, after faultfs.FaultStats) faultfs.FaultStats {
	return faultfs.FaultStats{
		FsyncEIO:         after.FsyncEIO - before.FsyncEIO,
		LostWritebackEIO: after.LostWritebackEIO - before.LostWritebackEIO,
		LostBytes:        after.LostBytes - before.LostBytes,
		ENOSPC:           after.ENOSPC - before.ENOSPC,
		Delayed:          after.Delayed - before.Delayed,
		Stalled:          after.Stalled - before.Stalled,
		CorruptReads:     after.CorruptReads - before.CorruptReads,
		CorruptBytes:     after.CorruptBytes - before.CorruptBytes,
	}
}

func (d diskFault) Resolve(_ context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: d.name(), Targets: slices.Clone(s.Targets)}
	if _, err := needsDisks(c, s.Kind); err != nil {
		return v, err
	}
	if s.Disk == nil || s.Disk.Faults == nil {
		return v, fmt.Errorf("%s: expected a disk fault spec, found none", s.Kind)
	}
	if err := s.Disk.Faults.Validate(); err != nil {
		return v, fmt.Errorf("%s: disk fault: %w", s.Kind, err)
	}
	var err error
	if v.Params, err = json.Marshal(diskParams{Faults: *s.Disk.Faults, Corrupt: s.Disk.Corrupt}); err != nil {
		return v, err
	}
	return v, checkTargets(c, s, -1)
}

func (d diskFault) params(v *history.FaultValue) (diskParams, error) {
	var p diskParams
	if err := json.Unmarshal(v.Params, &p); err != nil {
		return p, fmt.Errorf("%s params %s: %w", d.kind, v.Params, err)
	}
	return p, nil
}

func (d diskFault) Inject(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	dc, err := needsDisks(c, d.name())
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	p, err := d.params(v)
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	p.Before = map[string]faultfs.FaultStats{}
	defer func() { v.Params, _ = json.Marshal(p) }()
	for i, t := range v.Targets {
		disk, err := dc.Disk(t)
		faults := p.Faults
		if err == nil && p.Corrupt != nil {
			// The range is picked from the target's files as they are
			// now, before anything is armed on its disk.
			var pr PickedRange
			pr.CorruptRead, pr.What, err = pickCorruptRange(disk.Mountpoint(), *p.Corrupt)
			if err == nil {
				faults.CorruptRead = []faultfs.CorruptRead{pr.CorruptRead}
				p.CorruptRead = faults.CorruptRead
				if p.Picked == nil {
					p.Picked = map[string]PickedRange{}
				}
				p.Picked[t] = pr
			}
		}
		if err == nil {
			p.Before[t] = disk.Stats().Faults
			err = disk.Set(faults)
		}
		if err != nil {
			if i == 0 {
				err = NotApplied(err)
			}
			return time.Time{}, fmt.Errorf("%s: %w", t, err)
		}
	}
	if d.kind == faultfs.KindCorruptRead {
		// Only a node opening its log reads it back: restart the ones
		// running now (a node down now reads it when it starts).
		for _, t := range v.Targets {
			if c.State(t) == cluster.Running {
				if err := c.Restart(t); err != nil {
					return time.Time{}, fmt.Errorf("%s: restart to read the corrupt log: %w", t, err)
				}
			}
		}
	}
	return time.Now(), nil
}

// Heal clears the fault on every target's disk, then starts again each
// target whose process exited on its own meanwhile: a node that fenced
// itself, or refused a log it read corrupt, comes back on a good disk.
func (d diskFault) Heal(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	dc, err := needsDisks(c, d.name())
	if err != nil {
		return time.Time{}, err
	}
	p, err := d.params(v)
	if err != nil {
		return time.Time{}, err
	}
	p.After = map[string]faultfs.FaultStats{}
	p.Effect = map[string]faultfs.FaultStats{}
	var errs []error
	for _, t := range v.Targets {
		disk, err := dc.Disk(t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		disk.Clear(d.kind)
		p.After[t] = disk.Stats().Faults
		p.Effect[t] = faultEffect(p.Before[t], p.After[t])
	}
	v.Params, _ = json.Marshal(p)
	at := time.Now()
	for _, t := range v.Targets {
		if _, err := dc.Revive(t); err != nil {
			errs = append(errs, fmt.Errorf("%s: start again after %s: %w", t, d.name(), err))
		}
	}
	return at, errors.Join(errs...)
}

// clearDisks disarms every disk fault on every node and starts again the
// nodes whose process exited on its own meanwhile, for HealAll. A cluster
// without disks needs nothing.
func clearDisks(c Cluster) error {
	dc, ok := c.(DiskCluster)
	if !ok || !dc.HasDisks() {
		return nil
	}
	var errs []error
	for _, n := range c.Names() {
		disk, err := dc.Disk(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		disk.Clear()
	}
	return errors.Join(errs...)
}

// reviveDisks starts again the nodes a disk fault left exited, for
// HealAll.
func reviveDisks(c Cluster) error {
	dc, ok := c.(DiskCluster)
	if !ok || !dc.HasDisks() {
		return nil
	}
	var errs []error
	for _, n := range c.Names() {
		if _, err := dc.Revive(n); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

var diskKinds = []Kind{
	{Name: "power-cut-one", F: FPowerCut, Sub: "one", Class: Disk, MinNodes: 2, pick: one, fault: powerCut{"one"},
		Doc: "kill -9 one random node and lose what its disk never made durable (faultfs, torn writes half the time); heal starts it on what survived"},
	{Name: "power-cut-minority", F: FPowerCut, Sub: "minority", Class: Disk, MinNodes: 3, pick: minority, fault: powerCut{"minority"},
		Doc: "power cut on a random minority of nodes at once; heal starts them again"},
	{Name: "power-cut-all", F: FPowerCut, Sub: "all", Class: Disk, MinNodes: 1, pick: every, fault: powerCut{"all"},
		Doc: "power cut on every node at once: every acknowledged write must survive; heal starts them all again"},
	// Opt-in, not in "all" or the disk group: a hole of lost pages before
	// data that survived reads as corruption, so the target may rightly
	// refuse to start, naming file and offset, until an operator repairs
	// its WAL (tidal-server wal repair). A run that asks for it accepts a
	// node down at the end (the nodes checker says why; ledger and
	// convergence are then unknown for it); one that asks for "all"
	// should end with every node serving.
	{Name: "power-cut-reorder", F: FPowerCut, Sub: checker.ReorderCut, Class: Disk, MinNodes: 2, pick: one, fault: powerCut{checker.ReorderCut}, OptIn: true,
		Doc: "power cut on one random node whose disk kept a seeded half of its unsynced pages, out of order (opt-in, not in all): it starts on a valid prefix of its log or refuses, naming file and offset"},
	{Name: "fsync-error", F: FDisk, Sub: string(faultfs.KindFsyncError), Class: Disk, MinNodes: 2, pick: one, fault: diskFault{kind: faultfs.KindFsyncError},
		Doc: "every fsync on one random node's disk fails with EIO: it must fence itself (exit 4); heal clears it and starts the node again"},
	{Name: "disk-full", F: FDisk, Sub: string(faultfs.KindDiskFull), Class: Disk, MinNodes: 2, pick: one, fault: diskFault{kind: faultfs.KindDiskFull},
		Doc: "one random node's disk has no space left from now, overwrites of preallocated space included (ENOSPC on its next WAL append): it must fence itself (exit 4); heal frees it and starts the node again"},
	{Name: "slow-disk", F: FDisk, Sub: string(faultfs.KindSlowDisk), Class: Disk, MinNodes: 1, pick: someDisks, fault: diskFault{kind: faultfs.KindSlowDisk},
		Doc: "20-100ms added to every write and fsync, on every node's disk or one random node's"},
	{Name: "corrupt-read", F: FDisk, Sub: string(faultfs.KindCorruptRead), Class: Disk, MinNodes: 2, pick: one, fault: diskFault{kind: faultfs.KindCorruptRead},
		Doc: "one random node is restarted reading bits flipped inside a WAL record body, its newest snapshot or its segment headers: it must refuse them (CRC), never serve them; heal clears it and starts the node"},
	{Name: "slow-disk-stall", F: FDisk, Sub: "slow-disk-stall", Class: Disk, MinNodes: 3, pick: one, fault: diskFault{kind: faultfs.KindSlowDisk, sub: "slow-disk-stall"},
		Doc: "one random node's disk writes and fsyncs hang until the heal releases them all at once: it stops acknowledging, the others carry on, it catches up"},
}

// IsDisk reports whether kind needs faultfs: every kind of the disk
// class, and a kind of another class that cuts a disk (stop-then-power-cut
// is a process fault: it must not meet another stop or kill of its node).
func (k Kind) IsDisk() bool { return k.Class == Disk || slices.Contains(k.Needs, CapDisk) }

// NeedsDisks reports whether any of the named kinds needs faultfs.
func NeedsDisks(kinds []string) bool {
	for _, name := range kinds {
		if k, ok := LookupKind(name); ok && k.IsDisk() {
			return true
		}
	}
	return false
}
