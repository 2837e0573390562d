package checker

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// hist builds hand-written histories: each op is one millisecond after the
// previous unless at moves the clock.
type hist struct {
	t   *testing.T
	ops []history.Op
	now int64
}

func newHist(t *testing.T) *hist { return &hist{t: t} }

func (h *hist) at(d time.Duration) *hist {
	if int64(d) < h.now {
		h.t.Fatalf("hist: time going back from %d to %d", h.now, int64(d))
	}
	h.now = int64(d)
	return h
}

func (h *hist) push(op history.Op, v any) history.Op {
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			h.t.Fatal(err)
		}
		op.Value = b
	}
	op.Index = int64(len(h.ops))
	op.Time = h.now
	h.now += int64(time.Millisecond)
	h.ops = append(h.ops, op)
	return op
}

func (h *hist) invoke(p history.Process, f string, v any, node string) history.Op {
	return h.push(history.Op{Process: p, Type: history.Invoke, F: f, Node: node}, v)
}

func (h *hist) complete(inv history.Op, typ history.Type, v any) history.Op {
	op := history.Op{Process: inv.Process, Type: typ, F: inv.F, Node: inv.Node}
	if v == nil {
		op.Value = inv.Value
	}
	return h.push(op, v)
}

func (h *hist) ack(inv history.Op, seq, term uint64) history.Op {
	op := history.Op{Process: inv.Process, Type: history.OK, F: inv.F, Node: inv.Node, Seq: seq, Term: term, Value: inv.Value}
	return h.push(op, nil)
}

// write is a one-event ledger write: invoke, then completion of type typ.
func (h *hist) write(p history.Process, id, node string, typ history.Type, seq uint64) {
	inv := h.invoke(p, history.FWrite, history.WriteValue{Events: []history.Event{{ID: id, Entity: 1, Signal: "view"}}}, node)
	switch typ {
	case history.OK:
		h.ack(inv, seq, 2)
	case "":
		// left pending
	default:
		h.complete(inv, typ, nil)
	}
}

func (h *hist) fault(f string, v history.FaultValue) {
	h.complete(h.invoke(history.Nemesis, f, v, ""), history.OK, nil)
}

func (h *hist) heal(f string) {
	h.complete(h.invoke(history.Nemesis, history.HealOf(f), nil, ""), history.OK, nil)
}

func (h *hist) addInv(p history.Process, key uint64, delta int64) history.Op {
	return h.invoke(p, history.FAdd, history.AddValue{Key: key, Delta: delta}, "n1")
}

func (h *hist) readInv(p history.Process, key uint64) history.Op {
	return h.invoke(p, history.FRead, history.ReadValue{Key: key}, "n2")
}

func (h *hist) readOK(inv history.Op, value int64) history.Op {
	v, err := history.Decode[history.ReadValue](inv)
	if err != nil {
		h.t.Fatal(err)
	}
	v.Value = &value
	return h.complete(inv, history.OK, v)
}

func mustValid(t *testing.T, r Result, want Validity) {
	t.Helper()
	if r.Valid != want {
		t.Fatalf("%s: valid = %s, want %s; summary: %s", r.Name, r.Valid, want, r.Summary)
	}
	if r.Summary == "" {
		t.Fatalf("%s: empty summary", r.Name)
	}
}
