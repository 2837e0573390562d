package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

var fenced = ExitStatus{Code: ExitFenced, Text: "exit status 4"}

// A history with fault f of kind on n2 from 1s, healed at 4s.
func diskFaultOn(t *testing.T, f, kind string) *hist {
	h := newHist(t)
	h.write(0, "w1", "n1", history.OK, 10)
	h.at(time.Second)
	h.fault(f, history.FaultValue{Kind: kind, Targets: []string{"n2"}})
	h.at(4 * time.Second)
	h.heal(f)
	return h
}

func exitAt(node string, at time.Duration, st ExitStatus, lines ...string) ProcessExit {
	e := ProcessExit{Node: node, PID: 20, Time: int64(at), Status: st}
	if len(lines) > 0 {
		e.Logs = []LogTail{{Path: "nodes/" + node + "/node.log", Lines: lines}}
	}
	return e
}

// A node that fences itself (exit 4) on fsync-error or
// disk-full is doing its job, not crashing.
func TestNodesFencedDuringFsyncErrorIsExpected(t *testing.T) {
	for _, kind := range []string{"fsync-error", "disk-full"} {
		h := diskFaultOn(t, history.FDisk, kind)
		ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
			Exits: []ProcessExit{exitAt("n2", 2*time.Second, fenced)}}
		r := Nodes(h.ops, ev)
		mustValid(t, r, Valid)
		d := nodesDetails(t, r)
		if d.Expected != 1 || len(d.DiskExits) != 1 || !strings.Contains(r.Summary, "fenced itself") || !strings.Contains(r.Summary, kind) {
			t.Fatalf("%s: expected the fenced exit accepted and named, found %+v: %s", kind, d, r.Summary)
		}
	}
}

// The same exit with no disk fault on that node is a crash, and says so.
func TestNodesFencedWithoutADiskFaultIsACrash(t *testing.T) {
	cases := map[string]struct {
		h    *hist
		exit ProcessExit
	}{
		"no fault at all":           {killAndRestart(t), exitAt("n2", 2*time.Second, fenced)},
		"fault on another node":     {diskFaultOn(t, history.FDisk, "fsync-error"), exitAt("n3", 2*time.Second, fenced)},
		"slow-disk does not fence":  {diskFaultOn(t, history.FDisk, "slow-disk"), exitAt("n2", 2*time.Second, fenced)},
		"long after the heal":       {diskFaultOn(t, history.FDisk, "fsync-error"), exitAt("n2", 10*time.Second, fenced)},
		"other status during fault": {diskFaultOn(t, history.FDisk, "fsync-error"), exitAt("n2", 2*time.Second, ExitStatus{Code: 1, Text: "exit status 1"})},
	}
	for name, c := range cases {
		ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"), Exits: []ProcessExit{c.exit}}
		r := Nodes(c.h.ops, ev)
		if r.Valid != Invalid {
			t.Errorf("%s: expected invalid, found %s: %s", name, r.Valid, r.Summary)
		}
	}
	r := Nodes(killAndRestart(t).ops, NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{exitAt("n2", 2*time.Second, fenced)}})
	if !strings.Contains(r.Summary, "fenced itself (exit status 4) with no fsync-error or disk-full on it outstanding") {
		t.Fatalf("summary should say it fenced with no fault outstanding: %s", r.Summary)
	}
}

// A node that fences again within the same fault was restarted into the
// same failure: the first exit is the fault's, the second a crash loop.
func TestNodesSecondFenceInOneFaultIsACrashLoop(t *testing.T) {
	h := diskFaultOn(t, history.FDisk, "fsync-error")
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{exitAt("n2", 2*time.Second, fenced), exitAt("n2", 3*time.Second, fenced)}}
	r := Nodes(h.ops, ev)
	mustValid(t, r, Invalid)
	d := nodesDetails(t, r)
	if len(d.Crashes) != 1 || !strings.Contains(d.Crashes[0].Reason, "crash loop") || len(d.CrashLoops) != 1 || !strings.Contains(r.Summary, "crash loop: n2 exited on its own 2 times") {
		t.Fatalf("expected one crash-loop crash of n2, found %+v: %s", d, r.Summary)
	}
}

