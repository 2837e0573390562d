package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/history"
)

// fakeDisk records what the nemesis arms on a node's disk.
type fakeDisk struct {
	mu    sync.Mutex
	armed faultfs.Faults
	eio   uint64
	// dir is the node's data dir as Mountpoint shows it ("" for none).
	dir string
}

func (d *fakeDisk) Mountpoint() string { return d.dir }

func (d *fakeDisk) Set(f faultfs.Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if f.FsyncError != nil {
		d.armed.FsyncError = f.FsyncError
		d.eio++ // the node's next fsync fails at once
	}
	if f.DiskFull != nil {
		d.armed.DiskFull = f.DiskFull
	}
	if f.SlowDisk != nil {
		d.armed.SlowDisk = f.SlowDisk
	}
	if f.CorruptRead != nil {
		d.armed.CorruptRead = f.CorruptRead
	}
	return nil
}

func (d *fakeDisk) Clear(kinds ...faultfs.Kind) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(kinds) == 0 {
		kinds = faultfs.Kinds
	}
	for _, k := range kinds {
		switch k {
		case faultfs.KindFsyncError:
			d.armed.FsyncError = nil
		case faultfs.KindDiskFull:
			d.armed.DiskFull = nil
		case faultfs.KindSlowDisk:
			d.armed.SlowDisk = nil
		case faultfs.KindCorruptRead:
			d.armed.CorruptRead = nil
		}
	}
}

func (d *fakeDisk) Stats() faultfs.Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return faultfs.Stats{Faults: faultfs.FaultStats{FsyncEIO: d.eio}}
}

func (d *fakeDisk) faults() faultfs.Faults {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.armed
}

func (f *fakeCluster) HasDisks() bool { return !f.noDisks }

func (f *fakeCluster) Disk(name string) (NodeDisk, error) {
	return f.disk(name)
}

func (f *fakeCluster) disk(name string) (*fakeDisk, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.noDisks {
		return nil, fmt.Errorf("fake: %s has no faultfs mount", name)
	}
	if _, ok := f.states[name]; !ok {
		return nil, fmt.Errorf("fake: no node %q", name)
	}
	if f.disks == nil {
		f.disks = map[string]*fakeDisk{}
	}
	if f.disks[name] == nil {
		f.disks[name] = &fakeDisk{}
	}
	return f.disks[name], nil
}

func (f *fakeCluster) PowerCut(names []string, o faultfs.PowerCutOptions) (map[string]faultfs.PowerCutReport, error) {
	for _, n := range names {
		if st := f.State(n); st == cluster.Running || st == cluster.Paused {
			if err := f.Kill(n); err != nil {
				return nil, err
			}
		}
	}
	reps := map[string]faultfs.PowerCutReport{}
	for _, n := range names {
		f.mu.Lock()
		f.calls = append(f.calls, "power-cut "+n)
		f.mu.Unlock()
		reps[n] = faultfs.PowerCutReport{Files: 1, BytesDiscarded: 4096, Seed: o.Seed}
	}
	return reps, nil
}

// exit marks n's process as exited on its own (it fenced itself).
func (f *fakeCluster) exit(n string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.exited == nil {
		f.exited = map[string]bool{}
	}
	f.exited[n] = true
}

func (f *fakeCluster) Revive(n string) (bool, error) {
	f.mu.Lock()
	gone := f.exited[n] && f.states[n] == cluster.Running
	if gone {
		delete(f.exited, n)
		f.states[n] = cluster.Stopped
	}
	f.mu.Unlock()
	if !gone {
		return false, nil
	}
	return true, f.Start(n)
}

func stepFor(t *testing.T, kind string, targets ...string) Step {
	t.Helper()
	s, err := Generate(3, ScheduleConfig{Duration: time.Minute, Interval: time.Second, Mix: []string{kind}, Nodes: []string{"n1", "n2", "n3"}})
	if err != nil || len(s.Steps) == 0 {
		t.Fatalf("generate %s: %v (%d steps)", kind, err, len(s.Steps))
	}
	st := s.Steps[0]
	st.At = 0
	if targets != nil {
		st.Targets = targets
	}
	return st
}

