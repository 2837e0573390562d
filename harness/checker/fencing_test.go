package checker

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// diskFault is a disk fault value as the nemesis records it.
func diskFault(t *testing.T, kind string, params any, targets ...string) history.FaultValue {
	t.Helper()
	b, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	return history.FaultValue{Kind: kind, Targets: targets, Params: b}
}

var stickyFsyncError = map[string]any{"fsync_error": map[string]any{"sticky": true}}

var fencedExit = ExitStatus{Code: 4, Text: "exit status 4"}

// fsyncErrorOnN2 is a run in which every fsync of n2 fails from 1s to
// 3s: a write to n2 invoked before the fault and acked just after it (an
// fsync already done), then writes to n2 under the fault that end as
// carry (ok, the defect) or fail (the node fenced), and writes to n1
// acked throughout.
func fsyncErrorOnN2(t *testing.T, carry bool) *hist {
	h := newHist(t)
	h.write(0, "w1", "n2", history.OK, 10)
	h.at(time.Second - 2*time.Millisecond)
	early := h.invoke(1, history.FWrite, history.WriteValue{Events: []history.Event{{ID: "w2", Entity: 1, Signal: "view"}}}, "n2")
	h.fault(fDisk, diskFault(t, diskFsyncError, stickyFsyncError, "n2"))
	h.ack(early, 11, 2) // staged and synced before the fault took effect
	under := history.OK
	if !carry {
		under = history.Fail
	}
	h.at(1500 * time.Millisecond)
	h.write(2, "w3", "n2", under, 12)
	h.write(3, "w4", "n1", history.OK, 13)
	h.write(2, "w5", "n2", under, 14)
	h.at(3 * time.Second)
	h.heal(fDisk)
	h.write(2, "w6", "n2", history.OK, 20) // after the heal: fine
	return h
}

func fencingDetails(t *testing.T, r Result) FencingDetails {
	t.Helper()
	d, ok := r.Details.(FencingDetails)
	if !ok {
		t.Fatalf("details are %T", r.Details)
	}
	return d
}

func TestFencingFencedNodeIsValid(t *testing.T) {
	h := fsyncErrorOnN2(t, false)
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{{Node: "n2", PID: 7, Time: int64(1600 * time.Millisecond), Status: fencedExit}}}
	r := Fencing(h.ops, ev)
	mustValid(t, r, Valid)
	d := fencingDetails(t, r)
	if len(d.Windows) != 1 || d.Windows[0].Writes != 2 || d.Windows[0].Refused != 2 || !d.Windows[0].Judged {
		t.Fatalf("expected one judged window with 2 writes, both refused; found %+v", d.Windows)
	}
	if len(d.Exits) != 1 || !d.Exits[0].Fenced || !strings.Contains(r.Summary, "fenced (exit 4): n2") {
		t.Fatalf("expected n2's fenced exit listed; found %+v, summary %q", d.Exits, r.Summary)
	}
	// The nodes checker takes the fenced exit as the fault's doing.
	mustValid(t, Nodes(h.ops, ev), Valid)
}

// The planted defect ignore-fsync-error as the history
// shows it: n2 keeps acknowledging writes after its fsyncs began to fail.
func TestFencingNodeThatCarriesOnIsInvalid(t *testing.T) {
	h := fsyncErrorOnN2(t, true)
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3")}
	r := Fencing(h.ops, ev)
	mustValid(t, r, Invalid)
	d := fencingDetails(t, r)
	if len(d.Acks) != 2 || d.Acks[0].Node != "n2" || d.Acks[0].Seq != 12 || d.Acks[0].FirstID != "w3" {
		t.Fatalf("expected the acks of w3 (seq 12) and w5 by n2; found %+v", d.Acks)
	}
	for _, want := range []string{"2 writes acknowledged", "id w3", "acked by n2 seq 12 term 2", "disk(fsync-error)"} {
		if !strings.Contains(r.Summary, want) {
			t.Fatalf("summary %q: expected it to contain %q", r.Summary, want)
		}
	}
}

