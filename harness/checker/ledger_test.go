package checker

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

func entry(id string, index uint64) AuditEntry {
	return AuditEntry{ID: id, Index: index, Term: 2, Entity: 1, Signal: "view"}
}

// ledgerRun is a history in which w1, w2 are acked, w3 ended info and
// landed at 12, w4 ended info and did not land, w5 failed; a partition
// isolating n3 ran from 1s to 3s, and w2 was acked inside it.
func ledgerRun(t *testing.T) (*hist, map[string][]AuditEntry) {
	h := newHist(t)
	h.write(0, "w1", "n1", history.OK, 10)
	h.at(time.Second)
	h.fault(history.FPartition, history.FaultValue{Kind: "isolate-one", Targets: []string{"n3"}})
	h.write(1, "w2", "n2", history.OK, 11)
	h.write(2, "w3", "n3", history.Info, 0)
	h.write(3, "w4", "n3", history.Info, 0)
	h.write(4, "w5", "n1", history.Fail, 0)
	h.at(3 * time.Second)
	h.heal(history.FPartition)
	good := []AuditEntry{entry("w1", 10), entry("w2", 11), entry("w3", 12)}
	audits := map[string][]AuditEntry{}
	for _, n := range []string{"n1", "n2", "n3"} {
		audits[n] = append([]AuditEntry(nil), good...)
	}
	return h, audits
}

func ledgerDetails(t *testing.T, r Result) LedgerDetails {
	t.Helper()
	d, ok := r.Details.(LedgerDetails)
	if !ok {
		t.Fatalf("details are %T", r.Details)
	}
	return d
}

func TestLedgerValid(t *testing.T) {
	h, audits := ledgerRun(t)
	r := Ledger(h.ops, audits, nil)
	mustValid(t, r, Valid)
	d := ledgerDetails(t, r)
	if d.Acked != 2 || d.Recovered.Count != 1 || d.NotLanded != 1 || d.IDs != 5 {
		t.Fatalf("acked %d recovered %d not-landed %d ids %d; want 2 1 1 5", d.Acked, d.Recovered.Count, d.NotLanded, d.IDs)
	}
	if got := d.Recovered.Examples[0]; got.ID != "w3" || got.Index != 12 {
		t.Fatalf("recovered example %+v", got)
	}
	if d.Outcomes[history.OK] != 2 || d.Outcomes[history.Info] != 2 || d.Outcomes[history.Fail] != 1 {
		t.Fatalf("outcomes %v", d.Outcomes)
	}
	// The result is what results.json will hold: it must encode.
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}

func TestLedgerLostWrite(t *testing.T) {
	h, audits := ledgerRun(t)
	audits["n3"] = []AuditEntry{entry("w1", 10)} // w2 (acked) and w3 (info) never reached n3
	r := Ledger(h.ops, audits, nil)
	mustValid(t, r, Invalid)
	d := ledgerDetails(t, r)
	if d.Lost.Count != 1 || d.Divergent.Count != 1 {
		t.Fatalf("lost %d divergent %d, want 1 and 1", d.Lost.Count, d.Divergent.Count)
	}
	l := d.Lost.Examples[0]
	if l.ID != "w2" || l.Ack.Node != "n2" || l.Ack.Seq != 11 || l.Ack.Term != 2 || !reflect.DeepEqual(l.MissingOn, []string{"n3"}) {
		t.Fatalf("lost write %+v", l)
	}
	if len(l.Faults) != 1 || l.Faults[0].Label() != "partition(isolate-one)" {
		t.Fatalf("faults around the lost write: %+v", l.Faults)
	}
	for _, want := range []string{"w2", "acked by n2 seq 11 term 2", "missing on n3", "partition(isolate-one)"} {
		if !strings.Contains(r.Summary, want) {
			t.Errorf("summary %q does not mention %q", r.Summary, want)
		}
	}
}

