package runbook

import (
	"fmt"
	"sort"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// Outage is a stretch of history time during which clients were trying to
// write and no write succeeded (checker.Outages over the writes).
type Outage = checker.Outage

// isWrite reports whether a client op writes: ledger writes, counter adds
// and embedding puts.
func isWrite(op history.Op) bool {
	return op.Process.IsClient() && (op.F == history.FWrite || op.F == history.FAdd || op.F == history.FPutEmbedding)
}

// WriteOutages returns every write outage of a history in time order
// (checker.Outages): the budget judges the longest.
func WriteOutages(ops []history.Op) []Outage { return checker.Outages(ops, isWrite) }

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
