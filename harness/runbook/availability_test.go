package runbook

import (
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// hist builds a history from (ms, process, type, f) events, in order.
type hist struct {
	ops []history.Op
}

func (h *hist) add(ms int64, p history.Process, t history.Type, f string) *hist {
	h.ops = append(h.ops, history.Op{Index: int64(len(h.ops)), Time: ms * int64(time.Millisecond), Process: p, Type: t, F: f})
	return h
}

// sorted returns the ops in time order with indexes to match, as a
// recorder writes them (events are added per operation, not in time order).
func (h *hist) sorted() []history.Op {
	ops := append([]history.Op(nil), h.ops...)
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Time < ops[j].Time })
	for i := range ops {
		ops[i].Index = int64(i)
	}
	return ops
}

// write adds a write by process p invoked at from and completed at to.
func (h *hist) write(p history.Process, from, to int64, t history.Type) *hist {
	return h.add(from, p, history.Invoke, history.FWrite).add(to, p, t, history.FWrite)
}

func TestWriteOutagesOfAHealthyRun(t *testing.T) {
	// One client writing back to back: ok at 10, 20, 35, 50.
	h := (&hist{}).write(0, 0, 10, history.OK).write(0, 10, 20, history.OK).write(0, 20, 35, history.OK).write(0, 35, 50, history.OK)
	got := WriteOutages(h.sorted())
	if len(got) != 4 {
		t.Fatalf("found %d outages, expected 4 (one per gap between acks): %+v", len(got), got)
	}
	r := Availability(h.sorted(), 100*time.Millisecond, nil)
	d := r.Details.(AvailabilityDetails)
	if r.Valid != checker.Valid || d.Longest != 15*time.Millisecond {
		t.Fatalf("valid %s, longest %s: expected true and 15ms (%s)", r.Valid, d.Longest, r.Summary)
	}
}

// An outage longer than the budget makes the result false, and it names
// the outage and the step it fell in.
func TestAvailabilityOverBudgetIsFalse(t *testing.T) {
	h := &hist{}
	h.write(0, 0, 10, history.OK)
	h.add(100, history.Nemesis, history.Invoke, FStep)
	// From 10ms two clients keep failing until one write succeeds at 4010ms.
	h.write(0, 10, 1000, history.Info)
	h.write(1, 20, 30, history.Fail)
	h.write(1, 50, 60, history.Fail)
	h.add(2000, history.Nemesis, history.OK, FStep)
	h.write(2, 1000, 4010, history.OK)
	h.write(2, 4010, 4020, history.OK)
	steps := []checker.FaultWindow{{F: FStep, Kind: "Steps › 2. Stop the leader (line 40)", Start: 100 * int64(time.Millisecond), End: 2000 * int64(time.Millisecond), Healed: true}}
	r := Availability(h.sorted(), 3*time.Second, steps)
	d := r.Details.(AvailabilityDetails)
	if r.Valid != checker.Invalid {
		t.Fatalf("valid %s: expected false for a 4s outage against a 3s budget (%s)", r.Valid, r.Summary)
	}
	if d.Longest != 4*time.Second || d.OverBudget != 1 {
		t.Errorf("longest %s, over budget %d: expected 4s and 1", d.Longest, d.OverBudget)
	}
	w := d.Worst[0]
	if w.Attempts != 4 || w.Failed != 3 {
		t.Errorf("worst outage: %d attempts, %d failed: expected 4 and 3", w.Attempts, w.Failed)
	}
	if !strings.Contains(r.Summary, "Stop the leader") {
		t.Errorf("expected the summary to name the step the outage fell in: %s", r.Summary)
	}
	// The same history is within a 5s budget.
	if r := Availability(h.sorted(), 5*time.Second, steps); r.Valid != checker.Valid {
		t.Errorf("against 5s: valid %s, expected true (%s)", r.Valid, r.Summary)
	}
}

// Time when no client was trying to write is not unavailability: the
// outage starts at the first attempt after the last ack.
func TestWriteOutagesLeaveOutIdleTime(t *testing.T) {
	h := (&hist{}).write(0, 0, 10, history.OK).write(0, 5000, 5020, history.OK)
	r := Availability(h.sorted(), time.Second, nil)
	d := r.Details.(AvailabilityDetails)
	if r.Valid != checker.Valid || d.Longest != 20*time.Millisecond {
		t.Fatalf("valid %s, longest %s: expected true and 20ms (the idle 5s is not an outage)", r.Valid, d.Longest)
	}
}

// A write in flight when the last ack came keeps the clock running from
// that ack.
func TestWriteOutagesStartAtTheAckWhenAWriteIsInFlight(t *testing.T) {
	h := &hist{}
	h.add(0, 0, history.Invoke, history.FWrite)
	h.add(5, 1, history.Invoke, history.FWrite)
	h.add(10, 1, history.OK, history.FWrite)
	h.add(2010, 0, history.OK, history.FWrite)
	d := Availability(h.sorted(), time.Second, nil).Details.(AvailabilityDetails)
	if d.Longest != 2*time.Second {
		t.Fatalf("longest %s: expected 2s, from the ack at 10ms while process 0's write was in flight", d.Longest)
	}
}

// Writes that never succeed again make an open outage to the last write
// operation of the history.
func TestWriteOutagesOpenAtTheEnd(t *testing.T) {
	h := (&hist{}).write(0, 0, 10, history.OK).write(0, 20, 2020, history.Info).write(1, 2030, 4030, history.Info)
	h.add(9000, history.Nemesis, history.Invoke, history.HealAll)
	r := Availability(h.sorted(), 3*time.Second, nil)
	d := r.Details.(AvailabilityDetails)
	if r.Valid != checker.Invalid || !d.Worst[0].Open || d.Longest != 4010*time.Millisecond {
		t.Fatalf("valid %s, worst %+v: expected false and an open outage of 4.01s (nemesis ops do not extend it)", r.Valid, d.Worst[0])
	}
}

func TestAvailabilityWithoutWrites(t *testing.T) {
	if r := Availability(nil, time.Second, nil); r.Valid != checker.Unknown {
		t.Errorf("no history: valid %s, expected unknown", r.Valid)
	}
	h := (&hist{}).write(0, 0, 10, history.Fail).write(0, 20, 30, history.Fail)
	if r := Availability(h.sorted(), time.Second, nil); r.Valid != checker.Invalid {
		t.Errorf("no write ever succeeded: valid %s, expected false (%s)", r.Valid, r.Summary)
	}
	// Reads and embedding gets are not writes.
	h = (&hist{}).add(0, 0, history.Invoke, history.FRead).add(5000, 0, history.OK, history.FRead)
	if r := Availability(h.sorted(), time.Second, nil); r.Valid != checker.Unknown {
		t.Errorf("only reads: valid %s, expected unknown", r.Valid)
	}
}