// corrupt-read: refusing the log, naming file and offset, is expected; an
// exit that does not say so is a crash.
func TestNodesCorruptReadRefusalNeedsFileAndOffset(t *testing.T) {
	h := diskFaultOn(t, history.FDisk, "corrupt-read")
	one := ExitStatus{Code: 1, Text: "exit status 1"}
	refusal := `{"level":"ERROR","msg":"start failed","err":"open wal: wal: corruption in /d/wal/0000000000000000.wal at offset 0: bad crc"}`
	ok := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{exitAt("n2", 2*time.Second, one, refusal)}}
	mustValid(t, Nodes(h.ops, ok), Valid)
	bad := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{exitAt("n2", 2*time.Second, one, "error: apply: unexpected EOF")}}
	mustValid(t, Nodes(h.ops, bad), Invalid)
}

// Power cuts kill through the harness: the exits are asked for, and the
// node's start after the heal is its own business.
func TestNodesPowerCutKillsAreExpected(t *testing.T) {
	h := newHist(t)
	h.at(time.Second)
	h.fault(history.FPowerCut, history.FaultValue{Kind: "all", Targets: []string{"n1", "n2", "n3"}})
	h.at(3 * time.Second)
	h.heal(history.FPowerCut)
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"), Exits: []ProcessExit{
		{Node: "n1", Time: int64(time.Second), Requested: true, Status: killed},
		{Node: "n2", Time: int64(time.Second), Requested: true, Status: killed},
		{Node: "n3", Time: int64(time.Second), Requested: true, Status: killed},
	}}
	mustValid(t, Nodes(h.ops, ev), Valid)
	// A node that cannot start on what the power cut left is a crash.
	ev.Exits = append(ev.Exits, exitAt("n3", 3500*time.Millisecond, ExitStatus{Code: 1, Text: "exit status 1"}, "error: wal: corruption in wal/0.wal at offset 4096"))
	mustValid(t, Nodes(h.ops, ev), Invalid)
}

// After a power cut with out-of-order pages, a node that refuses its log
// naming file and offset — at every start, since the damage stays — and
// is down at the end is the outcome docs/ARCHITECTURE.md allows, reported
// as such; the same refusal after an in-order cut is a crash.
func TestNodesRefusalAfterOutOfOrderPowerCut(t *testing.T) {
	refusal := `{"level":"ERROR","msg":"start failed","err":"open wal: wal: corruption in /d/wal/0000000000000000.wal at offset 45809: record header is all zeroes; 1 valid record(s) follow from offset 50387, so this is not a torn tail"}`
	exit1 := ExitStatus{Code: 1, Text: "exit status 1"}
	final := []NodeFinal{{Node: "n1", State: "running", Alive: true, Serving: true}, {Node: "n2", State: "running", Alive: false},
		{Node: "n3", State: "running", Alive: true, Serving: true}}
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: final,
		Exits: []ProcessExit{exitAt("n2", 4100*time.Millisecond, exit1, refusal), exitAt("n2", 9*time.Second, exit1, refusal)}}

	r := Nodes(diskFaultOn(t, history.FPowerCut, ReorderCut).ops, ev)
	mustValid(t, r, Valid)
	if d := nodesDetails(t, r); d.Refused["n2"] == "" ||
		!strings.Contains(r.Summary, "n2 refused to start after a power cut with out-of-order pages: corruption in /d/wal/0000000000000000.wal at offset 45809") {
		t.Fatalf("expected n2's refusal named as the allowed outcome, found %+v: %s", d.Refused, r.Summary)
	}

	r = Nodes(diskFaultOn(t, history.FPowerCut, "one").ops, ev)
	mustValid(t, r, Invalid)
}