// power-cut-all kills every node before it touches any disk (one power
// loss, not three in a row), records what each disk lost, and its heal
// starts every node again.
func TestPowerCutAllKillsEveryNodeFirstAndHealStartsThem(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	st := stepFor(t, "power-cut-all")
	if !slices.Equal(st.Targets, []string{"n1", "n2", "n3"}) || st.Disk == nil || st.Disk.PowerCut == nil || st.Disk.PowerCut.Seed == 0 {
		t.Fatalf("generated step: expected every node and a seeded power cut spec, found %+v (disk %+v)", st, st.Disk)
	}
	must(t, r.Inject(ctx, st))
	calls := f.callLog()
	want := []string{"kill n1", "kill n2", "kill n3", "power-cut n1", "power-cut n2", "power-cut n3"}
	if !slices.Equal(calls, want) {
		t.Fatalf("calls: expected %v, found %v", want, calls)
	}
	for _, n := range f.Names() {
		if st := f.State(n); st != cluster.Killed {
			t.Fatalf("%s after the cut: expected killed, found %s", n, st)
		}
	}
	must(t, r.Heal(ctx, "power-cut-all"))
	for _, n := range f.Names() {
		if st := f.State(n); st != cluster.Running {
			t.Fatalf("%s after the heal: expected running, found %s", n, st)
		}
	}
	rec.Close()
	ops := readHistory(t, rec, path)
	var okv history.FaultValue
	for _, op := range ops {
		if op.F == FPowerCut && op.Type == history.OK {
			okv, _ = history.Decode[history.FaultValue](op)
		}
	}
	var params powerCutParams
	if err := json.Unmarshal(okv.Params, &params); err != nil || len(params.Reports) != 3 || params.Seed != st.Disk.PowerCut.Seed {
		t.Fatalf("recorded params: expected the options and a report per node, found %s (%v)", okv.Params, err)
	}
	k, _ := LookupKind("power-cut-all")
	if res := checker.Faults(ops, []checker.FaultKind{k.Recorded()}); res.Valid != checker.Valid {
		t.Fatalf("faults checker: %s: %s", res.Valid, res.Summary)
	}
	ws, err := checker.FaultWindows(ops)
	if err != nil || len(ws) != 1 || ws[0].F != FPowerCut || !ws[0].Healed || len(ws[0].Targets) != 3 {
		t.Fatalf("windows: expected one healed power-cut window on 3 nodes, found %v (%v)", ws, err)
	}
}

// fsync-error arms a sticky EIO on the target's disk; the node fences
// itself and exits; the heal clears the disk and starts it again.
func TestFsyncErrorArmsAndHealRevivesAFencedNode(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	st := stepFor(t, "fsync-error", "n2")
	must(t, r.Inject(ctx, st))
	d, _ := f.disk("n2")
	if fe := d.faults().FsyncError; fe == nil || !fe.Sticky {
		t.Fatalf("n2's disk: expected a sticky fsync error armed, found %+v", d.faults())
	}
	if other, _ := f.disk("n1"); other.faults().FsyncError != nil {
		t.Fatal("n1's disk: expected nothing armed")
	}
	f.exit("n2") // it fenced itself
	must(t, r.Heal(ctx, "fsync-error"))
	if d.faults().FsyncError != nil {
		t.Fatalf("after the heal: expected the fault cleared, found %+v", d.faults())
	}
	if !slices.Contains(f.callLog(), "start n2") || f.State("n2") != cluster.Running {
		t.Fatalf("after the heal: expected n2 started again, calls %v", f.callLog())
	}
	// The heal records what the fault did to each target: the fencing
	// checker tells a node whose fsync failed from one never reached.
	rec.Close()
	var healed diskParams
	for _, op := range readHistory(t, rec, path) {
		if op.F == history.HealOf(FDisk) && op.Type == history.OK {
			v, _ := history.Decode[history.FaultValue](op)
			if err := json.Unmarshal(v.Params, &healed); err != nil {
				t.Fatal(err)
			}
		}
	}
	if healed.FsyncError == nil || healed.After["n2"].FsyncEIO <= healed.Before["n2"].FsyncEIO {
		t.Fatalf("heal-disk params: expected the armed fault and n2's fsync EIOs counted between arm and heal, found %+v", healed)
	}
	if slices.Contains(f.callLog(), "start n1") {
		t.Fatalf("a node that did not exit must not be started: %v", f.callLog())
	}
}

