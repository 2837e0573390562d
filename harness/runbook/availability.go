package runbook

import (
	"fmt"
	"sort"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// Outage is a stretch of history time during which clients were trying to
// write and no write succeeded: from the first moment after an
// acknowledged write (or the start) at which a write was in flight, to
// the next acknowledged write.
type Outage struct {
	Start int64 `json:"start"` // history ns
	End   int64 `json:"end"`
	// Attempts counts the writes invoked during the outage, and Failed
	// those of them that ended fail or info.
	Attempts int `json:"attempts"`
	Failed   int `json:"failed"`
	// Open: no write succeeded after it; it ends with the history's last
	// write operation.
	Open bool `json:"open,omitempty"`
	// During names the runbook steps (nemesis ops) that overlapped it.
	During []string `json:"during,omitempty"`
}

// Length is the outage's duration.
func (o Outage) Length() time.Duration { return time.Duration(o.End - o.Start) }

func (o Outage) String() string {
	s := fmt.Sprintf("%s from %s to %s (%d writes attempted, %d failed", o.Length().Round(time.Millisecond),
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

// isWrite reports whether a client op writes: ledger writes, counter adds
// and embedding puts.
func isWrite(op history.Op) bool {
	return op.Process.IsClient() && (op.F == history.FWrite || op.F == history.FAdd || op.F == history.FPutEmbedding)
}

// WriteOutages returns every outage of a history in time order. Between
// two acknowledged writes there is an outage only if some write was in
// flight in between, and it starts when the first one was (the time
// before it, when no client was trying, is not unavailability). A failed
// attempt keeps the outage going until a write succeeds: a client backing
// off between attempts is still waiting to write. Gaps between
// acknowledgements of a healthy cluster are outages too, of milliseconds;
// the budget judges the longest.
func WriteOutages(ops []history.Op) []Outage {
	var out []Outage
	pending := 0
	var cur *Outage
	var lastWrite int64
	for _, op := range ops {
		if !isWrite(op) {
			continue
		}
		lastWrite = op.Time
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
				// Writes still in flight: the next outage, if any, starts now.
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
		cur.End, cur.Open = lastWrite, true
		out = append(out, *cur)
	}
	return out
}

// AvailabilityDetails is the Details of an availability result.
type AvailabilityDetails struct {
	Budget time.Duration `json:"budget"`
	// Longest is the longest outage; Worst lists the longest few,
	// longest first.
	Longest time.Duration `json:"longest"`
	Worst   []Outage      `json:"worst,omitempty"`
	// OverBudget counts the outages longer than the budget.
	OverBudget int `json:"over_budget"`
	Writes     int `json:"writes"`
	Acked      int `json:"acked"`
}

// Availability judges a history against a page's availability budget:
// Invalid if writes were unavailable for longer than budget at any
// moment, Unknown if no write was ever attempted (nothing was measured).
// steps are the windows of the runbook's steps, to say which step an
// outage fell in.
func Availability(ops []history.Op, budget time.Duration, steps []checker.FaultWindow) checker.Result {
	const name = "availability"
	d := AvailabilityDetails{Budget: budget}
	for _, op := range ops {
		if isWrite(op) {
			switch op.Type {
			case history.Invoke:
				d.Writes++
			case history.OK:
				d.Acked++
			}
		}
	}
	if d.Writes == 0 {
		return checker.Result{Name: name, Valid: checker.Unknown, Details: d, Summary: "no write was attempted: availability was not measured"}
	}
	if d.Acked == 0 {
		return checker.Result{Name: name, Valid: checker.Invalid, Details: d, Summary: fmt.Sprintf("none of %d writes attempted succeeded", d.Writes)}
	}
	if budget <= 0 {
		return checker.Result{Name: name, Valid: checker.Unknown, Details: d, Summary: "no availability budget to judge against"}
	}
	outages := WriteOutages(ops)
	for i := range outages {
		for _, w := range steps {
			if w.Overlaps(outages[i].Start, outages[i].End) {
				outages[i].During = append(outages[i].During, w.Label())
			}
		}
		if outages[i].Length() > budget {
			d.OverBudget++
		}
	}
	sort.SliceStable(outages, func(i, j int) bool { return outages[i].Length() > outages[j].Length() })
	if len(outages) > 0 {
		d.Longest = outages[0].Length()
	}
	d.Worst = outages[:min(len(outages), 5)]
	if d.OverBudget > 0 {
		return checker.Result{Name: name, Valid: checker.Invalid, Details: d, Summary: fmt.Sprintf(
			"writes unavailable for %s, over the budget of %s (%d outages over it); longest: %s",
			d.Longest.Round(time.Millisecond), budget, d.OverBudget, d.Worst[0])}
	}
	return checker.Result{Name: name, Valid: checker.Valid, Details: d, Summary: fmt.Sprintf(
		"longest write outage %s, within the budget of %s (%d writes, %d acknowledged)",
		d.Longest.Round(time.Millisecond), budget, d.Writes, d.Acked)}
}
