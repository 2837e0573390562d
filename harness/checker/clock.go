package checker

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// Clock faults. The nemesis records each moved clock
// (history.FClock, with history.ClockParams); ClockShifts turns the
// history into one shift per node and fault. The aggregates checker
// widens the stamps of events a shifted node may have stamped by its
// offset, and Clock checks the server's promise about clocks beyond the
// bound.

// ClockShift is one node's clock moved by a clock fault, in history time.
type ClockShift struct {
	Node     string `json:"node"`
	OffsetMS int64  `json:"offset_ms"` // the node's clock minus the true one
	BoundMS  int64  `json:"bound_ms"`  // --max-clock-skew the nodes ran with
	// Start is the fault's invoke: from then on the offset may be in effect.
	Start int64 `json:"start"`
	// Effective is when the nemesis saw the node run with it; -1 when it
	// never said.
	Effective int64 `json:"effective"`
	// HealStart is the invoke of the heal that ended it: up to then the
	// offset was certainly in effect (if Effective >= 0). End is that
	// heal's ok (or the history's end): up to then it may have been.
	HealStart int64 `json:"heal_start"`
	End       int64 `json:"end"`
	Healed    bool  `json:"healed"`
}

// Beyond reports whether the offset exceeds the bound.
func (s ClockShift) Beyond() bool { return abs64(s.OffsetMS) > s.BoundMS }

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// ClockShifts lists the clock shifts of a history, by start.
func ClockShifts(ops []history.Op) ([]ClockShift, error) {
	windows, of, heals, err := faultWindows(ops)
	if err != nil {
		return nil, err
	}
	var out []ClockShift
	for i, w := range windows {
		if w.F != history.FClock {
			continue
		}
		v, err := history.Decode[history.FaultValue](of[i].Invoke)
		if err != nil {
			return nil, err
		}
		var p history.ClockParams
		if err := json.Unmarshal(v.Params, &p); err != nil {
			return nil, fmt.Errorf("clock fault at %s: params %s: %w", history.FormatTime(w.Start), v.Params, err)
		}
		healStart := w.End
		if w.Healed {
			for _, h := range heals {
				if !h.Pending && h.Completion.Time == w.End && (h.Invoke.F == history.HealAll || h.Invoke.F == history.HealOf(history.FClock)) {
					healStart = h.Invoke.Time
					break
				}
			}
		}
		for _, n := range v.Targets {
			off, ok := p.OffsetsMS[n]
			if !ok {
				return nil, fmt.Errorf("clock fault at %s: expected an offset for target %s, found %v", history.FormatTime(w.Start), n, p.OffsetsMS)
			}
			out = append(out, ClockShift{Node: n, OffsetMS: off, BoundMS: p.BoundMS, Start: w.Start, Effective: w.Effective,
				HealStart: healStart, End: w.End, Healed: w.Healed})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	return out, nil
}

// offsetsDuring returns the least and greatest clock offset (ms) node may
// have run with at some time in [from, to]: 0 (the true clock) and every
// shift of it that may have been in effect then.
func offsetsDuring(shifts []ClockShift, node string, from, to int64) (lo, hi int64) {
	for _, s := range shifts {
		if s.Node == node && s.Start <= to && s.End >= from {
			lo, hi = min(lo, s.OffsetMS), max(hi, s.OffsetMS)
		}
	}
	return lo, hi
}

// ClockViolation is a write a node acknowledged while its clock was
// certainly beyond the bound.
type ClockViolation struct {
	Shift   ClockShift      `json:"shift"`
	F       string          `json:"f"`
	Process history.Process `json:"process"`
	Invoke  int64           `json:"invoke"` // op index
	Start   int64           `json:"start"`
	End     int64           `json:"end"`
}

// ClockDetails is the Details of a Clock result.
type ClockDetails struct {
	Shifts []ClockShift `json:"shifts"`
	// Judged counts the shifts beyond the bound that took effect, and
	// Refused the writes those nodes refused meanwhile (fail).
	Judged     int                       `json:"judged"`
	Writes     int                       `json:"writes"` // writes sent to them meanwhile
	Refused    int                       `json:"refused"`
	Violations Anomalies[ClockViolation] `json:"violations"`
}

// clockGated are the ops the server's clock guard admits or refuses.
var clockGated = map[string]bool{history.FWrite: true, history.FAdd: true, history.FPutEmbedding: true}

// Clock checks that a node whose clock is beyond --max-clock-skew takes
// no writes: every write sent to it after its shift took effect and
// answered before the heal was invoked must not be acknowledged. The
// node stamps the writes it takes with its own clock, so one it acked
// was stamped that far off (one event 2h ahead empties that key's 1h
// window on every node). The guard refuses from the moment the node's
// clock steps (tidal-server's clockguard.go), so there is no grace.
//
// Writes that overlap the fault's edges are not judged. Unknown when no
// shift beyond the bound was confirmed in effect; no result (false) for
// histories without a shift beyond the bound: the caller leaves the
// checker out then.
func Clock(ops []history.Op) (Result, bool) {
	const name = "clock"
	shifts, err := ClockShifts(ops)
	if err != nil {
		return unknown(name, "cannot derive clock shifts: %v", err), true
	}
	if !slices.ContainsFunc(shifts, ClockShift.Beyond) {
		// Nothing to refuse: no claim either way (the aggregates checker
		// judges the writes stamped by clocks within the bound).
		return Result{}, false
	}
	pairs, err := history.Pairs(ops)
	if err != nil {
		return unknown(name, "cannot pair the history: %v", err), true
	}
	d := ClockDetails{Shifts: shifts}
	for _, s := range shifts {
		if !s.Beyond() || s.Effective < 0 {
			continue
		}
		d.Judged++
		for _, p := range pairs {
			if !p.Invoke.Process.IsClient() || !clockGated[p.Invoke.F] || p.Invoke.Node != s.Node || p.Pending {
				continue
			}
			if p.Invoke.Time < s.Effective || p.Completion.Time > s.HealStart {
				continue
			}
			d.Writes++
			switch p.Type() {
			case history.Fail:
				d.Refused++
			case history.OK:
				d.Violations.add(func() ClockViolation {
					return ClockViolation{Shift: s, F: p.Invoke.F, Process: p.Invoke.Process, Invoke: p.Invoke.Index, Start: p.Invoke.Time, End: p.Completion.Time}
				})
			}
		}
	}
	switch {
	case d.Violations.Count > 0:
		v := d.Violations.Examples[0]
		return Result{Name: name, Valid: Invalid, Details: d, Summary: fmt.Sprintf(
			"%d writes acknowledged by nodes whose clock was beyond --max-clock-skew %v; first: %s at %s by %s, its clock off by %v",
			d.Violations.Count, millis(v.Shift.BoundMS), v.F, history.FormatTime(v.Start), v.Shift.Node, millis(v.Shift.OffsetMS))}, true
	case d.Judged == 0:
		return Result{Name: name, Valid: Unknown, Details: d, Summary: fmt.Sprintf(
			"no clock moved beyond --max-clock-skew took effect (%d shifts, none beyond and confirmed): nothing to judge", len(shifts))}, true
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: fmt.Sprintf(
		"%d clocks beyond --max-clock-skew took no writes: %d writes sent to them meanwhile, %d refused, none acknowledged", d.Judged, d.Writes, d.Refused)}, true
}

func millis(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
