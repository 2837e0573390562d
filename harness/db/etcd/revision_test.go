package etcd

import (
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

func kinds(r checker.Result) []string {
	var out []string
	if d, ok := r.Details.(RevisionDetails); ok {
		for _, v := range d.Shown {
			out = append(out, v.Kind)
		}
	}
	return out
}

// A stale read spliced into a history whose writes repeat a value: the
// read returns the value of the write before the newest, so porcupine
// cannot tell it from a current one; its revision, below that of a
// write acknowledged before it was invoked, can.
func TestCheckRevisionsSplicedStaleRead(t *testing.T) {
	ops := hist(t, []step{
		{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 1500},
		{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 1541},
		// Invoked after the write at 1541 completed; answered at 1527.
		{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 1, rev: 1527},
	})
	if r := CheckRegister(ops, "", Linearizable, time.Minute); r.Valid != checker.Valid {
		t.Fatalf("expected porcupine to find the values linearizable, found %s: %s", r.Valid, r.Summary)
	}
	r := CheckRevisions(ops, Linearizable)
	if r.Valid != checker.Invalid || strings.Join(kinds(r), ",") != "backwards" {
		t.Fatalf("expected the spliced read invalid as a backwards revision, found %s %v: %s", r.Valid, kinds(r), r.Summary)
	}
	if !strings.Contains(r.Summary, "revision 1527, below the revision 1541") {
		t.Fatalf("expected the summary to name both revisions, found %s", r.Summary)
	}
}

func TestCheckRevisions(t *testing.T) {
	cases := []struct {
		name  string
		steps []step
		reads string
		want  checker.Validity
		kinds string
	}{
		{name: "current reads and writes", want: checker.Valid, steps: []step{
			{proc: 0, f: FGet, v: k}, {proc: 0, complete: true, t: history.OK, v: k, rev: 9},
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 1, rev: 11, modRev: 10},
			{proc: 0, f: FCAS, v: cas(1, 2)}, {proc: 0, complete: true, t: history.OK, rev: 12},
			{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 2, rev: 12, modRev: 12},
			// Without a mod revision: placed by its acknowledged write.
			{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 2, rev: 14},
		}},
		{name: "a write of unknown outcome placed by the mod revision a read saw", want: checker.Valid, steps: []step{
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 2, f: FPut, v: put(2)}, {proc: 2, complete: true, t: history.Info},
			{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 2, rev: 15, modRev: 13},
		}},
		{name: "a write of unknown outcome, no mod revision", want: checker.Unknown, steps: []step{
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 2, f: FPut, v: put(2)}, {proc: 2, complete: true, t: history.Info},
			{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 2, rev: 15},
		}},
		{name: "stale value at a current revision", want: checker.Invalid, kinds: "stale", steps: []step{
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 1, f: FGet, v: k},
			{proc: 0, f: FPut, v: put(2)}, {proc: 0, complete: true, t: history.OK, rev: 12},
			{proc: 1, complete: true, t: history.OK, v: k, readVal: 1, rev: 13, modRev: 10},
		}},
		{name: "stale value, no mod revision", want: checker.Invalid, kinds: "stale", steps: []step{
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 1, f: FGet, v: k},
			{proc: 0, f: FPut, v: put(2)}, {proc: 0, complete: true, t: history.OK, rev: 12},
			{proc: 1, complete: true, t: history.OK, v: k, readVal: 1, rev: 13},
		}},
		{name: "nothing where a write was", want: checker.Invalid, kinds: "nothing", steps: []step{
			{proc: 1, f: FGet, v: k},
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 1, complete: true, t: history.OK, v: k, rev: 11},
		}},
		{name: "a value from a later revision", want: checker.Invalid, kinds: "future", steps: []step{
			{proc: 1, f: FGet, v: k},
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 12},
			{proc: 1, complete: true, t: history.OK, v: k, readVal: 1, rev: 10, modRev: 12},
		}},
		{name: "a value never written", want: checker.Invalid, kinds: "unwritten", steps: []step{
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 7, rev: 11, modRev: 11},
		}},
		{name: "two values at one revision", want: checker.Invalid, kinds: "conflict", steps: []step{
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 1, f: FPut, v: put(2)}, {proc: 1, complete: true, t: history.OK, rev: 10},
		}},
		// A serializable read may be served from an old revision (etcd's
		// contract), but what it returns must be that revision's value.
		{name: "serializable read at an old revision", reads: Serializable, want: checker.Valid, steps: []step{
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 0, f: FPut, v: put(2)}, {proc: 0, complete: true, t: history.OK, rev: 12},
			{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 1, rev: 11, modRev: 10},
		}},
		{name: "serializable read of the wrong value for its revision", reads: Serializable, want: checker.Invalid, kinds: "stale", steps: []step{
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK, rev: 10},
			{proc: 0, f: FPut, v: put(2)}, {proc: 0, complete: true, t: history.OK, rev: 12},
			{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 1, rev: 12, modRev: 10},
		}},
		{name: "nothing to check", want: checker.Unknown, steps: []step{
			{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.Info},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reads := c.reads
			if reads == "" {
				reads = Linearizable
			}
			r := CheckRevisions(hist(t, c.steps), reads)
			if r.Valid != c.want || strings.Join(kinds(r), ",") != c.kinds {
				t.Fatalf("expected %s %q, found %s %v: %s", c.want, c.kinds, r.Valid, kinds(r), r.Summary)
			}
		})
	}
}
