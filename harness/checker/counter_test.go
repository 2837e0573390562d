package checker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

const ms = time.Millisecond

// counterRun: add(+1) acked in [0,10]ms, add(+2) invoked at 5ms and never
// known to finish, add(+4) failed; then a read of key 1 in [20,30]ms
// returning value, which may be 1 or 3.
func counterRun(t *testing.T, value int64) *hist {
	h := newHist(t)
	a1 := h.addInv(0, 1, 1)
	h.at(5 * ms)
	a2 := h.addInv(1, 1, 2)
	a3 := h.addInv(2, 1, 4)
	h.complete(a3, history.Fail, nil)
	h.at(10 * ms)
	h.complete(a1, history.OK, nil)
	h.at(20 * ms)
	r := h.readInv(3, 1)
	h.at(30 * ms)
	h.readOK(r, value)
	h.at(40 * ms)
	h.complete(a2, history.Info, nil)
	return h
}

func TestCounterBounds(t *testing.T) {
	for value, want := range map[int64]Validity{0: Invalid, 1: Valid, 2: Valid, 3: Valid, 4: Invalid, 7: Invalid} {
		r := Counter(counterRun(t, value).ops)
		mustValid(t, r, want)
		if want == Invalid {
			v := r.Details.(CounterDetails).Violations.Examples[0]
			if v.Lower != 1 || v.Upper != 3 || v.Value != value || v.Key != 1 {
				t.Fatalf("read %d: violation %+v, want bounds [1, 3]", value, v)
			}
		}
	}
}

// TestCounterNegative: a concurrent, uncertain -5 can take the value down.
func TestCounterNegative(t *testing.T) {
	h := newHist(t)
	a := h.addInv(0, 7, 10)
	h.ack(a, 1, 1)
	h.at(5 * ms)
	n := h.addInv(1, 7, -5)
	r := h.readInv(2, 7)
	h.readOK(r, 5)
	h.complete(n, history.Info, nil)
	mustValid(t, Counter(h.ops), Valid)

	h = newHist(t)
	a = h.addInv(0, 7, 10)
	h.ack(a, 1, 1)
	r = h.readInv(2, 7)
	h.readOK(r, 5)         // nothing could have taken 5 away yet
	n = h.addInv(1, 7, -5) // invoked after the read completed
	h.complete(n, history.OK, nil)
	mustValid(t, Counter(h.ops), Invalid)
}

func TestCounterNoReads(t *testing.T) {
	h := newHist(t)
	h.complete(h.addInv(0, 1, 1), history.OK, nil)
	mustValid(t, Counter(h.ops), Unknown)
}

func TestLinearizable(t *testing.T) {
	// Counter-valid and linearizable.
	dir := t.TempDir()
	r := Linearizable(counterRun(t, 3).ops, dir, 10*time.Second)
	mustValid(t, r, Valid)
	if files, _ := filepath.Glob(filepath.Join(dir, "*.html")); len(files) != 0 {
		t.Fatalf("visualizations written for a valid history: %v", files)
	}
}

// staleRead: an add of unknown outcome is seen by one read, and a later
// read, strictly after it, misses it. Each read is within the counter
// bounds on its own; together they are not linearizable.
func staleRead(t *testing.T) *hist {
	h := newHist(t)
	h.at(1 * time.Second)
	h.fault(history.FPartition, history.FaultValue{Kind: "halves"})
	a := h.addInv(0, 42, 1)
	h.at(1100 * ms)
	r1 := h.readInv(1, 42)
	h.readOK(r1, 1)
	h.at(1200 * ms)
	r2 := h.readInv(2, 42)
	h.readOK(r2, 0)
	h.complete(a, history.Info, nil)
	// An unrelated, fine key.
	b := h.addInv(3, 5, 2)
	h.ack(b, 9, 1)
	r3 := h.readInv(4, 5)
	h.readOK(r3, 2)
	return h
}

func TestLinearizableStaleRead(t *testing.T) {
	h := staleRead(t)
	mustValid(t, Counter(h.ops), Valid)

	dir := filepath.Join(t.TempDir(), "store", "run")
	r := Linearizable(h.ops, dir, 10*time.Second)
	mustValid(t, r, Invalid)
	d := r.Details.(LinearizableDetails)
	if d.Illegal != 1 || len(d.Keys) != 2 || d.Keys[0].Key != 5 || d.Keys[0].Result != "ok" || d.Keys[1].Result != "illegal" {
		t.Fatalf("keys %+v", d.Keys)
	}
	path := filepath.Join(dir, "linearizable-42.html")
	if d.Keys[1].Visualization != path || !strings.Contains(r.Summary, path) {
		t.Fatalf("visualization %q, summary %q; want %s named", d.Keys[1].Visualization, r.Summary, path)
	}
	html, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<html", "read() → 0", "add(+1)", "partition(halves)"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("%s does not contain %q", path, want)
		}
	}
	// No outDir: still invalid, nothing written.
	r = Linearizable(h.ops, "", 10*time.Second)
	mustValid(t, r, Invalid)
	if r.Details.(LinearizableDetails).Keys[1].Visualization != "" {
		t.Fatal("visualization named without an outDir")
	}
}

func TestLinearizableTimeout(t *testing.T) {
	// A budget of 1ns is spent before the first key is looked at.
	r := Linearizable(counterRun(t, 3).ops, t.TempDir(), time.Nanosecond)
	mustValid(t, r, Unknown)
}

// TestCounterTestdata reads the example counter histories in testdata.
func TestCounterTestdata(t *testing.T) {
	for _, tc := range []struct {
		file              string
		counter, linearOK Validity
	}{
		{"testdata/counter-valid.jsonl", Valid, Valid},
		{"testdata/counter-stale-read.jsonl", Invalid, Invalid},
	} {
		ops, err := history.Read(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		mustValid(t, Counter(ops), tc.counter)
		mustValid(t, Linearizable(ops, t.TempDir(), 10*time.Second), tc.linearOK)
	}
}

// A key whose adds no ok read observed is unchecked: the counter bounds
// and the linearizability search are unknown for it, never true.
func TestCounterKeyWithoutReadsIsUnknown(t *testing.T) {
	t.Run("Regression: key with no reads", func(t *testing.T) {
		h := newHist(t)
		a := h.addInv(0, 7, 10)
		h.ack(a, 1, 1)
		r := h.readInv(1, 7)
		h.readOK(r, 10)
		b := h.addInv(2, 8, 3) // key 8: added, never read
		h.ack(b, 2, 1)
		r = h.readInv(3, 8)
		h.complete(r, history.Info, nil) // its final read timed out
		c := Counter(h.ops)
		mustValid(t, c, Unknown)
		if !strings.Contains(c.Summary, "key 8") {
			t.Fatalf("counter summary should name key 8: %s", c.Summary)
		}
		l := Linearizable(h.ops, "", 10*time.Second)
		mustValid(t, l, Unknown)
		if !strings.Contains(l.Summary, "never read") || !strings.Contains(l.Summary, "8") {
			t.Fatalf("linearizable summary should name key 8 as never read: %s", l.Summary)
		}
	})
}
