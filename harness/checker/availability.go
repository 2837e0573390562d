package checker

import (
	"fmt"
	"sort"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// Outage is a stretch of history time during which clients were trying
// and none of their ops succeeded: from the first moment after an ok op
// (or the start) at which an op was in flight, to the next ok op.
type Outage struct {
	Start int64 `json:"start"` // history ns
	End   int64 `json:"end"`
	// Attempts counts the ops invoked during the outage, and Failed
	// those of them that ended fail or info.
	Attempts int `json:"attempts"`
	Failed   int `json:"failed"`
	// Open: no op succeeded after it; it ends with the history's last op
	// of the kind measured.
	Open bool `json:"open,omitempty"`
	// During names the windows (faults, runbook steps) that overlapped it.
	During []string `json:"during,omitempty"`
}

// Length is the outage's duration.
func (o Outage) Length() time.Duration { return time.Duration(o.End - o.Start) }

func (o Outage) String() string {
	s := fmt.Sprintf("%s from %s to %s (%d attempted, %d failed", o.Length().Round(time.Millisecond),
		history.FormatTime(o.Start), history.FormatTime(o.End), o.Attempts, o.Failed)
	if o.Open {
		s += ", none succeeded after it"
	}
	s += ")"
	if len(o.During) > 0 {
		s += fmt.Sprintf(" during %q", o.During)
	}
	return s
}

// Outages returns every outage of the ops that measure says count, in time
// order. Between two ok ops there is an outage only if some op was in
// flight in between, and it starts when the first one was (the time
// before it, when no client was trying, is not unavailability). A failed
// attempt keeps the outage going until an op succeeds: a client backing
// off between attempts is still waiting. Gaps between the ok ops of a
// healthy cluster are outages too, of milliseconds; callers judge the
// long ones.
func Outages(ops []history.Op, measure func(history.Op) bool) []Outage {
	var out []Outage
	pending := 0
	var cur *Outage
	var last int64
	for _, op := range ops {
		if !measure(op) {
			continue
		}
		last = op.Time
		switch {
		case op.Type == history.Invoke:
			if cur == nil {
				cur = &Outage{Start: op.Time}
			}
			cur.Attempts++
			pending++
		case op.Type == history.OK:
			pending--
			if cur != nil {
				cur.End = op.Time
				out = append(out, *cur)
			}
			cur = nil
			if pending > 0 {
				// Ops still in flight: the next outage, if any, starts now.
				cur = &Outage{Start: op.Time}
			}
		case op.Type.IsCompletion():
			pending--
			if cur != nil {
				cur.Failed++
			}
		}
	}
	if cur != nil {
		cur.End, cur.Open = last, true
		out = append(out, *cur)
	}
	return out
}

// AvailabilitySLO bounds how long clients may go without an ok op.
type AvailabilitySLO struct {
	// Stall bounds a stretch without an ok op that began while no fault
	// was in effect, up to the first fault that overlaps it (if any): a
	// healthy cluster under load does not stop serving on its own.
	Stall time.Duration `json:"stall"`
	// Recovery bounds, within one stretch without an ok op, the time
	// outside fault windows after the first fault of the stretch began:
	// the time the cluster had, fault-free, to serve again after a heal.
	// It is summed over the gaps between faults, so a cluster that never
	// recovers while faults keep coming (each heal followed by the next
	// fault within seconds) is caught too, once the gaps add up.
	Recovery time.Duration `json:"recovery"`
}

// DefaultAvailabilitySLO: stalls ≤ 10 s outside faults, ≤ 15 s of
// fault-free time to recover after a heal (an election, a restarted
// node's replay, a client's retry backoff, on a loaded machine).
func DefaultAvailabilitySLO() AvailabilitySLO {
	return AvailabilitySLO{Stall: 10 * time.Second, Recovery: 15 * time.Second}
}

func (s AvailabilitySLO) withDefaults() AvailabilitySLO {
	def := DefaultAvailabilitySLO()
	if s.Stall <= 0 {
		s.Stall = def.Stall
	}
	if s.Recovery <= 0 {
		s.Recovery = def.Recovery
	}
	return s
}

// Unavailable is one outage the availability checker judged: one that
// broke a bound, or one it could not decide.
type Unavailable struct {
	Outage Outage `json:"outage"`
	// Stall is the outage's time before the first fault that overlaps it
	// (all of it if none does); FaultFree is its time outside every fault
	// window after that fault began.
	Stall     time.Duration `json:"stall"`
	FaultFree time.Duration `json:"fault_free"`
	// Heal is the first heal inside the outage ("partition(halves) at
	// 12.3s"), when there is one.
	Heal string `json:"heal,omitempty"`
	// Why says which bound it broke, or why it is undecided.
	Why string `json:"why"`
}

// AvailabilityDetails is the Details of an availability result.
type AvailabilityDetails struct {
	SLO AvailabilitySLO `json:"slo"`
	// Attempted and OK count client ops.
	Attempted int `json:"attempted"`
	OK        int `json:"ok"`
	// Longest is the longest outage, whatever faults it overlapped.
	Longest    Outage        `json:"longest"`
	Violations []Unavailable `json:"violations,omitempty"`
	// Undecided: the workload ended inside an outage longer than the stall
	// bound that broke neither bound (its fault-free time within the
	// recovery bound, or a fault still in effect): whether the cluster
	// would have served again is not in the history.
	Undecided []Unavailable `json:"undecided,omitempty"`
}

// Availability judges whether clients were served, from the history and
// its fault windows (FaultWindows): every client op counts, reads too,
// and an ok op of any kind ends an outage (Outages). For each outage:
//
//   - its stall, the time before the first fault window that overlaps it
//     (all of it when none does), must be at most slo.Stall;
//   - its fault-free time after that window began, summed over the gaps
//     between the windows it overlaps, must be at most slo.Recovery.
//
// Invalid if an outage breaks a bound, naming it and the first heal in
// it. Unknown when no client op was attempted, when none ever succeeded
// in a history too short to break a bound, or when the workload ended
// in an outage longer than slo.Stall that broke neither bound: its
// recovery was cut short, or a fault was still in effect (a heal that
// failed keeps a window open; the final heal comes after the clients
// stop). An outage that ends in an ok op while covered by fault windows
// is excused however long: the faults may have been the cause. Zero
// fields of slo take DefaultAvailabilitySLO's values.
func Availability(ops []history.Op, faults []FaultWindow, slo AvailabilitySLO) Result {
	const name = "availability"
	slo = slo.withDefaults()
	d := AvailabilityDetails{SLO: slo}
	client := func(op history.Op) bool { return op.Process.IsClient() }
	for _, op := range ops {
		if client(op) {
			switch op.Type {
			case history.Invoke:
				d.Attempted++
			case history.OK:
				d.OK++
			}
		}
	}
	if d.Attempted == 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no client op was attempted: availability was not measured"}
	}
	faults = append([]FaultWindow(nil), faults...)
	sort.SliceStable(faults, func(i, j int) bool { return faults[i].Start < faults[j].Start })

	for _, o := range Outages(ops, client) {
		if o.Length() > d.Longest.Length() {
			d.Longest = o
		}
		if o.Length() <= min(slo.Stall, slo.Recovery) {
			continue // within both bounds whatever the faults did
		}
		u := judgeOutage(o, faults)
		switch {
		case u.Stall > slo.Stall:
			u.Why = fmt.Sprintf("no ok op for %s before any fault, over the stall bound of %s", u.Stall.Round(time.Millisecond), slo.Stall)
			d.Violations = append(d.Violations, u)
		case u.FaultFree > slo.Recovery:
			u.Why = fmt.Sprintf("no ok op for %s outside fault windows after the first fault began, over the recovery bound of %s", u.FaultFree.Round(time.Millisecond), slo.Recovery)
			if u.Heal != "" {
				u.Why += "; first heal: " + u.Heal
			}
			d.Violations = append(d.Violations, u)
		case o.Open && o.Length() > slo.Stall:
			// Whether the cluster would have served again is not in the
			// history: after a heal (and before the recovery bound ran
			// out), or under a fault not healed while the clients ran.
			u.Why = fmt.Sprintf("the workload ended %s into it (%s of it outside fault windows after the first fault began): recovery not observed",
				o.Length().Round(time.Millisecond), u.FaultFree.Round(time.Millisecond))
			d.Undecided = append(d.Undecided, u)
		}
	}
	if n := len(d.Violations); n > 0 {
		v := d.Violations[0]
		return Result{Name: name, Valid: Invalid, Details: d, Summary: fmt.Sprintf(
			"%d outage(s) over the bounds (stall %s, recovery %s); first: %s: %s", n, slo.Stall, slo.Recovery, v.Outage, v.Why)}
	}
	s := fmt.Sprintf("longest stretch without an ok op %s (%d ops attempted, %d ok; bounds: stall %s, recovery %s)",
		d.Longest.Length().Round(time.Millisecond), d.Attempted, d.OK, slo.Stall, slo.Recovery)
	if d.OK == 0 {
		s = fmt.Sprintf("none of %d ops attempted succeeded, within the bounds (stall %s, recovery %s): the run was too short to judge", d.Attempted, slo.Stall, slo.Recovery)
		return Result{Name: name, Valid: Unknown, Details: d, Summary: s}
	}
	if len(d.Undecided) > 0 {
		u := d.Undecided[0]
		return Result{Name: name, Valid: Unknown, Details: d, Summary: s + "; undecided: " + u.Outage.String() + ": " + u.Why}
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: s}
}

