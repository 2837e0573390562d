package checker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// served simulates one client writing every 100 ms until end, each write
// ok unless down says the cluster was not serving then (the write fails),
// with partition faults in effect over the given [start, heal] spans.
func served(t *testing.T, end time.Duration, down func(time.Duration) bool, faults ...[2]time.Duration) []history.Op {
	t.Helper()
	h := newHist(t)
	type event struct {
		at   time.Duration
		heal bool
	}
	var events []event
	for _, f := range faults {
		events = append(events, event{at: f[0]}, event{at: f[1], heal: true})
	}
	id := 0
	for now := time.Duration(0); now <= end; now += 100 * time.Millisecond {
		for len(events) > 0 && events[0].at <= now {
			e := events[0]
			events = events[1:]
			h.at(max(e.at, time.Duration(h.now)))
			if e.heal {
				h.heal(history.FPartition)
			} else {
				h.fault(history.FPartition, history.FaultValue{Kind: "halves", Targets: []string{"n1"}})
			}
		}
		h.at(max(now, time.Duration(h.now)))
		id++
		typ := history.OK
		if down(now) {
			typ = history.Fail
		}
		h.write(0, fmt.Sprintf("w%d", id), "n1", typ, uint64(id))
	}
	return h.ops
}

func between(from, to time.Duration) func(time.Duration) bool {
	return func(t time.Duration) bool { return t >= from && t < to }
}

func availabilityDetails(t *testing.T, r Result) AvailabilityDetails {
	t.Helper()
	d, ok := r.Details.(AvailabilityDetails)
	if !ok {
		t.Fatalf("details are %T", r.Details)
	}
	return d
}

// judge runs the availability checker over ops with their own fault windows.
func judge(t *testing.T, ops []history.Op, slo AvailabilitySLO) Result {
	t.Helper()
	windows, err := FaultWindows(ops)
	if err != nil {
		t.Fatal(err)
	}
	return Availability(ops, windows, slo)
}

// Regression (docs/findings.md, etcd campaign run 4: etcd runs had no
// availability check): a cluster that stopped serving at 10 s
// while partitions came and went every 4 s (held 3.5 s) served nothing
// for the rest of the run, and the run was VALID. Each gap between faults
// is short, but they add up to more fault-free time than a recovery takes.
func TestAvailabilityNeverRecoveredUnderRepeatedFaults(t *testing.T) {
	var faults [][2]time.Duration
	for s := 10 * time.Second; s < 170*time.Second; s += 4 * time.Second {
		faults = append(faults, [2]time.Duration{s, s + 3500*time.Millisecond})
	}
	stuck := served(t, 180*time.Second, between(10*time.Second, time.Hour), faults...)
	r := judge(t, stuck, AvailabilitySLO{})
	mustValid(t, r, Invalid)
	t.Log(r.Summary)
	d := availabilityDetails(t, r)
	if len(d.Violations) != 1 {
		t.Fatalf("violations %+v", d.Violations)
	}
	v := d.Violations[0]
	if v.Outage.Start < int64(10*time.Second) || v.Outage.Start > int64(10100*time.Millisecond) || !v.Outage.Open || v.FaultFree < 15*time.Second || v.FaultFree > 40*time.Second {
		t.Fatalf("violation %+v", v)
	}
	for _, want := range []string{"from 10.0", "recovery bound of 15s", "first heal: partition(halves) at 13.5", "partition(halves) ×40"} {
		if !strings.Contains(r.Summary, want) {
			t.Errorf("summary lacks %q: %s", want, r.Summary)
		}
	}

	// Mutated: the same faults, the cluster serving again 1 s after each
	// heal (and during each fault after the first second): valid.
	recovering := func(t time.Duration) bool {
		if t < 10*time.Second || t >= 170*time.Second {
			return false
		}
		return (t-10*time.Second)%(4*time.Second) < time.Second
	}
	r = judge(t, served(t, 180*time.Second, recovering, faults...), AvailabilitySLO{})
	mustValid(t, r, Valid)
	if d := availabilityDetails(t, r); d.Longest.Length() > 2*time.Second {
		t.Fatalf("longest outage %s", d.Longest)
	}
	// The bounds are the configuration's: bounds longer than the run let
	// the stuck run pass.
	mustValid(t, judge(t, stuck, AvailabilitySLO{Recovery: time.Hour, Stall: time.Hour}), Valid)
}