// corrupt-read restarts its target, so the node reads its log back
// through the corruption.
func TestCorruptReadRestartsItsTarget(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, _ := newRecorder(t)
	r := NewRunner(f, rec, nil)
	must(t, r.Inject(ctx, stepFor(t, "corrupt-read", "n3")))
	d, _ := f.disk("n3")
	if cr := d.faults().CorruptRead; len(cr) != 1 || cr[0].Path != "*.wal" {
		t.Fatalf("n3's disk: expected a corrupt read of the WAL armed, found %+v", d.faults())
	}
	if !slices.Equal(f.callLog(), []string{"restart n3"}) {
		t.Fatalf("calls: expected n3 restarted, found %v", f.callLog())
	}
	must(t, r.HealAll(ctx))
	if d.faults().CorruptRead != nil {
		t.Fatal("heal-all: expected every disk fault cleared")
	}
}

// On a cluster whose data dirs are not faultfs mounts, a disk fault fails
// (never took effect) and says why.
func TestDiskKindWithoutFaultfsFailsNamingWhy(t *testing.T) {
	f := newFake(t, 3)
	f.noDisks = true
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	err := r.Inject(context.Background(), stepFor(t, "power-cut-one"))
	if err == nil || !strings.Contains(err.Error(), "power-cut-one needs faultfs") {
		t.Fatalf("expected the power cut refused for want of faultfs, found %v", err)
	}
	rec.Close()
	ops := readHistory(t, rec, path)
	if len(ops) != 2 || ops[1].Type != history.Fail {
		t.Fatalf("history: expected invoke + fail, found %+v", ops)
	}
	if len(f.callLog()) != 0 {
		t.Fatalf("nothing may be done to the nodes: %v", f.callLog())
	}
}

// Where FUSE is missing, naming a disk kind is refused saying so, the
// disk group too, and "all" leaves the disk kinds out.
func TestParseMixWithoutFUSE(t *testing.T) {
	noFUSE := errors.New("/dev/fuse not found")
	_, err := ParseMixWith("partition,power-cut-all", 3, noFUSE)
	if err == nil || !strings.Contains(err.Error(), "power-cut-all needs faultfs: /dev/fuse not found") {
		t.Fatalf("expected power-cut-all refused naming /dev/fuse, found %v", err)
	}
	if _, err := ParseMixWith("disk", 3, noFUSE); err == nil || !strings.Contains(err.Error(), "need faultfs") {
		t.Fatalf("expected the disk group refused, found %v", err)
	}
	all, err := ParseMixWith("all", 3, noFUSE)
	if err != nil || NeedsDisks(all) {
		t.Fatalf("all without FUSE: expected no disk kind, found %v (%v)", all, err)
	}
	all, err = ParseMixWith("all", 3, nil)
	if err != nil || !slices.Contains(all, "power-cut-all") || !slices.Contains(all, "corrupt-read") {
		t.Fatalf("all with FUSE: expected the disk kinds, found %v (%v)", all, err)
	}
	disk, err := ParseMixWith("disk", 3, nil)
	if err != nil || len(disk) != 9 || !NeedsDisks(disk) {
		t.Fatalf("disk group: expected its 9 kinds, found %v (%v)", disk, err)
	}
}

// A disk step's spec survives schedule.json, and a disk step without one
// is refused by Validate.
func TestDiskSpecRoundTripsAndIsRequired(t *testing.T) {
	s, err := Generate(9, ScheduleConfig{Duration: time.Minute, Interval: 2 * time.Second, Mix: []string{"disk"}, Nodes: []string{"n1", "n2", "n3"}})
	if err == nil {
		t.Fatal("expected a group name to be refused by Generate (it takes kinds)")
	}
	mix, _ := ParseMixWith("disk", 3, nil)
	s, err = Generate(9, ScheduleConfig{Duration: time.Minute, Interval: 2 * time.Second, Mix: mix, Nodes: []string{"n1", "n2", "n3"}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "schedule.json")
	must(t, s.WriteFile(path))
	back, err := LoadSchedule(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, st := range back.Steps {
		if st.Disk == nil {
			t.Fatalf("step %d (%s): disk spec lost in the round trip", i, st.Kind)
		}
		a, _ := json.Marshal(s.Steps[i].Disk)
		b, _ := json.Marshal(st.Disk)
		if string(a) != string(b) {
			t.Fatalf("step %d (%s): disk spec %s came back as %s", i, st.Kind, a, b)
		}
	}
	bad := Schedule{Config: s.Config, Steps: []Step{{Kind: "fsync-error", Targets: []string{"n1"}, Duration: time.Second}}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "expected a disk fault spec") {
		t.Fatalf("expected a disk step without a spec refused, found %v", err)
	}
}