// judgeOutage measures o against the fault windows: its stall, its
// fault-free time after the first fault began, the first heal in it, and
// the faults it overlapped (o.During).
func judgeOutage(o Outage, faults []FaultWindow) Unavailable {
	u := Unavailable{Outage: o}
	var over []FaultWindow
	for _, w := range faults {
		if w.Overlaps(o.Start, o.End) {
			over = append(over, w)
		}
	}
	if len(over) == 0 {
		u.Stall = o.Length()
		return u
	}
	u.Outage.During = labelCounts(over)
	from := max(o.Start, over[0].Start) // over is ordered by start
	u.Stall = time.Duration(from - o.Start)
	// Walk the union of the windows from `from`, adding up the gaps.
	covered := from
	healAt := int64(-1)
	for _, w := range over {
		if w.Start > covered {
			u.FaultFree += time.Duration(w.Start - covered)
		}
		covered = max(covered, w.End)
		if w.Healed && w.End > o.Start && w.End <= o.End && (healAt < 0 || w.End < healAt) {
			healAt = w.End
			u.Heal = fmt.Sprintf("%s at %s", w.Label(), history.FormatTime(w.End))
		}
	}
	if o.End > covered {
		u.FaultFree += time.Duration(o.End - covered)
	}
	return u
}

// labelCounts names windows by label, in order of first appearance, with
// a count for repeats: "partition(halves) ×12".
func labelCounts(ws []FaultWindow) []string {
	counts := map[string]int{}
	var order []string
	for _, w := range ws {
		l := w.Label()
		if counts[l] == 0 {
			order = append(order, l)
		}
		counts[l]++
	}
	out := make([]string, len(order))
	for i, l := range order {
		out[i] = l
		if counts[l] > 1 {
			out[i] = fmt.Sprintf("%s ×%d", l, counts[l])
		}
	}
	return out
}
