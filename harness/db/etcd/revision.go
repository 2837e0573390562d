package etcd

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// RevisionViolation is one thing the revision checker found.
type RevisionViolation struct {
	// Kind is "backwards" (an op saw a lower revision than one that had
	// completed before it was invoked), "stale" (a read missed a write
	// acknowledged at a revision at or below the read's), "future" (a
	// read saw a write above its own revision), "nothing" (a read found
	// no value where a write was acknowledged at or below its revision),
	// "conflict" (two values at one key and revision) or "unwritten" (a
	// read saw a value no op had written to the key).
	Kind string `json:"kind"`
	Key  string `json:"key,omitempty"`
	// Op is the index of the completion judged; Before that of the op it
	// is judged against.
	Op     int64  `json:"op"`
	Before int64  `json:"before,omitempty"`
	Detail string `json:"detail"`
}

// RevisionDetails is the Details of a CheckRevisions result.
type RevisionDetails struct {
	// Ordered counts the ok ops whose header revision was checked against
	// real time; Reads the ok reads checked against the write history.
	Ordered int `json:"ordered"`
	Reads   int `json:"reads"`
	// Undecided counts reads whose value came from a write of unknown
	// outcome, in a history that did not record the value's mod revision:
	// where that write landed, and so whether the read was current, is
	// not known.
	Undecided  int                 `json:"undecided,omitempty"`
	Violations int                 `json:"violations"`
	Shown      []RevisionViolation `json:"shown,omitempty"`
}

// maxShown bounds the violations a result lists.
const maxShown = 20

type revOp struct {
	inv, comp history.Op
	rev       int64
}

type revWrite struct {
	op    int64 // completion index
	value int
	rev   int64 // 0: unknown (the write ended info)
	inv   int64 // invoke time
}

