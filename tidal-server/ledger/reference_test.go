package ledger

import (
	"errors"
	"math"
	"sort"
)

// refLedger is the brute-force model the tests hold the ledger to: it
// keeps every folded event and recomputes aggregates from scratch, and
// implements the id memory as the documentation states it, with plain
// maps and no shared code.
type refLedger struct {
	schema    Schema
	idsPerGen int
	applied   uint64
	events    []refEvent
	cur, old  map[string]refEvent
}

type refEvent struct {
	Event
	index uint64
	pos   int
}

func newRef(s Schema, idsPerGen int) *refLedger {
	return &refLedger{schema: s, idsPerGen: idsPerGen, cur: map[string]refEvent{}, old: map[string]refEvent{}}
}

// refOutcome classifies Apply's answer for comparison.
type refOutcome struct {
	res      Result
	kind     string // "", "invalid", "conflict", "stale"
	position int
}

func outcomeOf(res Result, err error) refOutcome {
	var ee *EventError
	var ce *ConflictError
	switch {
	case err == nil:
		return refOutcome{res: res}
	case errors.As(err, &ee):
		return refOutcome{kind: "invalid", position: ee.Index}
	case errors.As(err, &ce):
		return refOutcome{kind: "conflict", position: ce.Index}
	case errors.Is(err, ErrAlreadyApplied):
		return refOutcome{kind: "stale"}
	}
	return refOutcome{kind: "other: " + err.Error()}
}

func samePayload(a, b Event) bool {
	return a.Entity == b.Entity && a.Signal == b.Signal && math.Float64bits(a.Weight) == math.Float64bits(b.Weight)
}

func (r *refLedger) apply(index uint64, events []Event) refOutcome {
	if index <= r.applied {
		return refOutcome{kind: "stale"}
	}
	for i, e := range events {
		if r.schema.ValidateEvent(e) != nil {
			return refOutcome{kind: "invalid", position: i}
		}
	}
	// First pass: conflicts (against memory, then against earlier events
	// of the batch), in position order.
	for i, e := range events {
		if prev, ok := r.lookup(e.ID); ok {
			if !samePayload(prev.Event, e) {
				return refOutcome{kind: "conflict", position: i}
			}
			continue
		}
		for _, p := range events[:i] {
			if p.ID == e.ID {
				if !samePayload(p, e) {
					return refOutcome{kind: "conflict", position: i}
				}
				break
			}
		}
	}
	var out refOutcome
	for i, e := range events {
		if _, ok := r.lookup(e.ID); ok {
			out.res.Duplicates++
			continue
		}
		re := refEvent{Event: e, index: index, pos: i}
		r.cur[e.ID] = re
		r.events = append(r.events, re)
		out.res.Applied++
	}
	r.applied = index
	if len(r.cur) >= r.idsPerGen {
		r.old, r.cur = r.cur, map[string]refEvent{}
	}
	return out
}

func (r *refLedger) lookup(id string) (refEvent, bool) {
	if e, ok := r.cur[id]; ok {
		return e, true
	}
	e, ok := r.old[id]
	return e, ok
}

// refSignal is the brute-force SignalView, plus the ideal (unbucketed)
// window counts the bucketed ones are bounded by.
type refSignal struct {
	SignalView
	anchor int64
	// per window name: events in (at-W, at] and in (at-W-b, at+b)
	inner, outer map[string]uint64
}

func (r *refLedger) get(entity uint64, signal string, at int64) refSignal {
	st, _ := r.schema.Signal(signal)
	hMs := float64(st.HalfLife.Milliseconds())
	out := refSignal{SignalView: SignalView{Windows: map[string]uint64{}}, inner: map[string]uint64{}, outer: map[string]uint64{}}
	for _, w := range st.Windows {
		out.Windows[w.Name] = 0
	}
	for _, e := range r.events {
		if e.Entity != entity || e.Signal != signal {
			continue
		}
		out.Count++
		out.WeightSum += e.Weight
		out.Score += e.Weight * math.Pow(2, -float64(at-e.TS)/hMs)
		out.anchor = max(out.anchor, e.TS)
		for _, w := range st.Windows {
			if w.Duration == 0 {
				out.Windows[w.Name]++
				continue
			}
			W := w.Duration.Milliseconds()
			b := W / BucketsPerWindow
			top := floorDiv(at, b)
			if e.TS >= (top-BucketsPerWindow)*b && e.TS < (top+1)*b {
				out.Windows[w.Name]++
			}
			if e.TS > at-W && e.TS <= at {
				out.inner[w.Name]++
			}
			if e.TS > at-W-b && e.TS < at+b {
				out.outer[w.Name]++
			}
		}
	}
	return out
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// topFromViews ranks entities by the value picked from views, the slow
// obvious way.
func topFromViews(values map[uint64]float64, k int) []Ranked {
	var all []Ranked
	for id, v := range values {
		if v != 0 {
			all = append(all, Ranked{Entity: id, Value: v})
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].Value != all[j].Value {
			return all[i].Value > all[j].Value
		}
		return all[i].Entity < all[j].Entity
	})
	if len(all) > k {
		all = all[:k]
	}
	return all
}