func TestLedgerDuplicated(t *testing.T) {
	t.Run("twice on a node", func(t *testing.T) {
		h, audits := ledgerRun(t)
		audits["n1"] = append(audits["n1"], entry("w1", 15))
		r := Ledger(h.ops, audits, nil)
		mustValid(t, r, Invalid)
		d := ledgerDetails(t, r)
		if d.Dup.Count != 1 || d.Dup.Examples[0].Reason != "twice-on-node" || !reflect.DeepEqual(d.Dup.Examples[0].Indexes["n1"], []uint64{10, 15}) {
			t.Fatalf("duplicates %+v", d.Dup)
		}
	})
	t.Run("different index on another node", func(t *testing.T) {
		h, audits := ledgerRun(t)
		audits["n2"] = []AuditEntry{entry("w1", 10), entry("w2", 13), entry("w3", 12)}
		r := Ledger(h.ops, audits, nil)
		mustValid(t, r, Invalid)
		d := ledgerDetails(t, r)
		if d.Dup.Count != 1 || d.Dup.Examples[0].Reason != "index-mismatch" || d.Dup.Examples[0].Indexes["n2"][0] != 13 {
			t.Fatalf("duplicates %+v", d.Dup)
		}
	})
}

func TestLedgerFailedButApplied(t *testing.T) {
	h, audits := ledgerRun(t)
	for n := range audits {
		audits[n] = append(audits[n], entry("w5", 14))
	}
	r := Ledger(h.ops, audits, nil)
	mustValid(t, r, Invalid)
	d := ledgerDetails(t, r)
	if d.FailedApp.Count != 1 || d.FailedApp.Examples[0].ID != "w5" || d.FailedApp.Examples[0].Outcome != history.Fail {
		t.Fatalf("failed-but-applied %+v", d.FailedApp)
	}
}

func TestLedgerUnexpected(t *testing.T) {
	h, audits := ledgerRun(t)
	audits["n2"] = append(audits["n2"], entry("ghost", 20))
	r := Ledger(h.ops, audits, nil)
	mustValid(t, r, Invalid)
	d := ledgerDetails(t, r)
	if d.Unexp.Count != 1 || d.Unexp.Examples[0].ID != "ghost" || !reflect.DeepEqual(d.Unexp.Examples[0].Nodes, []string{"n2"}) {
		t.Fatalf("unexpected %+v", d.Unexp)
	}
}

func TestLedgerDownNode(t *testing.T) {
	h, audits := ledgerRun(t)
	audits["n3"] = nil // wiped and removed: not expected to hold anything
	mustValid(t, Ledger(h.ops, audits, nil), Invalid)
	r := Ledger(h.ops, audits, []string{"n3"})
	mustValid(t, r, Valid)
	if d := ledgerDetails(t, r); !reflect.DeepEqual(d.Nodes, []string{"n1", "n2"}) || !reflect.DeepEqual(d.Removed, []string{"n3"}) {
		t.Fatalf("nodes %v unaudited %v", d.Nodes, d.Removed)
	}
	mustValid(t, Ledger(h.ops, nil, nil), Unknown)
}

// TestLedgerRetry: an id resent by a fresh process after an info is acked
// once; the first attempt's info does not make it "recovered".
func TestLedgerRetry(t *testing.T) {
	h := newHist(t)
	h.write(0, "r1", "n1", history.Info, 0)
	h.write(1, "r1", "n2", history.OK, 7)
	h.write(2, "r2", "n1", "", 0) // pending at the end: info
	audits := map[string][]AuditEntry{"n1": {entry("r1", 5)}, "n2": {entry("r1", 5)}}
	r := Ledger(h.ops, audits, nil)
	mustValid(t, r, Valid)
	d := ledgerDetails(t, r)
	if d.Acked != 1 || d.Recovered.Count != 0 || d.NotLanded != 1 || d.AckIndex.Count != 0 {
		t.Fatalf("acked %d recovered %d not-landed %d ack-mismatch %d", d.Acked, d.Recovered.Count, d.NotLanded, d.AckIndex.Count)
	}
}

