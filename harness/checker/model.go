package checker

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// SignalModel is the schema of the signal the counter workload writes, as
// the harness expects the servers to run it. It is stated by the harness
// (workload.Config), never read from tidal-server/ledger, so a server that
// decays with another half-life or counts another window is caught rather
// than echoed.
type SignalModel struct {
	Signal   string
	HalfLife time.Duration
	// Windows maps each window's name to its duration; 0 is the "all"
	// window (the total count). Durations are whole minutes.
	Windows map[string]time.Duration
}

// StampSkew bounds how far a node's clock may be from the harness's when
// it stamps an event that came without ts: the stamp is known to lie in
// [sent, acked] by the client's clock, widened by this much on each side.
// The harness runs its nodes on its own machine (one clock); the slack
// covers clock steps. It cannot hide a wrong half-life: a second moves a
// 72h decay by a few parts per million.
const StampSkew = time.Second

// scoreTolerance is the relative slack on the decayed-score bounds: the
// server sums in its own order around a moving anchor, so its float
// result may differ from the model's in the last bits.
const scoreTolerance = 1e-9

// AggregateViolation is an ok read whose aggregate lies outside what the
// events written allow.
type AggregateViolation struct {
	Key     uint64          `json:"key"`
	Field   string          `json:"field"` // count, weight_sum, score or "window <name>"
	Value   float64         `json:"value"`
	Lower   float64         `json:"lower"`
	Upper   float64         `json:"upper"`
	At      int64           `json:"at"` // unix ms the node evaluated the read at
	Process history.Process `json:"process"`
	Node    string          `json:"node"`
	Invoke  int64           `json:"invoke"` // op index
	Start   int64           `json:"start"`
	End     int64           `json:"end"`
	Faults  []FaultWindow   `json:"faults,omitempty"`
}

// AggregatesDetails is the Details of an Aggregates result.
type AggregatesDetails struct {
	Signal   string               `json:"signal"`
	HalfLife string               `json:"half_life"`
	Windows  map[string]string    `json:"windows"`
	Keys     int                  `json:"keys"`
	Reads    int                  `json:"reads"` // ok reads judged, fully or in part
	Adds     map[history.Type]int `json:"adds"`
	// Unjudged counts, by reason, the reads (or parts of reads) the
	// history held too little to judge; any makes the verdict unknown.
	Unjudged   map[string]int                `json:"unjudged,omitempty"`
	Violations Anomalies[AggregateViolation] `json:"violations"`
}

// modelAdd is one add event as the model folds it.
type modelAdd struct {
	start, end int64 // history times of invoke and completion
	ok         bool
	weight     float64
	// tsLo..tsHi bounds the event's timestamp (unix ms); timed is false
	// when the history does not say (written before it recorded it).
	tsLo, tsHi int64
	exact      bool
	timed      bool
	// offLo..offHi bounds the clock offset (ms) of the node that stamped
	// it, when a clock fault may have moved that node's clock meanwhile;
	// 0..0 otherwise.
	offLo, offHi int64
}