func TestFencingOneShotFaultIsNotJudged(t *testing.T) {
	h := newHist(t)
	h.at(time.Second)
	h.fault(fDisk, diskFault(t, diskFsyncError, map[string]any{"fsync_error": map[string]any{}}, "n2"))
	h.write(2, "w3", "n2", history.OK, 12) // legitimate: later fsyncs succeed
	h.heal(fDisk)
	r := Fencing(h.ops, NodeEvidence{})
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "one-shot") {
		t.Fatalf("summary %q: expected it to say why the window was not judged", r.Summary)
	}
	h = newHist(t)
	h.fault(fDisk, diskFault(t, diskFsyncError, map[string]any{"fsync_error": map[string]any{"sticky": true, "path": "snap*"}}, "n2"))
	h.write(2, "w3", "n2", history.OK, 12)
	if r := Fencing(h.ops, NodeEvidence{}); r.Valid != Unknown || !strings.Contains(r.Summary, "misses the WAL") {
		t.Fatalf("a glob that misses the WAL: expected unknown saying so, found %s: %s", r.Valid, r.Summary)
	}
}

func TestFencingWithoutDiskFaultsIsUnknown(t *testing.T) {
	h := killAndRestart(t)
	mustValid(t, Fencing(h.ops, NodeEvidence{}), Unknown)
}

// corruptReadOnN3: the nemesis arms corrupt-read on n3 and restarts it;
// n3 exits on its own at 1.2s with the given log.
func corruptReadOnN3(t *testing.T, lines ...string) (*hist, NodeEvidence) {
	h := newHist(t)
	h.write(0, "w1", "n1", history.OK, 10)
	h.at(time.Second)
	h.fault(fDisk, diskFault(t, diskCorruptRead, map[string]any{"corrupt_read": []any{map[string]any{"path": "*.wal", "length": 16}}}, "n3"))
	h.at(3 * time.Second)
	h.heal(fDisk)
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{{Node: "n3", PID: 9, Time: int64(1200 * time.Millisecond), Status: ExitStatus{Code: 1, Text: "exit status 1"},
			Logs: []LogTail{{Path: "nodes/n3/node.log", Lines: lines}}}}}
	return h, ev
}

func TestFencingCorruptReadRefusalNamingFileAndOffsetIsValid(t *testing.T) {
	h, ev := corruptReadOnN3(t, "=== start", `level=ERROR msg="cannot start" err="replica: open wal: wal: corruption in /data/n3/wal/0000000000000000.wal at offset 0: bad checksum"`)
	r := Fencing(h.ops, ev)
	mustValid(t, r, Valid)
	if !strings.Contains(r.Summary, "refused a corrupt log, naming file and offset: n3") {
		t.Fatalf("summary %q: expected n3's refusal", r.Summary)
	}
	mustValid(t, Nodes(h.ops, ev), Valid)
}

func TestFencingCorruptReadExitWithoutNamingTheDamageIsInvalid(t *testing.T) {
	h, ev := corruptReadOnN3(t, "=== start", `level=ERROR msg="cannot start" err="replica: open wal: unexpected EOF"`)
	r := Fencing(h.ops, ev)
	mustValid(t, r, Invalid)
	if d := fencingDetails(t, r); len(d.Silent) != 1 || d.Silent[0].Node != "n3" {
		t.Fatalf("expected n3's silent exit listed, found %+v", d.Silent)
	}
	mustValid(t, Nodes(h.ops, ev), Invalid)
}

// A fenced exit is expected only where a disk fault explains it: the same
// exit status with no disk fault on that node is a crash.
func TestNodesFencedExitWithoutDiskFaultIsACrash(t *testing.T) {
	h := fsyncErrorOnN2(t, false)
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{{Node: "n1", PID: 7, Time: int64(1600 * time.Millisecond), Status: fencedExit}}}
	mustValid(t, Nodes(h.ops, ev), Invalid)
}

func TestDiskFaultedSeesOnlyJudgedDiskKinds(t *testing.T) {
	if DiskFaulted(killAndRestart(t).ops) {
		t.Fatal("kill and restart: expected no disk fault")
	}
	h := newHist(t)
	h.fault(fDisk, diskFault(t, "slow-disk", map[string]any{}, "n1"))
	if DiskFaulted(h.ops) {
		t.Fatal("slow-disk: expected not judged by fencing")
	}
	h.fault(fDisk, diskFault(t, diskFull, map[string]any{}, "n1"))
	if !DiskFaulted(h.ops) {
		t.Fatal("disk-full: expected the fencing checker to judge it")
	}
	h = newHist(t)
	h.fault(fDisk, diskFault(t, diskCorruptRead, map[string]any{}, "n1"))
	if !DiskFaulted(h.ops) {
		t.Fatal("corrupt-read: expected a disk fault")
	}
}

