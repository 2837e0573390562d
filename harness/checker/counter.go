package checker

import (
	"fmt"
	"sort"

	"github.com/tidaldb/tidal/harness/history"
)

// CounterViolation is an ok read outside what the adds allow.
type CounterViolation struct {
	Key     uint64          `json:"key"`
	Value   int64           `json:"value"`
	Lower   int64           `json:"lower"` // from adds acknowledged before the read began
	Upper   int64           `json:"upper"` // from adds not known to have failed, begun before the read ended
	Process history.Process `json:"process"`
	Node    string          `json:"node"`
	Invoke  int64           `json:"invoke"` // op index
	Start   int64           `json:"start"`  // history time of the invoke
	End     int64           `json:"end"`    // history time of the ok
	Faults  []FaultWindow   `json:"faults,omitempty"`
}

// CounterDetails is the Details of a Counter result.
type CounterDetails struct {
	Keys       int                         `json:"keys"`
	Reads      int                         `json:"reads"` // ok reads checked
	Adds       map[history.Type]int        `json:"adds"`
	Violations Anomalies[CounterViolation] `json:"violations"`
	// Unread lists the keys with adds that might have happened and no ok
	// read: no bound was checked for them.
	Unread []uint64 `json:"unread,omitempty"`
}

type counterAdd struct {
	start, end int64 // invoke and completion times
	delta      int64
	ok         bool
}

// prefix holds running sums of the positive and negative parts of deltas
// along one ordering of adds; [i] sums the first i.
type prefix struct{ pos, neg []int64 }

func newPrefix(adds []counterAdd) prefix {
	p := prefix{pos: make([]int64, len(adds)+1), neg: make([]int64, len(adds)+1)}
	for i, a := range adds {
		p.pos[i+1], p.neg[i+1] = p.pos[i], p.neg[i]
		if a.delta > 0 {
			p.pos[i+1] += a.delta
		} else {
			p.neg[i+1] += a.delta
		}
	}
	return p
}

// Counter checks per-key counters (counters start at 0): every ok read
// must lie between what certainly happened and what possibly happened.
//
// An add certainly happened before a read if it was acknowledged before
// the read was invoked; it possibly happened if it was invoked before
// the read completed and did not fail (ok, info or never completed).
// With only positive deltas the bounds are the acked sum and the
// attempted sum; a negative delta can lower the value, so each uncertain
// add contributes its negative part to the lower bound and its positive
// part to the upper:
//
//	lower = Σ certain + Σ min(0, uncertain)   upper = Σ certain + Σ max(0, uncertain)
//
// Equal timestamps count as concurrent, which only widens the bounds.
func Counter(ops []history.Op) Result {
	const name = "counter"
	pairs, err := history.Pairs(ops)
	if err != nil {
		return unknown(name, "cannot pair the history: %v", err)
	}
	windows, err := FaultWindows(ops)
	if err != nil {
		return unknown(name, "cannot derive fault windows: %v", err)
	}
	type read struct {
		p     history.Pair
		value int64
	}
	adds := map[uint64][]counterAdd{}
	reads := map[uint64][]read{}
	d := CounterDetails{Adds: map[history.Type]int{}}
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() {
			continue
		}
		switch p.Invoke.F {
		case history.FAdd:
			v, err := history.Decode[history.AddValue](p.Invoke)
			if err != nil {
				return unknown(name, "%v", err)
			}
			d.Adds[p.Type()]++
			if p.Type() != history.Fail {
				end := p.Completion.Time
				adds[v.Key] = append(adds[v.Key], counterAdd{start: p.Invoke.Time, end: end, delta: v.Delta, ok: p.Type() == history.OK})
			}
		case history.FRead:
			if p.Type() != history.OK {
				continue
			}
			key, value, err := okCounterRead(p)
			if err != nil {
				return unknown(name, "%v", err)
			}
			reads[key] = append(reads[key], read{p: p, value: value})
			d.Reads++
		}
	}
	keys := make([]uint64, 0, len(reads))
	for k := range reads {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	d.Keys = len(keys)
	for k := range adds {
		if len(reads[k]) == 0 {
			d.Unread = append(d.Unread, k)
		}
	}
	sort.Slice(d.Unread, func(i, j int) bool { return d.Unread[i] < d.Unread[j] })

	var violations []CounterViolation
	for _, k := range keys {
		// certain: acked adds by completion time; possible: every
		// non-failed add by invoke time.
		var certain []counterAdd
		possible := adds[k]
		for _, a := range possible {
			if a.ok {
				certain = append(certain, a)
			}
		}
		sort.Slice(certain, func(i, j int) bool { return certain[i].end < certain[j].end })
		sort.Slice(possible, func(i, j int) bool { return possible[i].start < possible[j].start })
		cp, pp := newPrefix(certain), newPrefix(possible)
		for _, r := range reads[k] {
			start, end := r.p.Invoke.Time, r.p.Completion.Time
			nc := sort.Search(len(certain), func(i int) bool { return certain[i].end >= start })
			np := sort.Search(len(possible), func(i int) bool { return possible[i].start > end })
			lower := cp.pos[nc] + pp.neg[np]
			upper := cp.neg[nc] + pp.pos[np]
			if r.value < lower || r.value > upper {
				violations = append(violations, CounterViolation{
					Key: k, Value: r.value, Lower: lower, Upper: upper,
					Process: r.p.Invoke.Process, Node: r.p.Invoke.Node, Invoke: r.p.Invoke.Index, Start: start, End: end,
					Faults: faultsAround(windows, start, end, int64(FaultMargin)),
				})
			}
		}
	}
	sort.Slice(violations, func(i, j int) bool { return violations[i].Invoke < violations[j].Invoke })
	for _, v := range violations {
		d.Violations.add(func() CounterViolation { return v })
	}
	if d.Violations.Count > 0 {
		v := d.Violations.Examples[0]
		return Result{Name: name, Valid: Invalid, Details: d, Summary: fmt.Sprintf(
			"%d of %d reads out of bounds; first: key %d read %d via %s at %s, allowed [%d, %d]",
			d.Violations.Count, d.Reads, v.Key, v.Value, v.Node, history.FormatTime(v.Start), v.Lower, v.Upper)}
	}
	if d.Reads == 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no ok reads to check"}
	}
	if len(d.Unread) > 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: fmt.Sprintf(
			"all %d reads of %d keys within bounds; but %d keys with adds were never read (no ok read), unchecked: first key %d",
			d.Reads, d.Keys, len(d.Unread), d.Unread[0])}
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: fmt.Sprintf("all %d reads of %d keys within bounds", d.Reads, d.Keys)}
}

// okCounterRead is the key and value an ok counter read returned; an ok
// read without a value is an error (the history is malformed).
func okCounterRead(p history.Pair) (key uint64, value int64, err error) {
	v, err := history.Decode[history.ReadValue](p.Completion)
	if err != nil {
		return 0, 0, err
	}
	if v.Value == nil {
		return 0, 0, fmt.Errorf("%s: expected an ok read to carry a value, found null", p.Completion)
	}
	return v.Key, *v.Value, nil
}
