package runbook

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// lossHistory: three writes, each by its own process. "before" was
// acknowledged at index 10 (at or below the survivor's applied index 15),
// "only-lost" at index 20 before the quorum was lost at 2.5s, "after" at
// index 25 by the new cluster at 3s.
func lossHistory(t *testing.T) []history.Op {
	t.Helper()
	var ops []history.Op
	add := func(proc int, id string, seq uint64, at time.Duration) {
		v, err := json.Marshal(history.WriteValue{Events: []history.Event{{ID: id, Entity: 1, Signal: "view"}}})
		if err != nil {
			t.Fatal(err)
		}
		p := history.Process(proc)
		ops = append(ops,
			history.Op{Index: int64(len(ops)), Time: int64(at - 100*time.Millisecond), Process: p, Type: history.Invoke, F: history.FWrite, Value: v, Node: "n1"},
			history.Op{Index: int64(len(ops) + 1), Time: int64(at), Process: p, Type: history.OK, F: history.FWrite, Value: v, Node: "n1", Seq: seq, Term: 2})
	}
	add(0, "before", 10, time.Second)
	add(1, "only-lost", 20, 2*time.Second)
	add(2, "after", 25, 3*time.Second)
	return ops
}

func ledgerOf(t *testing.T, ops []history.Op, present ...string) checker.Result {
	t.Helper()
	var audit []checker.AuditEntry
	for i, id := range present {
		audit = append(audit, checker.AuditEntry{ID: id, Index: uint64(10 + i), Term: 2, Entity: 1, Signal: "view"})
	}
	return checker.LedgerCovering(ops, map[string][]checker.AuditEntry{"n1": audit}, map[string]uint64{"n1": 100}, checker.Coverage{Nodes: []string{"n1"}})
}

// The quorum-loss page may lose exactly the writes acknowledged at log
// indexes above the survivor's applied index before the quorum was lost:
// the ledger accepts those absent, and still says false for any other
// acknowledged write that is lost, and for a stated-lost write that is
// found after all (the bound measured wrong).
func TestStatedLossIsJudgedByTheLedger(t *testing.T) {
	start := time.Now()
	bound := LossBound{Applied: 15, At: start.Add(2500 * time.Millisecond), Survivor: "n2"}
	ops := lossHistory(t)

	if r := ledgerOf(t, ops, "before", "after"); r.Valid != checker.Invalid {
		t.Fatalf("without the stated loss the ledger should say false for the missing write: %s %s", r.Valid, r.Summary)
	}

	judged, loss := applyStatedLoss(ops, bound, start)
	d, _ := loss.Details.(LossDetails)
	if loss.Valid != checker.Valid || d.Lost != 1 || d.Events != 1 || len(d.IDs) != 1 || d.IDs[0] != "only-lost" {
		t.Fatalf("stated loss: %s %+v (%s); expected the one write at index 20 acknowledged before 2.5s", loss.Valid, d, loss.Summary)
	}
	if ops[3].Type != history.OK {
		t.Fatal("applyStatedLoss changed the history it was given")
	}

	if r := ledgerOf(t, judged, "before", "after"); r.Valid != checker.Valid {
		t.Errorf("the stated loss and nothing else lost: %s %s; expected true", r.Valid, r.Summary)
	}
	if r := ledgerOf(t, judged, "after"); r.Valid != checker.Invalid {
		t.Errorf("a write at index 10 (within the survivor's applied index) lost: %s %s; expected false", r.Valid, r.Summary)
	}
	if r := ledgerOf(t, judged, "before"); r.Valid != checker.Invalid {
		t.Errorf("a write the new cluster acknowledged lost: %s %s; expected false", r.Valid, r.Summary)
	}
	if r := ledgerOf(t, judged, "before", "only-lost", "after"); r.Valid != checker.Invalid {
		t.Errorf("a write stated lost found after all: %s %s; expected false (the bound was measured wrong)", r.Valid, r.Summary)
	}

	if _, r := applyStatedLoss(ops, LossBound{At: bound.At}, start); r.Valid != checker.Unknown {
		t.Errorf("an unmeasured bound: %s %s; expected unknown", r.Valid, r.Summary)
	}
}
