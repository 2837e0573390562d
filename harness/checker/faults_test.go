package checker

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

var (
	isolateOne = FaultKind{Name: "isolate-one", F: history.FPartition, Kind: "isolate-one"}
	killOne    = FaultKind{Name: "kill-one", F: history.FKill, Kind: "one"}
	restartOne = FaultKind{Name: "restart-one", F: history.FRestart, Kind: "one", Instant: true}
)

// failedFault records a fault invoke that completed typ with an error.
func (h *hist) failedFault(f string, v history.FaultValue, typ history.Type, err string) {
	inv := h.invoke(history.Nemesis, f, v, "")
	op := history.Op{Process: history.Nemesis, Type: typ, F: f, Value: inv.Value, Error: err}
	h.push(op, nil)
}

func faultsDetails(t *testing.T, r Result) FaultsDetails {
	t.Helper()
	d, ok := r.Details.(FaultsDetails)
	if !ok {
		t.Fatalf("details are %T", r.Details)
	}
	return d
}

func TestFaultsEveryKindCycled(t *testing.T) {
	h := newHist(t)
	h.write(0, "w1", "n1", history.OK, 1)
	h.fault(history.FPartition, history.FaultValue{Kind: "isolate-one", Targets: []string{"n2"}})
	h.heal(history.FPartition)
	h.fault(history.FKill, history.FaultValue{Kind: "one", Targets: []string{"n3"}})
	h.fault(history.FRestart, history.FaultValue{Kind: "one", Targets: []string{"n1"}, Instant: true})
	h.complete(h.invoke(history.Nemesis, history.HealAll, nil, ""), history.OK, nil)
	r := Faults(h.ops, []FaultKind{isolateOne, killOne, restartOne})
	mustValid(t, r, Valid)
	d := faultsDetails(t, r)
	for _, o := range d.Kinds {
		if o.Invoked != 1 || o.TookEffect != 1 || o.Healed != 1 {
			t.Errorf("%s: %+v; want 1 invoked, took effect and healed", o.Name, o)
		}
	}
}

// Regression: a run in which every requested fault
// failed to inject was VALID — the nemesis dropped inject's result and no
// checker looked. Each requested kind needs an invoke that took effect
// and was healed, else the verdict is unknown, naming the kind.
func TestFaultsThatNeverTookEffectAreUnknown(t *testing.T) {
	h := newHist(t)
	h.write(0, "w1", "n1", history.OK, 1)
	v := history.FaultValue{Kind: "isolate-one", Targets: []string{"n2"}}
	h.failedFault(history.FPartition, v, history.Fail, "relay control: connection refused")
	h.failedFault(history.FPartition, v, history.Info, "relay control: timeout")
	h.fault(history.FKill, history.FaultValue{Kind: "one", Targets: []string{"n3"}})
	h.heal(history.FKill)
	r := Faults(h.ops, []FaultKind{isolateOne, killOne})
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "isolate-one never took effect") || !strings.Contains(r.Summary, "connection refused") {
		t.Fatalf("summary %q: want the kind that never took effect and why", r.Summary)
	}
	if strings.Contains(r.Summary, "kill-one never") {
		t.Fatalf("summary %q blames kill-one, which cycled", r.Summary)
	}
	d := faultsDetails(t, r)
	if o := d.Kinds[0]; o.Invoked != 2 || o.Failed != 1 || o.Unconfirmed != 1 || o.TookEffect != 0 {
		t.Fatalf("isolate-one outcome %+v", o)
	}
	// The info fault may be in effect: its window is open to the end.
	if len(d.Unhealed) != 1 || d.Unhealed[0].F != history.FPartition {
		t.Fatalf("unhealed %v; want the unconfirmed partition", d.Unhealed)
	}

	// A kind the schedule asked for that was never even invoked.
	mustValid(t, Faults(h.ops, []FaultKind{killOne, {Name: "pause-one", F: history.FPause, Kind: "one"}}), Unknown)
	// Nothing requested: nothing to vouch for.
	mustValid(t, Faults(h.ops, nil), Unknown)
}

// Regression: a heal-all that failed (the standalone
// relay's reset answered 500) must not close the fault windows: the fault
// took effect but was never healed, and that is unknown, not valid.
func TestFaultsHealThatFailedLeavesTheWindowOpen(t *testing.T) {
	h := newHist(t)
	h.fault(history.FPartition, history.FaultValue{Kind: "isolate-one", Targets: []string{"n2"}})
	h.at(2 * time.Second)
	heal := h.invoke(history.Nemesis, history.HealOf(history.FPartition), nil, "")
	h.push(history.Op{Process: history.Nemesis, Type: history.Info, F: heal.F, Error: "reset: 500 Internal Server Error"}, nil)
	all := h.invoke(history.Nemesis, history.HealAll, nil, "")
	h.push(history.Op{Process: history.Nemesis, Type: history.Info, F: all.F, Error: "relay mesh: reset: 500 Internal Server Error"}, nil)
	h.write(0, "w1", "n1", history.OK, 1)

	ws, err := FaultWindows(h.ops)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 || ws[0].Healed {
		t.Fatalf("windows %v: want the partition open", ws)
	}
	r := Faults(h.ops, []FaultKind{isolateOne})
	mustValid(t, r, Unknown)
	d := faultsDetails(t, r)
	if len(d.FailedHeals) != 2 || d.FailedHeals[1].F != history.HealAll || d.FailedHeals[1].Outcome != history.Info {
		t.Fatalf("failed heals %+v", d.FailedHeals)
	}
	if !strings.Contains(r.Summary, "never healed") || !strings.Contains(r.Summary, "500") {
		t.Fatalf("summary %q", r.Summary)
	}
	// Once a heal really happens, the window closes and the kind cycled.
	h.complete(h.invoke(history.Nemesis, history.HealAll, nil, ""), history.OK, nil)
	r = Faults(h.ops, []FaultKind{isolateOne})
	mustValid(t, r, Valid)
	if d := faultsDetails(t, r); !reflect.DeepEqual(d.Kinds[0].Healed, 1) {
		t.Fatalf("after a real heal: %+v", d.Kinds[0])
	}
}
