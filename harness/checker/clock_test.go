package checker

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// clockFault records a clock fault moving node's clock by offset against
// a 1m bound.
func (h *hist) clockFault(kind, node string, offset time.Duration) {
	p, err := json.Marshal(history.ClockParams{OffsetsMS: map[string]int64{node: offset.Milliseconds()}, BoundMS: 60_000})
	if err != nil {
		h.t.Fatal(err)
	}
	h.fault(history.FClock, history.FaultValue{Kind: kind, Targets: []string{node}, Params: p})
}

// clockHistory: n2's clock is moved by offset at 1s and healed at 5s.
// Around it: a write to n2 across the fault's start, one refused during
// it, one to n1 acked during it; then, if plant, one to n2 acked during
// it (what a node without the clock guard does).
func clockHistory(t *testing.T, offset time.Duration, plant bool) []history.Op {
	h := newHist(t)
	h.at(500 * time.Millisecond)
	across := h.invoke(0, history.FWrite, history.WriteValue{Events: []history.Event{{ID: "a", Entity: 1, Signal: "view"}}}, "n2")
	h.at(time.Second)
	h.clockFault("jump", "n2", offset)
	h.ack(across, 1, 2)
	h.at(2 * time.Second)
	h.write(1, "b", "n2", history.Fail, 0)
	h.write(2, "c", "n1", history.OK, 2)
	if plant {
		h.at(3 * time.Second)
		h.write(3, "d", "n2", history.OK, 3)
	}
	h.at(5 * time.Second)
	h.heal(history.FClock)
	h.write(4, "e", "n2", history.OK, 4)
	return h.ops
}

// The clock checker passes a node beyond the bound that
// refused every write sent to it while shifted, and says false, naming
// the node and its offset, when it acked one (planted); writes across the
// fault's edges are not judged. Without a shift beyond the bound it makes
// no claim; with one never confirmed it cannot decide.
func TestClockChecker(t *testing.T) {
	r, ok := Clock(clockHistory(t, 2*time.Hour, false))
	if !ok {
		t.Fatal("expected a clock result for a history with a shift beyond the bound")
	}
	mustValid(t, r, Valid)
	if d := r.Details.(ClockDetails); d.Judged != 1 || d.Writes != 1 || d.Refused != 1 {
		t.Errorf("details %+v; expected 1 shift judged, 1 write sent to n2 during it, refused", d)
	}

	r, _ = Clock(clockHistory(t, -3*time.Minute, true))
	mustValid(t, r, Invalid)
	if !strings.Contains(r.Summary, "by n2, its clock off by -3m0s") {
		t.Errorf("summary %q; expected it to name n2 and its offset", r.Summary)
	}

	if _, ok := Clock(clockHistory(t, 20*time.Second, true)); ok {
		t.Error("a shift within the bound got a clock verdict; expected no claim (the node may take writes)")
	}
	h := newHist(t)
	p, _ := json.Marshal(history.ClockParams{OffsetsMS: map[string]int64{"n2": 7_200_000}, BoundMS: 60_000})
	h.complete(h.invoke(history.Nemesis, history.FClock, history.FaultValue{Kind: "jump", Targets: []string{"n2"}, Params: p}, ""), history.Info, nil)
	h.heal(history.FClock)
	r, _ = Clock(h.ops)
	mustValid(t, r, Unknown)
}

// A node whose clock a fault moved within the bound
// keeps taking writes and stamps them with its clock; the aggregates
// model must allow their timestamps that far off (a 20s offset moves a
// 72h-decayed score by ~5e-5, far beyond the model's tolerance), and no
// further.
func TestAggregatesAllowClockOffsets(t *testing.T) {
	const off = 20_000 // ms
	events := []modelEvent{
		{delta: 4, sent: t0 - 10, acked: t0 - 5, stamp: t0 - 7 + off, outcome: history.OK, applied: true},
	}
	at := t0 + 1000
	build := func(stamp int64) []history.Op {
		events[0].stamp = stamp
		s := serve(events, at, likeModel.HalfLife)
		s.ReturnedMS = at + 1
		ops := modelHistory(t, events, &s)
		// A clock fault on n1 (the node the adds go to) around everything.
		p, _ := json.Marshal(history.ClockParams{OffsetsMS: map[string]int64{"n1": off}, BoundMS: 60_000})
		fault := []history.Op{
			{Process: history.Nemesis, Type: history.Invoke, F: history.FClock, Value: mustJSON(t, history.FaultValue{Kind: "skew", Targets: []string{"n1"}, Params: p})},
			{Process: history.Nemesis, Type: history.OK, F: history.FClock, Value: mustJSON(t, history.FaultValue{Kind: "skew", Targets: []string{"n1"}, Params: p})},
		}
		out := append(fault, ops...)
		for i := range out {
			out[i].Index = int64(i)
		}
		return out
	}
	withFault := build(t0 - 7 + off)
	mustValid(t, Aggregates(withFault, likeModel), Valid)
	// The same stamp without the fault in the history is out of bounds.
	mustValid(t, Aggregates(withFault[2:], likeModel), Invalid)
	// A stamp further off than the fault moved the clock is caught.
	mustValid(t, Aggregates(build(t0-7+3*off), likeModel), Invalid)
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
