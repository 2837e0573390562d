package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// answered completes inv as a fail or info carrying the server's answer.
func (h *hist) answered(inv history.Op, typ history.Type, status int, code, msg string) history.Op {
	return h.push(history.Op{Process: inv.Process, Type: typ, F: inv.F, Node: inv.Node, Value: inv.Value,
		Status: status, Code: code, Error: msg}, nil)
}

func writeInv(h *hist, p history.Process, id, node string) history.Op {
	return h.invoke(p, history.FWrite, history.WriteValue{Events: []history.Event{{ID: id, Entity: 1, Signal: "view"}}}, node)
}

// Regression: 500 on a valid write — recorded info and judged by no
// checker, so a write path refusing 5% of valid writes with 500 passed.
func TestResponsesInternalOnValidWriteIsInvalid(t *testing.T) {
	h := newHist(t)
	h.write(0, "w-1", "n1", history.OK, 10)
	inv := writeInv(h, 1, "w-2", "n2")
	h.answered(inv, history.Info, 500, "internal", "tidal: POST /v1/signals: 500 internal: boom (outcome unknown)")
	h.write(2, "w-3", "n1", history.OK, 11)
	r := Responses(h.ops)
	mustValid(t, r, Invalid)
	d := r.Details.(ResponsesDetails)
	if d.Internal != 1 || len(d.InternalExamples) != 1 {
		t.Fatalf("expected 1 internal answer listed, found %d (%d listed)", d.Internal, len(d.InternalExamples))
	}
	ex := d.InternalExamples[0]
	if ex.Node != "n2" || ex.F != history.FWrite || len(ex.IDs) != 1 || ex.IDs[0] != "w-2" || !strings.Contains(ex.Error, "boom") {
		t.Fatalf("example: expected the write w-2 on n2 with its message, found %+v", ex)
	}
	if !strings.Contains(r.Summary, "w-2") || !strings.Contains(r.Summary, "n2") {
		t.Fatalf("summary should name the op's ids and node: %s", r.Summary)
	}
}

func TestResponsesWithoutInternalIsValid(t *testing.T) {
	h := newHist(t)
	h.write(0, "w-1", "n1", history.OK, 10)
	inv := writeInv(h, 1, "w-2", "n2")
	h.answered(inv, history.Fail, 503, "unavailable", "tidal: POST /v1/signals: 503 unavailable: no leader")
	inv = writeInv(h, 2, "w-3", "n2")
	h.answered(inv, history.Info, 504, "timeout", "tidal: POST /v1/signals: 504 timeout: x (outcome unknown)")
	mustValid(t, Responses(h.ops), Valid)
}

func TestResponsesNoClientOpIsUnknown(t *testing.T) {
	h := newHist(t)
	h.fault("partition", history.FaultValue{Kind: "halves"})
	mustValid(t, Responses(h.ops), Unknown)
}

// A history from before completions carried status and code: the answer
// is read off the client's error message.
func TestResponsesReadsOldHistoriesFromTheMessage(t *testing.T) {
	h := newHist(t)
	inv := writeInv(h, 1, "w-2", "n2")
	h.answered(inv, history.Info, 0, "", "tidal: POST /v1/signals: 500 internal: boom (outcome unknown)")
	mustValid(t, Responses(h.ops), Invalid)
}

func TestResponsesCountsRefusalsPerFaultWindow(t *testing.T) {
	h := newHist(t)
	h.write(0, "w-0", "n1", history.OK, 1)
	inv := writeInv(h, 1, "w-1", "n1")
	h.answered(inv, history.Fail, 503, "unavailable", "no leader") // outside
	h.at(time.Second)
	h.fault("partition", history.FaultValue{Kind: "halves"})
	for i, st := range []int{503, 503, 504, 408} {
		inv := writeInv(h, history.Process(10+i), "w", "n2")
		h.answered(inv, history.Info, st, "", "x")
	}
	h.heal("partition")
	r := Responses(h.ops)
	mustValid(t, r, Valid)
	rs := r.Details.(ResponsesDetails).Refusals
	if len(rs) != 2 || rs[0].Window == nil || rs[1].Window != nil {
		t.Fatalf("expected one row for the partition and one outside faults, found %+v", rs)
	}
	if rs[0].Unavailable != 2 || rs[0].Timeout != 1 || rs[0].BodyTimeout != 1 {
		t.Fatalf("partition row: expected 2 503s, 1 504, 1 408, found %+v", rs[0])
	}
	if rs[1].Unavailable != 1 || rs[1].Label() != "no fault" {
		t.Fatalf("outside row: expected 1 503, found %+v", rs[1])
	}
}

func TestGRPCResponsesUnknownWithoutFaultIsAFinding(t *testing.T) {
	h := newHist(t)
	h.write(0, "w-0", "n1", history.OK, 1)
	inv := writeInv(h, 1, "w-1", "n1")
	h.answered(inv, history.Info, 500, "Unknown", "etcd: boom (grpc code 2, http 500)")
	r := GRPCResponses(h.ops)
	mustValid(t, r, Valid)
	if d := r.Details.(ResponsesDetails); d.Suspicious != 1 || !strings.Contains(r.Summary, "finding") {
		t.Fatalf("expected one suspicious Unknown named in the summary, found %d: %s", d.Suspicious, r.Summary)
	}

	// The same answer inside a fault window is explained by the fault.
	h = newHist(t)
	h.write(0, "w-0", "n1", history.OK, 1)
	h.fault("kill", history.FaultValue{Kind: "leader"})
	inv = writeInv(h, 1, "w-1", "n1")
	h.answered(inv, history.Info, 0, "", "etcd: boom (grpc code 2, http 500)")
	h.heal("kill")
	r = GRPCResponses(h.ops)
	mustValid(t, r, Valid)
	if d := r.Details.(ResponsesDetails); d.Suspicious != 0 {
		t.Fatalf("expected an Unknown under a fault not to be suspicious, found %d: %s", d.Suspicious, r.Summary)
	}
}