// Aggregates checks every ok counter read's aggregates of m.Signal — count,
// weight sum, decayed score and windowed counts — against a model folded
// from the adds, independently of the server's code.
//
// Like Counter, an add certainly happened before a read if it was
// acknowledged before the read was invoked, and possibly if it was invoked
// before the read completed and did not fail. Every aggregate is bounded
// between what the certain adds imply (lower) and what the certain and
// possible ones together allow (upper):
//
//   - count and weight sum exactly;
//   - the decayed score Σ w·2^((ts-at)/h), at the read's evaluation time
//     at (from the node's answer) and the model's half-life h, within a
//     relative 1e-9; each event's term is taken at the end of its
//     timestamp bracket that makes the bound loosest;
//   - each window of duration W (bucket width b = W/60) within the
//     ledger's documented bucket bound: every event with at-W < ts <= at
//     counts, unless the key's newest event lies so far past at that its
//     bucket was pruned (ts < anchor-W); none with ts <= at-W-b or
//     ts >= at+b does. The "all" window is the count.
//
// An event's timestamp is the client's ts when it sent one; otherwise the
// node stamped it no earlier than the client's clock before sending and no
// later than the ack (an ok add) or the read's answer (anything the read
// folded was stamped before it), widened by StampSkew, and by the offset
// of the stamping node's clock when a clock fault may have moved it
// while the add was in flight (ClockShifts).
//
// Unknown when the history lacks what a read needs (reads without stats,
// adds without timestamps, windows the node did not report) or m does
// not state the schema; never valid by omission.
func Aggregates(ops []history.Op, m SignalModel) Result {
	const name = "aggregates"
	if m.Signal == "" || m.HalfLife <= 0 || len(m.Windows) == 0 {
		return unknown(name, "the run's configuration does not state the schema of the counter signal (half-life %s, %d windows): nothing to fold a model with", m.HalfLife, len(m.Windows))
	}
	pairs, err := history.Pairs(ops)
	if err != nil {
		return unknown(name, "cannot pair the history: %v", err)
	}
	windows, err := FaultWindows(ops)
	if err != nil {
		return unknown(name, "cannot derive fault windows: %v", err)
	}
	shifts, err := ClockShifts(ops)
	if err != nil {
		return unknown(name, "cannot derive clock shifts: %v", err)
	}
	d := AggregatesDetails{
		Signal: m.Signal, HalfLife: m.HalfLife.String(), Windows: map[string]string{},
		Adds: map[history.Type]int{}, Unjudged: map[string]int{},
	}
	for n, w := range m.Windows {
		d.Windows[n] = w.String()
	}
	type read struct {
		p     history.Pair
		stats history.SignalStats
	}
	adds := map[uint64][]modelAdd{}
	reads := map[uint64][]read{}
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() {
			continue
		}
		switch p.Invoke.F {
		case history.FAdd:
			d.Adds[p.Type()]++
			if p.Type() == history.Fail {
				continue
			}
			v, err := history.Decode[history.AddValue](p.Invoke)
			if err != nil {
				return unknown(name, "%v", err)
			}
			a := modelAdd{start: p.Invoke.Time, end: p.Completion.Time, ok: p.Type() == history.OK, weight: float64(v.Delta), tsHi: math.MaxInt64}
			a.offLo, a.offHi = offsetsDuring(shifts, p.Invoke.Node, a.start, a.end)
			switch {
			case v.TS != 0:
				a.tsLo, a.tsHi, a.exact, a.timed = v.TS, v.TS, true, true
			case v.SentMS != 0:
				a.tsLo, a.timed = v.SentMS, true
				if a.ok {
					done, err := history.Decode[history.AddValue](p.Completion)
					if err != nil {
						return unknown(name, "%v", err)
					}
					if done.AckedMS != 0 {
						a.tsHi = done.AckedMS
					}
				}
			}
			adds[v.Key] = append(adds[v.Key], a)
		case history.FRead:
			if p.Type() != history.OK {
				continue
			}
			v, err := history.Decode[history.ReadValue](p.Completion)
			if err != nil {
				return unknown(name, "%v", err)
			}
			if v.Stats == nil {
				d.Unjudged["ok reads without aggregates (stats) recorded"]++
				continue
			}
			reads[v.Key] = append(reads[v.Key], read{p: p, stats: *v.Stats})
		}
	}
	keys := make([]uint64, 0, len(reads))
	for k := range reads {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	d.Keys = len(keys)
	windowNames := make([]string, 0, len(m.Windows))
	for n := range m.Windows {
		windowNames = append(windowNames, n)
	}
	sort.Strings(windowNames)

	skew := StampSkew.Milliseconds()
	hl := float64(m.HalfLife.Milliseconds())
	var violations []AggregateViolation
	for _, k := range keys {
		for _, r := range reads[k] {
			d.Reads++
			start, end, s := r.p.Invoke.Time, r.p.Completion.Time, r.stats
			at := s.At
			violate := func(field string, value, lower, upper float64) {
				violations = append(violations, AggregateViolation{
					Key: k, Field: field, Value: value, Lower: lower, Upper: upper, At: at,
					Process: r.p.Invoke.Process, Node: r.p.Invoke.Node, Invoke: r.p.Invoke.Index, Start: start, End: end,
					Faults: faultsAround(windows, start, end, int64(FaultMargin)),
				})
			}
			// The adds this read may have folded, with their timestamp
			// brackets as this read bounds them.
			type folded struct {
				certain bool
				weight  float64
				lo, hi  int64
			}
			var in []folded
			timed := true
			var countLo, countHi float64
			var weightLo, weightHi float64
			maxAnchor := int64(math.MinInt64)
			for _, a := range adds[k] {
				if a.start > end {
					continue // invoked after the read completed
				}
				f := folded{certain: a.ok && a.end < start, weight: a.weight, lo: a.tsLo, hi: a.tsHi}
				if !a.exact {
					// Client clock first (sent, acked, the read's answer),
					// then the stamping node's clock: StampSkew and any
					// offset a clock fault gave it.
					f.hi = max(min(f.hi, s.ReturnedMS), f.lo)
					f.lo, f.hi = f.lo-skew+a.offLo, f.hi+skew+a.offHi
				}
				timed = timed && a.timed
				in = append(in, f)
				countHi++
				weightHi += f.weight
				if f.certain {
					countLo++
					weightLo += f.weight
				}
				maxAnchor = max(maxAnchor, f.hi)
			}
			if v := float64(s.Count); v < countLo || v > countHi {
				violate("count", v, countLo, countHi)
			}
			if s.WeightSum < weightLo || s.WeightSum > weightHi {
				violate("weight_sum", s.WeightSum, weightLo, weightHi)
			}
			if !timed {
				d.Unjudged["reads whose score and windows depend on adds without a recorded timestamp"]++
				continue
			}

			var scoreLo, scoreHi float64
			for _, f := range in {
				// 2^((ts-at)/h) grows with ts: the bracket's low end gives
				// the least a certain event adds, its high end the most
				// any event adds.
				if f.certain {
					scoreLo += f.weight * math.Exp2(float64(f.lo-at)/hl)
				}
				scoreHi += f.weight * math.Exp2(float64(f.hi-at)/hl)
			}
			if lo, hi := scoreLo*(1-scoreTolerance), scoreHi*(1+scoreTolerance); s.Score < lo || s.Score > hi {
				violate("score", s.Score, scoreLo, scoreHi)
			}

			for _, wn := range windowNames {
				got, reported := s.Windows[wn]
				if !reported {
					if s.Count != 0 || len(s.Windows) != 0 {
						d.Unjudged[fmt.Sprintf("reads that did not report window %q (does the servers' schema match the run's?)", wn)]++
						continue
					}
					got = 0 // the key has no events on the signal: nothing reported
				}
				w := m.Windows[wn].Milliseconds()
				lo, hi := countLo, countHi
				if w > 0 {
					b := w / 60
					lo, hi = 0, 0
					for _, f := range in {
						if f.certain && f.lo > at-w && f.hi <= at && f.lo >= maxAnchor-w {
							lo++
						}
						if f.hi > at-w-b && f.lo < at+b {
							hi++
						}
					}
				}
				if v := float64(got); v < lo || v > hi {
					violate("window "+wn, v, lo, hi)
				}
			}
		}
	}
	sort.SliceStable(violations, func(i, j int) bool { return violations[i].Invoke < violations[j].Invoke })
	for _, v := range violations {
		d.Violations.add(func() AggregateViolation { return v })
	}
	if len(d.Unjudged) == 0 {
		d.Unjudged = nil
	}
	switch {
	case d.Violations.Count > 0:
		v := d.Violations.Examples[0]
		return Result{Name: name, Valid: Invalid, Details: d, Summary: fmt.Sprintf(
			"%d aggregates out of the model's bounds in %d reads; first: key %d %s read %v via %s at %s, allowed [%v, %v]",
			d.Violations.Count, d.Reads, v.Key, v.Field, v.Value, v.Node, history.FormatTime(v.Start), v.Lower, v.Upper)}
	case len(d.Unjudged) > 0:
		var why []string
		for reason, n := range d.Unjudged {
			why = append(why, fmt.Sprintf("%d %s", n, reason))
		}
		sort.Strings(why)
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "the history cannot decide: " + strings.Join(why, "; ")}
	case d.Reads == 0:
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no ok counter reads to check"}
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: fmt.Sprintf(
		"all %d reads of %d keys within the model's bounds (count, weight sum, score at half-life %s, %d windows)", d.Reads, d.Keys, m.HalfLife, len(m.Windows))}
}