// A node that came back under corrupt-read and kept running is not the
// fencing checker's to fault: the data checkers judge what it served.
func TestFencingCorruptReadNodeThatKeptRunningIsValid(t *testing.T) {
	h, _ := corruptReadOnN3(t)
	r := Fencing(h.ops, NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3")})
	mustValid(t, r, Valid)
	if !strings.Contains(r.Summary, "kept running under corrupt-read") || !strings.Contains(r.Summary, "n3") {
		t.Fatalf("summary %q: expected n3 named as kept running", r.Summary)
	}
}

var noSpaceCountingOverwrites = map[string]any{"disk_full": map[string]any{"free_bytes": 0, "count_overwrites": true}}

// diskFullOnN2 is fsyncErrorOnN2 with a disk-full that leaves no byte to
// write, overwrites included, on n2 from 1s to 3s; the heal records the
// ENOSPCs faultfs returned.
func diskFullOnN2(t *testing.T, params map[string]any, carry bool) *hist {
	h := newHist(t)
	h.write(0, "w1", "n2", history.OK, 10)
	h.at(time.Second)
	h.fault(fDisk, diskFault(t, diskFull, params, "n2"))
	under := history.OK
	if !carry {
		under = history.Fail
	}
	h.at(1500 * time.Millisecond)
	h.write(2, "w3", "n2", under, 12)
	h.write(3, "w4", "n1", history.OK, 13)
	h.at(3 * time.Second)
	heal := h.invoke(history.Nemesis, history.HealOf(fDisk), nil, "")
	h.complete(heal, history.OK, diskFault(t, diskFull, map[string]any{"effect": map[string]any{"n2": map[string]any{"enospc": 3}}}, "n2"))
	return h
}

// Regression: a disk-full that leaves no byte, counting
// overwrites, fails every WAL append of its node; a node that still
// acknowledges a write under it carried on after a failed write, and the
// checker says so (before, disk-full windows were never judged).
func TestFencingDiskFullNodeThatCarriesOnIsInvalid(t *testing.T) {
	h := diskFullOnN2(t, noSpaceCountingOverwrites, true)
	r := Fencing(h.ops, NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3")})
	mustValid(t, r, Invalid)
	if d := fencingDetails(t, r); len(d.Acks) != 1 || d.Acks[0].FirstID != "w3" {
		t.Fatalf("expected w3's ack by n2 listed; found %+v", d.Acks)
	}
	if !strings.Contains(r.Summary, "disk(disk-full)") {
		t.Fatalf("summary %q: expected it to name the disk-full window", r.Summary)
	}
}

// A node that fenced under such a disk-full is valid, and the summary
// counts the ENOSPCs the heal recorded: a run shows the fault bit.
func TestFencingDiskFullFencedNodeIsValidAndCountsENOSPC(t *testing.T) {
	h := diskFullOnN2(t, noSpaceCountingOverwrites, false)
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{{Node: "n2", PID: 7, Time: int64(1600 * time.Millisecond), Status: fencedExit}}}
	r := Fencing(h.ops, ev)
	mustValid(t, r, Valid)
	d := fencingDetails(t, r)
	if len(d.Windows) != 1 || !d.Windows[0].Judged || d.Windows[0].Effect == nil || d.Windows[0].Effect.ENOSPC != 3 {
		t.Fatalf("expected one judged window with 3 ENOSPCs; found %+v", d.Windows)
	}
	for _, want := range []string{"ENOSPC returned under disk-full: n2 3", "fenced (exit 4): n2"} {
		if !strings.Contains(r.Summary, want) {
			t.Fatalf("summary %q: expected %q", r.Summary, want)
		}
	}
	// Room left, or appends into preallocated space let through: the
	// rule does not apply and says why.
	for params, why := range map[string]string{
		`{"disk_full":{"free_bytes":4096,"count_overwrites":true}}`: "4096 bytes left",
		`{"disk_full":{"free_bytes":0}}`:                            "overwrites not counted",
	} {
		var m map[string]any
		if err := json.Unmarshal([]byte(params), &m); err != nil {
			t.Fatal(err)
		}
		r := Fencing(diskFullOnN2(t, m, true).ops, NodeEvidence{})
		if r.Valid != Unknown || !strings.Contains(r.Summary, why) {
			t.Errorf("%s: expected unknown saying %q, found %s: %s", params, why, r.Valid, r.Summary)
		}
	}
}

// Regression: a node whose WAL writes and fsyncs are
// stalled must stop acknowledging; one that acks a write invoked under
// the stall and answered before the heal is named.
func TestFencingStalledNodeMustNotAck(t *testing.T) {
	stall := map[string]any{"slow_disk": []any{map[string]any{"ops": []string{"write", "fsync"}, "stall": true}}}
	for _, carry := range []bool{false, true} {
		h := newHist(t)
		h.at(time.Second)
		h.fault(fDisk, diskFault(t, diskStall, stall, "n2"))
		under := history.OK
		if !carry {
			under = history.Info // held until the heal: the client gave up
		}
		h.at(1500 * time.Millisecond)
		h.write(2, "w3", "n2", under, 12)
		h.write(3, "w4", "n1", history.OK, 13)
		h.at(3 * time.Second)
		h.heal(fDisk)
		r := Fencing(h.ops, NodeEvidence{})
		want := Valid
		if carry {
			want = Invalid
		}
		mustValid(t, r, want)
		if d := fencingDetails(t, r); len(d.Windows) != 1 || !d.Windows[0].Judged || d.Windows[0].Writes != 1 {
			t.Fatalf("carry %v: expected one judged window with n2's write; found %+v", carry, d.Windows)
		}
	}
	h := newHist(t)
	h.fault(fDisk, diskFault(t, diskStall, map[string]any{"slow_disk": []any{map[string]any{"ops": []string{"read"}, "stall": true}}}, "n2"))
	h.write(2, "w3", "n2", history.OK, 12)
	if r := Fencing(h.ops, NodeEvidence{}); r.Valid != Unknown || !strings.Contains(r.Summary, "no unbounded stall") {
		t.Fatalf("a stall of reads only: expected unknown saying why, found %s: %s", r.Valid, r.Summary)
	}
}

// Regression: a write sent to a stalled node and held
// until the heal released it (answered ok after the heal's invoke) is a
// write the node did not acknowledge under the fault: it exercises the
// rule. Before, such writes were not counted, and a stall window in which
// no client happened to time out left the checker unknown.
func TestFencingWriteHeldUntilTheHealCounts(t *testing.T) {
	stall := map[string]any{"slow_disk": []any{map[string]any{"ops": []string{"write", "fsync"}, "stall": true}}}
	h := newHist(t)
	h.at(time.Second)
	h.fault(fDisk, diskFault(t, diskStall, stall, "n2"))
	h.at(1500 * time.Millisecond)
	held := h.invoke(2, history.FWrite, history.WriteValue{Events: []history.Event{{ID: "w3", Entity: 1, Signal: "view"}}}, "n2")
	h.at(3 * time.Second)
	h.heal(fDisk)
	h.ack(held, 12, 2) // released by the heal
	r := Fencing(h.ops, NodeEvidence{})
	mustValid(t, r, Valid)
	if d := fencingDetails(t, r); len(d.Windows) != 1 || d.Windows[0].Writes != 1 || d.Windows[0].Refused != 1 || d.Windows[0].Acked != 0 {
		t.Fatalf("expected the held write counted as not acknowledged under the fault; found %+v", d.Windows)
	}
}

// healDisk heals a disk fault recording, as the nemesis does, what it did
// to each target while armed.
func (h *hist) healDisk(effect map[string]DiskEffect) {
	b, err := json.Marshal(map[string]any{"effect": effect})
	if err != nil {
		h.t.Fatal(err)
	}
	inv := h.invoke(history.Nemesis, history.HealOf(fDisk), nil, "")
	h.complete(inv, history.OK, history.FaultValue{Kind: diskCorruptRead, Params: b})
}

// corruptReadOnN2 is a corrupt-read on n2 that took effect (ok) and was
// healed recording reads corrupt reads on n2.
func corruptReadOnN2(t *testing.T, reads uint64) *hist {
	h := newHist(t)
	h.write(0, "w1", "n2", history.OK, 10)
	h.at(time.Second)
	h.fault(fDisk, diskFault(t, diskCorruptRead, map[string]any{"corrupt_read": []any{map[string]any{"path": "wal/*.wal"}}}, "n2"))
	h.at(3 * time.Second)
	h.healDisk(map[string]DiskEffect{"n2": {CorruptReads: reads}})
	h.write(1, "w2", "n2", history.OK, 11)
	return h
}

// A corrupt-read whose corrupt bytes were never read exercised nothing:
// the nemesis' ok is not enough.
func TestDiskFaultsAreJudgedByTheirEffect(t *testing.T) {
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3")}
	requested := []FaultKind{{Name: "corrupt-read", F: fDisk, Kind: diskCorruptRead}}
	t.Run("Regression: corrupt bytes never read", func(t *testing.T) {
		h := corruptReadOnN2(t, 0)
		f := Faults(h.ops, requested)
		mustValid(t, f, Unknown)
		if !strings.Contains(f.Summary, "corrupt-read not exercised") || !strings.Contains(f.Summary, "corrupt reads served while armed: n2 0") {
			t.Fatalf("faults summary should say corrupt-read was not exercised and why: %s", f.Summary)
		}
		r := Fencing(h.ops, ev)
		mustValid(t, r, Unknown)
		if d := fencingDetails(t, r); len(d.Windows) != 1 || d.Windows[0].Judged || !strings.Contains(d.Windows[0].Why, "no corrupt byte was read") {
			t.Fatalf("fencing: expected the window not judged, saying no corrupt byte was read; found %+v", d.Windows)
		}
	})
	t.Run("corrupt bytes read", func(t *testing.T) {
		h := corruptReadOnN2(t, 3)
		mustValid(t, Faults(h.ops, requested), Valid)
		mustValid(t, Fencing(h.ops, ev), Valid)
	})
	t.Run("healed by heal-all: the run's counters can say it did nothing", func(t *testing.T) {
		h := newHist(t)
		h.fault(fDisk, diskFault(t, diskCorruptRead, map[string]any{}, "n2"))
		h.complete(h.invoke(history.Nemesis, history.HealAll, nil, ""), history.OK, nil)
		mustValid(t, FaultsWithDisks(h.ops, requested, map[string]DiskEffect{"n2": {}}), Unknown)
		mustValid(t, FaultsWithDisks(h.ops, requested, map[string]DiskEffect{"n2": {CorruptReads: 1}}), Valid)
	})
	t.Run("a sticky fsync-error no fsync ran into", func(t *testing.T) {
		h := fsyncErrorOnN2(t, false)
		// Replace the heal's record: no fsync failed on n2.
		for i := range h.ops {
			op := &h.ops[i]
			if op.F == history.HealOf(fDisk) && op.Type == history.OK {
				b, _ := json.Marshal(map[string]any{"effect": map[string]DiskEffect{"n2": {}}})
				v, _ := json.Marshal(history.FaultValue{Kind: diskFsyncError, Params: b})
				op.Value = v
			}
		}
		r := Fencing(h.ops, ev)
		mustValid(t, r, Unknown)
		if !strings.Contains(r.Summary, "fsyncs failed while armed: n2 0") {
			t.Fatalf("fencing summary should say no fsync failed: %s", r.Summary)
		}
		f := Faults(h.ops, []FaultKind{{Name: "fsync-error", F: fDisk, Kind: diskFsyncError}})
		mustValid(t, f, Unknown)
	})
}

// A power cut that found nothing unsynced still cut a running node, which
// then recovered from its disk alone: exercised. (The quiet spell before a
// cut aims at exactly this, so that a recovery dropping the newest synced
// record shows.)
func TestPowerCutThatLostNothingIsExercised(t *testing.T) {
	cut := func(t *testing.T, bytes int64, report bool) *hist {
		h := newHist(t)
		inv := h.invoke(history.Nemesis, history.FPowerCut, history.FaultValue{Kind: "one", Targets: []string{"n2"}}, "")
		var params json.RawMessage
		if report {
			params, _ = json.Marshal(map[string]any{"reports": map[string]PowerCutLoss{"n2": {BytesDiscarded: bytes, ChangesUndone: int(bytes / 100)}}})
		}
		h.complete(inv, history.OK, history.FaultValue{Kind: "one", Targets: []string{"n2"}, Params: params})
		h.heal(history.FPowerCut)
		return h
	}
	requested := []FaultKind{{Name: "power-cut-one", F: history.FPowerCut, Kind: "one"}}
	// Regression: a quiet power cut judged not exercised. With the quiet
	// spell before every cut, one cut in a run that found nothing
	// unsynced made the whole run UNKNOWN.
	mustValid(t, Faults(cut(t, 0, true).ops, requested), Valid)
	mustValid(t, Faults(cut(t, 4096, true).ops, requested), Valid)
	// A cut that recorded no report (a store of an older harness) is
	// given the benefit of the doubt, as every unrecorded effect is.
	mustValid(t, Faults(cut(t, 0, false).ops, requested), Valid)
}