func TestAvailabilityRecoveryAfterOneHeal(t *testing.T) {
	fault := [2]time.Duration{10 * time.Second, 14 * time.Second}
	// Serving again 3 s after the heal: valid.
	mustValid(t, judge(t, served(t, 60*time.Second, between(10*time.Second, 17*time.Second), fault), AvailabilitySLO{}), Valid)
	// 20 s after it: invalid, naming the heal.
	r := judge(t, served(t, 60*time.Second, between(10*time.Second, 34*time.Second), fault), AvailabilitySLO{})
	mustValid(t, r, Invalid)
	if !strings.Contains(r.Summary, "first heal: partition(halves) at 14.0") || !strings.Contains(r.Summary, "no ok op for 20s outside fault windows") {
		t.Fatalf("summary %s", r.Summary)
	}
	// The same with a 30 s recovery bound: valid.
	mustValid(t, judge(t, served(t, 60*time.Second, between(10*time.Second, 34*time.Second), fault), AvailabilitySLO{Recovery: 30 * time.Second}), Valid)
}

func TestAvailabilityStallWithoutFaults(t *testing.T) {
	mustValid(t, judge(t, served(t, 60*time.Second, between(20*time.Second, 25*time.Second)), AvailabilitySLO{}), Valid)
	r := judge(t, served(t, 60*time.Second, between(20*time.Second, 32*time.Second)), AvailabilitySLO{})
	mustValid(t, r, Invalid)
	if !strings.Contains(r.Summary, "before any fault, over the stall bound of 10s") || !strings.Contains(r.Summary, "from 20.0") {
		t.Fatalf("summary %s", r.Summary)
	}
	// A stall that a fault then overlaps is still a stall up to the fault.
	r = judge(t, served(t, 60*time.Second, between(20*time.Second, 40*time.Second), [2]time.Duration{35 * time.Second, 36 * time.Second}), AvailabilitySLO{})
	mustValid(t, r, Invalid)
	if v := availabilityDetails(t, r).Violations[0]; v.Stall < 14*time.Second || v.Stall > 15*time.Second {
		t.Fatalf("stall %s", v.Stall)
	}
}

func TestAvailabilityUndecidedAndUnmeasured(t *testing.T) {
	// The workload ends 8 s after a heal, 13 s into an outage: neither
	// recovered nor over the bound.
	r := judge(t, served(t, 60*time.Second, between(47*time.Second, time.Hour), [2]time.Duration{47 * time.Second, 52 * time.Second}), AvailabilitySLO{})
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "recovery not observed") {
		t.Fatalf("summary %s", r.Summary)
	}
	// Nor is one under a fault to the end: the fault was never healed
	// while the clients ran (the final heal comes after them, or a heal
	// failed and the fault may still be in effect).
	r = judge(t, served(t, 60*time.Second, between(47*time.Second, time.Hour), [2]time.Duration{47 * time.Second, 61 * time.Second}), AvailabilitySLO{})
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "the workload ended 12.9") {
		t.Fatalf("summary %s", r.Summary)
	}
	// An open outage within the stall bound is the ops in flight at the
	// end of any run.
	mustValid(t, judge(t, served(t, 60*time.Second, between(55*time.Second, time.Hour), [2]time.Duration{55 * time.Second, 61 * time.Second}), AvailabilitySLO{}), Valid)
	// An outage that ended in an ok op, covered by one long fault, is
	// excused: the fault may have been its cause.
	mustValid(t, judge(t, served(t, 60*time.Second, between(20*time.Second, 45*time.Second), [2]time.Duration{20 * time.Second, 45 * time.Second}), AvailabilitySLO{}), Valid)
	mustValid(t, Availability(nil, nil, AvailabilitySLO{}), Unknown)
	// Nothing ever succeeded, in a run shorter than the bounds.
	mustValid(t, judge(t, served(t, 5*time.Second, between(0, time.Hour)), AvailabilitySLO{}), Unknown)
	// Nothing ever succeeded, for longer than a stall.
	mustValid(t, judge(t, served(t, 30*time.Second, between(0, time.Hour)), AvailabilitySLO{}), Invalid)
}