// CheckRevisions judges every etcd response's header revision, etcd's
// robustness model:
//
//   - Revisions never go backwards in real time: an op invoked after
//     another completed ok never reports a lower header revision. The
//     cluster's revision only grows, and a linearizable read or a write is
//     served at a revision at least every acknowledged one's. Serializable
//     reads are left out (etcd documents that they may be stale).
//   - A register read at revision R returns what the write history holds
//     at R: the value of the write on that key with the greatest revision
//     <= R, the write's revision being its header revision when it was
//     acknowledged, or the value's mod revision when a read saw it. This
//     holds for serializable reads too: a stale member serves an old
//     revision, but the value it returns must be that revision's.
//
// It says false of a history with any violation, unknown when nothing
// was checked or some read could not be placed, true otherwise.
func CheckRevisions(ops []history.Op, reads string) checker.Result {
	const name = "revision"
	pairs, err := history.Pairs(ops)
	if err != nil {
		return checker.Result{Name: name, Valid: checker.Unknown, Summary: fmt.Sprintf("cannot pair the history: %v", err)}
	}
	var d RevisionDetails
	add := func(v RevisionViolation) {
		d.Violations++
		if len(d.Shown) < maxShown {
			d.Shown = append(d.Shown, v)
		}
	}
	var ordered []revOp
	writes := map[string][]revWrite{}
	type read struct {
		revOp
		key string
		got RegisterValue
	}
	var regReads []read
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() {
			continue
		}
		t := p.Type()
		isReg := p.Invoke.F == FGet || p.Invoke.F == FPut || p.Invoke.F == FCAS
		var v RegisterValue
		if isReg {
			if v, err = history.Decode[RegisterValue](p.Invoke); err != nil {
				return checker.Result{Name: name, Valid: checker.Unknown, Summary: err.Error()}
			}
		}
		o := revOp{inv: p.Invoke, comp: p.Completion, rev: int64(p.Completion.Seq)}
		if t == history.OK && o.rev > 0 && !(p.Invoke.F == FGet && reads == Serializable) {
			ordered = append(ordered, o)
		}
		switch {
		case !isReg:
		case p.Invoke.F == FGet && t == history.OK && o.rev > 0:
			got, err := history.Decode[RegisterValue](p.Completion)
			if err != nil {
				return checker.Result{Name: name, Valid: checker.Unknown, Summary: err.Error()}
			}
			regReads = append(regReads, read{o, v.Key, got})
		case p.Invoke.F != FGet && t == history.OK:
			writes[v.Key] = append(writes[v.Key], revWrite{op: p.Completion.Index, value: v.Value, rev: o.rev, inv: p.Invoke.Time})
		case p.Invoke.F != FGet && t == history.Info:
			writes[v.Key] = append(writes[v.Key], revWrite{op: p.Completion.Index, value: v.Value, inv: p.Invoke.Time})
		}
	}

	// Real time: sweep the ops in invoke order, holding the greatest
	// revision among those completed before the current invoke.
	d.Ordered = len(ordered)
	byComp := slices.Clone(ordered)
	slices.SortFunc(ordered, func(a, b revOp) int { return cmp.Compare(a.inv.Time, b.inv.Time) })
	slices.SortFunc(byComp, func(a, b revOp) int { return cmp.Compare(a.comp.Time, b.comp.Time) })
	var top *revOp
	j := 0
	for i := range ordered {
		o := &ordered[i]
		for ; j < len(byComp) && byComp[j].comp.Time < o.inv.Time; j++ {
			if top == nil || byComp[j].rev > top.rev {
				top = &byComp[j]
			}
		}
		if top != nil && o.rev < top.rev {
			add(RevisionViolation{Kind: "backwards", Op: o.comp.Index, Before: top.comp.Index,
				Detail: fmt.Sprintf("%s on %s (op %d) answered at revision %d, below the revision %d of %s on %s (op %d), which completed before it was invoked",
					o.inv.F, o.inv.Node, o.comp.Index, o.rev, top.rev, top.inv.F, top.inv.Node, top.comp.Index)})
		}
	}

	// The write history of each key: revision -> value, from the
	// acknowledged writes and from what reads saw at a mod revision.
	type fact struct {
		value int
		op    int64
	}
	facts := map[string]map[int64]fact{}
	addFact := func(key string, rev int64, value int, op int64) {
		m := facts[key]
		if m == nil {
			m = map[int64]fact{}
			facts[key] = m
		}
		if f, ok := m[rev]; ok && f.value != value {
			add(RevisionViolation{Kind: "conflict", Key: key, Op: op, Before: f.op,
				Detail: fmt.Sprintf("%s holds %d at revision %d by op %d and %d at the same revision by op %d", key, value, rev, op, f.value, f.op)})
			return
		}
		if _, ok := m[rev]; !ok {
			m[rev] = fact{value, op}
		}
	}
	for key, ws := range writes {
		for _, w := range ws {
			if w.rev > 0 {
				addFact(key, w.rev, w.value, w.op)
			}
		}
	}
	for _, r := range regReads {
		if r.got.Rev > 0 && r.got.Value != 0 {
			addFact(r.key, r.got.Rev, r.got.Value, r.comp.Index)
		}
	}
	revs := map[string][]int64{}
	for key, m := range facts {
		for rev := range m {
			revs[key] = append(revs[key], rev)
		}
		slices.Sort(revs[key])
	}
	// newest is the fact on key with the greatest revision <= at.
	newest := func(key string, at int64) (int64, fact, bool) {
		rs := revs[key]
		i, found := slices.BinarySearch(rs, at)
		if found {
			return at, facts[key][at], true
		}
		if i == 0 {
			return 0, fact{}, false
		}
		return rs[i-1], facts[key][rs[i-1]], true
	}

	d.Reads = len(regReads)
	for _, r := range regReads {
		R, key, got := r.rev, r.key, r.got
		desc := fmt.Sprintf("get of %s on %s (op %d) at revision %d", key, r.inv.Node, r.comp.Index, R)
		if got.Value == 0 {
			if at, f, ok := newest(key, R); ok {
				add(RevisionViolation{Kind: "nothing", Key: key, Op: r.comp.Index, Before: f.op,
					Detail: fmt.Sprintf("%s found no value, but op %d wrote %d at revision %d", desc, f.op, f.value, at)})
			}
			continue
		}
		// The value must have been sent to the key before the read ended.
		var writers []revWrite
		for _, w := range writes[key] {
			if w.value == got.Value && w.inv < r.comp.Time {
				writers = append(writers, w)
			}
		}
		if len(writers) == 0 {
			add(RevisionViolation{Kind: "unwritten", Key: key, Op: r.comp.Index,
				Detail: fmt.Sprintf("%s returned %d, which no write had sent to %s", desc, got.Value, key)})
			continue
		}
		if got.Rev > 0 {
			if got.Rev > R {
				add(RevisionViolation{Kind: "future", Key: key, Op: r.comp.Index,
					Detail: fmt.Sprintf("%s returned %d written at revision %d, above the read's own", desc, got.Value, got.Rev)})
				continue
			}
			if at, f, ok := newest(key, R); ok && at > got.Rev {
				add(RevisionViolation{Kind: "stale", Key: key, Op: r.comp.Index, Before: f.op,
					Detail: fmt.Sprintf("%s returned %d written at revision %d, but op %d wrote %d at revision %d, between the two", desc, got.Value, got.Rev, f.op, f.value, at)})
			}
			continue
		}
		// No mod revision recorded: place the value by its writers.
		at, f, ok := newest(key, R)
		if ok && f.value == got.Value {
			continue
		}
		var known []revWrite
		unknown := false
		for _, w := range writers {
			if w.rev == 0 {
				unknown = true
			} else {
				known = append(known, w)
			}
		}
		if unknown {
			d.Undecided++
			continue
		}
		w := known[0]
		switch {
		case w.rev > R:
			add(RevisionViolation{Kind: "future", Key: key, Op: r.comp.Index, Before: w.op,
				Detail: fmt.Sprintf("%s returned %d, which op %d wrote at revision %d, above the read's own", desc, got.Value, w.op, w.rev)})
		case ok:
			add(RevisionViolation{Kind: "stale", Key: key, Op: r.comp.Index, Before: f.op,
				Detail: fmt.Sprintf("%s returned %d, which op %d wrote at revision %d, but op %d wrote %d at revision %d, between the two", desc, got.Value, w.op, w.rev, f.op, f.value, at)})
		}
	}

	scope := fmt.Sprintf("%d ok ops ordered by real time, %d reads against the write history", d.Ordered, d.Reads)
	if reads == Serializable {
		scope += " (serializable reads: values checked, order not)"
	}
	switch {
	case d.Violations > 0:
		var first []string
		for _, v := range d.Shown[:min(3, len(d.Shown))] {
			first = append(first, v.Kind+": "+v.Detail)
		}
		return checker.Result{Name: name, Valid: checker.Invalid, Details: d,
			Summary: fmt.Sprintf("%d revision violations (%s): %s", d.Violations, scope, strings.Join(first, "; "))}
	case d.Ordered == 0 && d.Reads == 0:
		return checker.Result{Name: name, Valid: checker.Unknown, Details: d, Summary: "no ok op with a revision to check"}
	case d.Undecided > 0:
		return checker.Result{Name: name, Valid: checker.Unknown, Details: d,
			Summary: fmt.Sprintf("%d reads returned the value of a write of unknown outcome and no mod revision, so cannot be placed (%s)", d.Undecided, scope)}
	}
	return checker.Result{Name: name, Valid: checker.Valid, Details: d, Summary: "revisions consistent: " + scope}
}
