package etcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/db"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/report"
)

// hist builds a history from steps: an invoke, or (complete) the
// completion of the process's pending op with type t (and readVal, for an
// ok get).
type step struct {
	proc     int
	f        string
	v        RegisterValue
	t        history.Type
	complete bool
	readVal  int
	// rev is the completion's header revision; modRev the mod revision
	// an ok get saw.
	rev    uint64
	modRev int64
}

func hist(t *testing.T, steps []step) []history.Op {
	t.Helper()
	path := filepath.Join(t.TempDir(), "h.jsonl")
	rec, err := history.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	pending := map[int]history.Op{}
	for _, s := range steps {
		if s.complete {
			inv := pending[s.proc]
			var out any
			if inv.F == FGet && s.t == history.OK {
				out = RegisterValue{Key: s.v.Key, Value: s.readVal, Rev: s.modRev}
			}
			rec.Complete(inv, s.t, out, nil, s.rev, 0)
			delete(pending, s.proc)
			time.Sleep(time.Microsecond)
			continue
		}
		pending[s.proc] = rec.Invoke(history.Process(s.proc), s.f, s.v, "n1")
		time.Sleep(time.Microsecond)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	ops, err := history.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

var k = RegisterValue{Key: registerPrefix + "0"}

func put(v int) RegisterValue      { return RegisterValue{Key: k.Key, Value: v} }
func cas(old, v int) RegisterValue { return RegisterValue{Key: k.Key, Old: old, Value: v} }

// The register checker says true of a linearizable
// history with writes of unknown outcome, and false of a stale read.
// Regression: the first history's info cas(4→5), whose compare cannot
// have held, was judged illegal (the model made an unknown cas step only
// from its old value), and the first 60s run against etcd read as 51
// non-linearizable keys that were the harness's own doing.
func TestCheckRegister(t *testing.T) {
	ok := hist(t, []step{
		{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK},
		// A cas of unknown outcome whose compare cannot have held: it did nothing.
		{proc: 1, f: FCAS, v: cas(4, 5)}, {proc: 1, complete: true, t: history.Info},
		{proc: 2, f: FGet, v: k}, {proc: 2, complete: true, t: history.OK, v: k, readVal: 1},
		{proc: 0, f: FCAS, v: cas(1, 2)}, {proc: 0, complete: true, t: history.OK},
		// A put of unknown outcome that a later read shows did land.
		{proc: 3, f: FPut, v: put(3)}, {proc: 3, complete: true, t: history.Info},
		{proc: 2, f: FGet, v: k}, {proc: 2, complete: true, t: history.OK, v: k, readVal: 3},
	})
	if r := CheckRegister(ok, "", Linearizable, time.Minute); r.Valid != checker.Valid {
		t.Fatalf("expected a linearizable history to be valid, found %s: %s", r.Valid, r.Summary)
	}

	stale := hist(t, []step{
		{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK},
		{proc: 0, f: FPut, v: put(2)}, {proc: 0, complete: true, t: history.OK},
		// Starts after put(2) was acknowledged, reads the value before it.
		{proc: 1, f: FGet, v: k}, {proc: 1, complete: true, t: history.OK, v: k, readVal: 1},
	})
	dir := t.TempDir()
	r := CheckRegister(stale, dir, Linearizable, time.Minute)
	if r.Valid != checker.Invalid {
		t.Fatalf("expected a stale read to be invalid, found %s: %s", r.Valid, r.Summary)
	}
	if d := r.Details.(RegisterDetails); d.Illegal != 1 || d.Keys[0].Visualization == "" {
		t.Fatalf("expected one illegal key with a visualization, found %+v", d)
	}
	// Serializable reads may be stale by etcd's contract: left out, and
	// the summary says so.
	r = CheckRegister(stale, "", Serializable, time.Minute)
	if r.Valid != checker.Valid || r.Details.(RegisterDetails).ReadsLeftOut != 1 {
		t.Fatalf("expected serializable reads left out and the writes valid, found %s: %s", r.Valid, r.Summary)
	}
	if st := r.Details.(RegisterDetails).StaleKeys; st == nil || *st != 1 {
		t.Fatalf("expected the stale read reported as 1 key not linearizable with reads, found %v: %s", st, r.Summary)
	}

	// A cas acknowledged although its compare could not hold.
	badCAS := hist(t, []step{
		{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK},
		{proc: 1, f: FCAS, v: cas(3, 4)}, {proc: 1, complete: true, t: history.OK},
	})
	if r := CheckRegister(badCAS, "", Linearizable, time.Minute); r.Valid != checker.Invalid {
		t.Fatalf("expected an impossible ok cas to be invalid, found %s: %s", r.Valid, r.Summary)
	}
}

// Timeouts end as info, never fail, unless etcd said the
// operation did not happen.
func TestOutcome(t *testing.T) {
	cases := []struct {
		err  error
		want history.Type
	}{
		{nil, history.OK},
		{context.DeadlineExceeded, history.Info},
		{fmt.Errorf("POST: %w", context.DeadlineExceeded), history.Info},
		{&Error{HTTPStatus: 503, Code: 14, Message: "etcdserver: request timed out"}, history.Info},
		{&Error{HTTPStatus: 503, Code: 14, Message: "etcdserver: leader changed"}, history.Info},
		{&Error{HTTPStatus: 503, Code: 14, Message: "etcdserver: no leader"}, history.Info},
		{&Error{HTTPStatus: 500, Code: 2, Message: "etcdserver: unknown"}, history.Info},
		{&Error{HTTPStatus: 429, Code: 8, Message: "etcdserver: too many requests"}, history.Fail},
		{&Error{HTTPStatus: 400, Code: 3, Message: "etcdserver: key is not provided"}, history.Fail},
		{&Error{HTTPStatus: 400, Message: "gateway: bad JSON"}, history.Fail},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, history.Fail},
		{&net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, history.Info},
	}
	for _, c := range cases {
		if got := Outcome(c.err); got != c.want {
			t.Errorf("Outcome(%v): expected %s, found %s", c.err, c.want, got)
		}
	}
}

func TestKeySlotsRotate(t *testing.T) {
	s := newKeySlots(2, 3)
	first := s.take(0)
	if s.take(1) == first {
		t.Fatalf("expected two slots on different keys, found %s twice", first)
	}
	for range 3 {
		s.done(0, history.OK)
	}
	if s.take(0) == first {
		t.Fatalf("expected slot 0 on a fresh key after 3 ops, found %s", first)
	}
	s2 := newKeySlots(1, 60)
	k0 := s2.take(0)
	s2.done(0, history.Info)
	s2.done(0, history.Info)
	if s2.take(0) == k0 {
		t.Fatalf("expected the slot to move on after %d info ops, found the same key", 60/30)
	}
}

// A membership change etcd refused with "unhealthy cluster" (its strict
// reconfiguration check, before proposing) did not happen; the nemesis
// records fail, not info.
func TestRefusedReconfig(t *testing.T) {
	refused := fmt.Errorf("remove: %w", &Error{HTTPStatus: 503, Code: 14, Message: "etcdserver: unhealthy cluster"})
	if !refusedReconfig(refused) {
		t.Fatalf("expected %v to be a refused change", refused)
	}
	if refusedReconfig(&Error{HTTPStatus: 503, Code: 14, Message: "etcdserver: request timed out"}) {
		t.Fatal("expected a timeout not to be a refused change")
	}
}

// Check bounds the register search by the configuration's timeout.
func TestCheckUsesTheConfiguredTimeout(t *testing.T) {
	run, err := report.NewRun(t.TempDir(), "t", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{LinearizableTimeout: Duration(7 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	ops := hist(t, []step{{proc: 0, f: FPut, v: put(1)}, {proc: 0, complete: true, t: history.OK}})
	for _, r := range d.Check(db.CheckInput{Run: run, Ops: ops}) {
		if r.Name == "linearizable" {
			if got := time.Duration(r.Details.(RegisterDetails).Timeout); got != 7*time.Second {
				t.Fatalf("expected the search bounded by 7s, found %v", got)
			}
			return
		}
	}
	t.Fatal("expected a linearizable result, found none")
}