func TestLedgerMalformed(t *testing.T) {
	h := newHist(t)
	h.push(history.Op{Process: 0, Type: history.Invoke, F: history.FWrite, Value: json.RawMessage(`{"events":"nope"}`)}, nil)
	mustValid(t, Ledger(h.ops, map[string][]AuditEntry{"n1": nil}, nil), Unknown)
	h = newHist(t)
	h.push(history.Op{Process: 0, Type: history.OK, F: history.FWrite}, nil)
	r := Ledger(h.ops, map[string][]AuditEntry{"n1": nil}, nil)
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "expected an outstanding invoke") {
		t.Fatalf("summary %q", r.Summary)
	}
}

func TestReadAudit(t *testing.T) {
	in := `{"id":"a","index":3,"term":1,"entity":9,"signal":"like"}` + "\n\n" + `{"id":"b","index":4,"term":1,"entity":9,"signal":"view"}`
	got, err := ReadAudit(strings.NewReader(in))
	if err != nil || len(got) != 2 || got[1].ID != "b" || got[0].Signal != "like" {
		t.Fatalf("got %+v, %v", got, err)
	}
	_, err = ReadAudit(strings.NewReader(in + "\n{\"index\":5}\n"))
	if err == nil || !strings.Contains(err.Error(), "audit line 4: expected a non-empty id") {
		t.Fatalf("got %v", err)
	}
}

// TestLedgerTestdata checks the example run shipped in testdata: a history
// and the audits of its three nodes, in which n3 lost one acknowledged
// write during a partition.
func TestLedgerTestdata(t *testing.T) {
	ops, err := history.Read("testdata/ledger-partition.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	audits := map[string][]AuditEntry{}
	for _, n := range []string{"n1", "n2", "n3"} {
		f, err := os.Open(filepath.Join("testdata", "ledger-partition", n+".ndjson"))
		if err != nil {
			t.Fatal(err)
		}
		audits[n], err = ReadAudit(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	r := Ledger(ops, audits, nil)
	mustValid(t, r, Invalid)
	d := ledgerDetails(t, r)
	if d.Lost.Count != 1 || d.Lost.Examples[0].ID != "e-3" || !reflect.DeepEqual(d.Lost.Examples[0].MissingOn, []string{"n3"}) {
		t.Fatalf("lost %+v", d.Lost)
	}
	// Without n3 the rest of the cluster is whole.
	mustValid(t, Ledger(ops, audits, []string{"n3"}), Valid)
}

func TestFaultWindows(t *testing.T) {
	h := newHist(t)
	h.at(1 * time.Second)
	part := h.invoke(history.Nemesis, history.FPartition, history.FaultValue{Kind: "halves", Targets: []string{"n1", "n2"}}, "")
	h.at(1200 * time.Millisecond)
	h.complete(part, history.OK, nil)
	h.at(2 * time.Second)
	kill := h.invoke(history.Nemesis, history.FKill, history.FaultValue{Kind: "leader"}, "")
	h.complete(kill, history.Fail, nil) // never happened: no window
	h.at(5 * time.Second)
	h.heal(history.FPartition) // ok at 5.001s
	h.at(6 * time.Second)
	h.fault(history.FTransferLeader, history.FaultValue{Instant: true}) // 6s..6.001s
	h.at(7 * time.Second)
	h.fault(history.FPause, history.FaultValue{Kind: "one", Targets: []string{"n2"}})
	h.at(9 * time.Second)
	h.complete(h.invoke(history.Nemesis, history.HealAll, nil, ""), history.OK, nil) // ok at 9.001s
	h.at(10 * time.Second)
	h.invoke(history.Nemesis, history.FSlow, history.FaultValue{Kind: "latency"}, "") // pending, never healed
	h.at(12 * time.Second)
	h.write(0, "x", "n1", history.OK, 1) // last op at 12.001s

	ws, err := FaultWindows(h.ops)
	if err != nil {
		t.Fatal(err)
	}
	ms := func(n int64) int64 { return n * int64(time.Millisecond) }
	want := []FaultWindow{
		{F: "partition", Kind: "halves", Targets: []string{"n1", "n2"}, Start: ms(1000), Effective: ms(1200), End: ms(5001), Healed: true},
		{F: "transfer-leader", Start: ms(6000), Effective: ms(6001), End: ms(6001), Healed: true},
		{F: "pause", Kind: "one", Targets: []string{"n2"}, Start: ms(7000), Effective: ms(7001), End: ms(9001), Healed: true},
		{F: "slow", Kind: "latency", Start: ms(10000), Effective: -1, End: ms(12001)},
	}
	if !reflect.DeepEqual(ws, want) {
		t.Fatalf("windows:\n got %+v\nwant %+v", ws, want)
	}
	if s := ws[3].String(); !strings.Contains(s, "never healed") {
		t.Fatalf("open window %q", s)
	}
}

func TestValidityJSON(t *testing.T) {
	for v, s := range map[Validity]string{Valid: "true", Invalid: "false", Unknown: `"unknown"`} {
		b, err := json.Marshal(v)
		if err != nil || string(b) != s {
			t.Fatalf("marshal %s: %s %v", v, b, err)
		}
		var back Validity
		if err := json.Unmarshal(b, &back); err != nil || back != v {
			t.Fatalf("unmarshal %s: %s %v", b, back, err)
		}
	}
	var v Validity
	if err := json.Unmarshal([]byte(`"true"`), &v); err == nil {
		t.Fatal(`"true" (a string) accepted as validity`)
	}
}

func TestCompose(t *testing.T) {
	r := func(v Validity) Result { return Result{Valid: v} }
	for _, tc := range []struct {
		in   []Result
		want Validity
	}{
		{nil, Unknown},
		{[]Result{r(Valid), r(Valid)}, Valid},
		{[]Result{r(Valid), r(Unknown)}, Unknown},
		{[]Result{r(Unknown), r(Invalid), r(Valid)}, Invalid},
		{[]Result{{}}, Unknown}, // an unfilled result never passes
	} {
		if got := Compose(tc.in...); got != tc.want {
			t.Errorf("Compose(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
	b, _ := json.Marshal(NewResults(r(Valid), r(Invalid)))
	if !strings.HasPrefix(string(b), `{"valid":false,`) {
		t.Fatalf("results.json shape: %s", b)
	}
}

// BenchmarkLedger checks a history of 1M ops (500k one-event writes, a
// few info and fail) against three nodes' audits.
func BenchmarkLedger(b *testing.B) {
	const writes = 500_000
	ops := make([]history.Op, 0, 2*writes)
	audit := make([]AuditEntry, 0, writes)
	for i := 0; i < writes; i++ {
		id := fmt.Sprintf("w-%d", i)
		v := json.RawMessage(fmt.Sprintf(`{"events":[{"id":%q,"entity":%d,"signal":"view"}]}`, id, i%1000))
		p := history.Process(i)
		ops = append(ops, history.Op{Index: int64(2 * i), Time: int64(2 * i), Process: p, Type: history.Invoke, F: history.FWrite, Value: v, Node: "n1"})
		typ := history.OK
		switch i % 100 {
		case 7:
			typ = history.Info
		case 9:
			typ = history.Fail
		}
		ops = append(ops, history.Op{Index: int64(2*i + 1), Time: int64(2*i + 1), Process: p, Type: typ, F: history.FWrite, Value: v, Node: "n1", Seq: uint64(i + 1), Term: 1})
		if typ != history.Fail {
			audit = append(audit, AuditEntry{ID: id, Index: uint64(i + 1), Term: 1, Entity: uint64(i % 1000), Signal: "view"})
		}
	}
	audits := map[string][]AuditEntry{"n1": audit, "n2": audit, "n3": audit}
	b.ResetTimer()
	for b.Loop() {
		if r := Ledger(ops, audits, nil); r.Valid != Valid {
			b.Fatalf("valid = %s: %s", r.Valid, r.Summary)
		}
	}
	b.ReportMetric(float64(len(ops))*float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

func TestLedgerAtTellsUnreplicatedFromLost(t *testing.T) {
	h, audits := ledgerRun(t)
	audits["n3"] = []AuditEntry{entry("w1", 10)} // w2 (acked at 11) never reached n3
	// n3 had applied only index 10: it is behind, not lossy.
	r := LedgerAt(h.ops, audits, map[string]uint64{"n1": 12, "n2": 12, "n3": 10}, nil)
	mustValid(t, r, Unknown)
	d := ledgerDetails(t, r)
	if d.Lost.Count != 0 || d.Unreplicated.Count != 1 || d.Unreplicated.Examples[0].ID != "w2" {
		t.Fatalf("lost %d unreplicated %+v, want w2 unreplicated", d.Lost.Count, d.Unreplicated)
	}
	// n3 had applied past index 11 and still lacks w2: lost.
	r = LedgerAt(h.ops, audits, map[string]uint64{"n1": 12, "n2": 12, "n3": 12}, nil)
	mustValid(t, r, Invalid)
	if d := ledgerDetails(t, r); d.Lost.Count != 1 || d.Unreplicated.Count != 0 {
		t.Fatalf("lost %d unreplicated %d, want 1 and 0", d.Lost.Count, d.Unreplicated.Count)
	}
}

// Regression: the ledger said true over a run in which
// no write was acknowledged ("all 0 acknowledged ids present"): every
// acked write survived because there were none. It is unknown now, and
// still invalid when something no client sent, or a failed write, landed.
func TestLedgerWithNoAcknowledgedWriteIsUnknown(t *testing.T) {
	h := newHist(t)
	h.write(0, "w1", "n1", history.Info, 0)
	h.write(1, "w2", "n2", history.Fail, 0)
	audits := map[string][]AuditEntry{"n1": nil, "n2": nil, "n3": nil}
	r := Ledger(h.ops, audits, nil)
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "no write was acknowledged") {
		t.Fatalf("expected the summary to say no write was acknowledged, found %q", r.Summary)
	}
	for _, n := range []string{"n1", "n2", "n3"} {
		audits[n] = []AuditEntry{entry("w2", 10)}
	}
	mustValid(t, Ledger(h.ops, audits, nil), Invalid)
}

// ackDup acknowledges inv at seq with X-Tidal-Duplicates dup recorded in
// the ok's value.
func (h *hist) ackDup(inv history.Op, seq uint64, dup int) history.Op {
	v, err := history.Decode[history.WriteValue](inv)
	if err != nil {
		h.t.Fatal(err)
	}
	v.Duplicates = &dup
	b, _ := json.Marshal(v)
	return h.push(history.Op{Process: inv.Process, Type: history.OK, F: inv.F, Node: inv.Node, Seq: seq, Term: 2, Value: b}, nil)
}

// The audit reads the id memory; the entity counts read the applied
// state. A node whose memory is empty but whose counts hold every
// acknowledged event has not lost writes.
func TestLedgerTellsAShortIDMemoryFromLostWrites(t *testing.T) {
	t.Run("Regression: emptied id memory is not lost writes", func(t *testing.T) {
		h, audits := ledgerRun(t)
		audits["n3"] = nil // the id memory of n3 is empty
		state := map[string]EntityCounts{"n1": {1: {"view": 3}}, "n2": {1: {"view": 3}}, "n3": {1: {"view": 3}}}
		// w3 (info, landed) is on n1 and n2 only by the audits: with n3's
		// memory empty it reads as divergent; drop it from the picture.
		for _, n := range []string{"n1", "n2"} {
			audits[n] = audits[n][:2]
		}
		state["n1"][1]["view"], state["n2"][1]["view"], state["n3"][1]["view"] = 2, 2, 2
		r := LedgerWithState(h.ops, audits, nil, Coverage{}, state)
		mustValid(t, r, Unknown)
		d := ledgerDetails(t, r)
		if d.Lost.Count != 0 || d.MemoryShort.Count != 2 {
			t.Fatalf("expected 0 lost and 2 ids put down to a short id memory, found %d lost, %d memory-short: %s", d.Lost.Count, d.MemoryShort.Count, r.Summary)
		}
		if !strings.Contains(r.Summary, "the id memory is missing or smaller than the applied state") || !strings.Contains(r.Summary, "n3 remembers 0 ids, its applied state holds 2 events") {
			t.Fatalf("summary should say the id memory is short on n3: %s", r.Summary)
		}
		// Judged on the audits alone, the same run reads as lost writes.
		mustValid(t, LedgerCovering(h.ops, audits, nil, Coverage{}), Invalid)
	})
	t.Run("counts short of the acknowledged events are lost writes", func(t *testing.T) {
		h, audits := ledgerRun(t)
		audits["n3"] = nil
		for _, n := range []string{"n1", "n2"} {
			audits[n] = audits[n][:2]
		}
		state := map[string]EntityCounts{"n1": {1: {"view": 2}}, "n2": {1: {"view": 2}}, "n3": {1: {"view": 1}}}
		r := LedgerWithState(h.ops, audits, nil, Coverage{}, state)
		mustValid(t, r, Invalid)
		if d := ledgerDetails(t, r); d.Lost.Count != 2 || !strings.Contains(r.Summary, "n3: 1 view events applied on entity 1, 2 acknowledged") {
			t.Fatalf("expected 2 lost ids with n3's counts as evidence, found %d: %s", d.Lost.Count, r.Summary)
		}
	})
	t.Run("a memory naming every applied event proves the id missing", func(t *testing.T) {
		h, audits := ledgerRun(t)
		// n3 remembers w1 and w3 and its counts hold exactly those two:
		// w2 was not applied there, whatever the counts cover.
		audits["n3"] = []AuditEntry{entry("w1", 10), entry("w3", 12)}
		state := map[string]EntityCounts{"n1": {1: {"view": 3}}, "n2": {1: {"view": 3}}, "n3": {1: {"view": 2}}}
		r := LedgerWithState(h.ops, audits, nil, Coverage{}, state)
		mustValid(t, r, Invalid)
		if d := ledgerDetails(t, r); d.Lost.Count != 1 || d.Lost.Examples[0].ID != "w2" {
			t.Fatalf("expected w2 lost on n3, found %+v: %s", d.Lost, r.Summary)
		}
	})
}

// A write sent once whose ack counted no duplicates was applied where the
// ack says; found at another index, it was proposed and applied twice.
func TestLedgerAckAtAnotherIndexIsInvalid(t *testing.T) {
	run := func(t *testing.T, dup int) Result {
		h := newHist(t)
		inv := h.invoke(0, history.FWrite, history.WriteValue{Events: []history.Event{{ID: "w1", Entity: 1, Signal: "view"}}}, "n1")
		if dup < 0 {
			h.ack(inv, 10, 2)
		} else {
			h.ackDup(inv, 10, dup)
		}
		audits := map[string][]AuditEntry{"n1": {entry("w1", 13)}, "n2": {entry("w1", 13)}}
		return Ledger(h.ops, audits, nil)
	}
	t.Run("Regression: ack index mismatch without duplicates", func(t *testing.T) {
		r := run(t, 0)
		mustValid(t, r, Invalid)
		if d := ledgerDetails(t, r); d.DoubleApplied.Count != 1 || !strings.Contains(r.Summary, "double proposal") {
			t.Fatalf("expected one double-applied write named in the summary, found %d: %s", d.DoubleApplied.Count, r.Summary)
		}
	})
	t.Run("an ack that counted a duplicate is informational", func(t *testing.T) {
		r := run(t, 1)
		mustValid(t, r, Valid)
		if d := ledgerDetails(t, r); d.AckIndex.Count != 1 || d.DoubleApplied.Count != 0 {
			t.Fatalf("expected one informational mismatch, found %d (double %d)", d.AckIndex.Count, d.DoubleApplied.Count)
		}
	})
	t.Run("a history without the ack's duplicates is informational", func(t *testing.T) {
		mustValid(t, run(t, -1), Valid)
	})
}
