package checker

import (
	"fmt"
	"regexp"
	"strconv"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// The responses checker judges every answer a client got against what the
// API documents for a valid request. The workloads send only valid
// requests, so:
//
//   - tidal (README "The API", docs/ARCHITECTURE.md "API details"): 500
//     `internal` is documented for nothing a client sends. It is recorded
//     `info` (the node may have applied the write) and no other checker
//     sees it: a write path that refuses valid writes with 500 loses
//     nothing and doubles nothing. Any 500 is INVALID.
//   - etcd (gRPC through the gateway): `Unknown` is what etcd answers when
//     it cannot say what happened, which a fault explains (a leader lost
//     mid-request, a node stopping). One with no fault window around it is
//     reported as suspicious, a finding that leaves the verdict alone:
//     etcd's own contract does not rule it out.
//
// Both count the refusals a client is told to retry (503 unavailable, 504
// outcome unknown, 408 body too slow) per fault window, for the report's
// availability table: refusals under a partition are expected, refusals
// with no fault are the cluster's own.

// ResponseExample is one answer the checker lists: the completion's
// history index (Index, its id), its invoke's, who asked whom and when,
// what came back, and the event ids the request carried.
type ResponseExample struct {
	Index   int64    `json:"index"`
	Invoke  int64    `json:"invoke"`
	F       string   `json:"f"`
	Node    string   `json:"node"`
	Time    int64    `json:"time"` // the completion's history ns
	Status  int      `json:"status"`
	Code    string   `json:"code"`
	Error   string   `json:"error"`
	IDs     []string `json:"ids,omitempty"`
	Process int      `json:"process"`
}

func (e ResponseExample) String() string {
	s := fmt.Sprintf("op %d (%s on %s at %s): %s", e.Index, e.F, e.Node, history.FormatTime(e.Time), e.Error)
	if len(e.IDs) > 0 {
		s += fmt.Sprintf(" ids %v", e.IDs)
	}
	return s
}

// WindowRefusals counts the refusals clients got during one fault window
// (Window set) or outside every window (Window nil): completions at a
// time inside it. Windows overlap; a completion counts in each.
type WindowRefusals struct {
	Window *FaultWindow `json:"window,omitempty"`
	// Unavailable: 503 (tidal `unavailable`, etcd's gateway for
	// Unavailable). Timeout: 504, the outcome unknown. BodyTimeout: 408,
	// the body did not arrive in time.
	Unavailable int `json:"unavailable_503"`
	Timeout     int `json:"timeout_504"`
	BodyTimeout int `json:"body_timeout_408"`
}

// Label names the row: the window's label, or "no fault".
func (w WindowRefusals) Label() string {
	if w.Window == nil {
		return "no fault"
	}
	return w.Window.Label()
}

// ResponsesDetails is the Details of a responses result.
type ResponsesDetails struct {
	// Answered counts client completions that carry a server's answer
	// (ok, or a status); ByAnswer counts the error answers by "status
	// code" ("503 unavailable").
	Answered int            `json:"answered"`
	ByAnswer map[string]int `json:"by_answer,omitempty"`
	// Internal: 500s on valid requests (tidal), INVALID.
	Internal         int               `json:"internal"`
	InternalExamples []ResponseExample `json:"internal_examples,omitempty"`
	// Suspicious: etcd `Unknown` answers with no fault window around
	// them; a finding, not a violation.
	Suspicious         int               `json:"suspicious"`
	SuspiciousExamples []ResponseExample `json:"suspicious_examples,omitempty"`
	// Refusals per fault window, in window order, then outside every
	// window.
	Refusals []WindowRefusals `json:"refusals,omitempty"`
}

// UnknownGrace is how long after a fault window's end an etcd `Unknown`
// answer is still put down to it: the cluster elects and the node's
// in-flight requests drain within it.
const UnknownGrace = 2 * time.Second

// Responses is the tidal responses checker: INVALID when any client got a
// 500 (`internal`), listing the first ones (op, node, time, message, event
// ids); UNKNOWN when the history holds no client completion, or its fault
// windows cannot be read; the refusals per window in Details either way.
func Responses(ops []history.Op) Result { return responses(ops, false) }

// GRPCResponses is the responses checker of a gRPC database behind a
// gateway (etcd): `Unknown` answers with no fault window within
// UnknownGrace around the op are findings named in the summary; nothing
// in the answers alone makes it INVALID.
func GRPCResponses(ops []history.Op) Result { return responses(ops, true) }

func responses(ops []history.Op, grpc bool) Result {
	const name = "responses"
	windows, err := FaultWindows(ops)
	if err != nil {
		return unknown(name, "fault windows: %v", err)
	}
	pairs, err := history.Pairs(ops)
	if err != nil {
		return unknown(name, "%v", err)
	}
	d := ResponsesDetails{ByAnswer: map[string]int{}}
	completions := 0
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() || p.Pending {
			continue
		}
		completions++
		c := p.Completion
		if c.Type == history.OK {
			d.Answered++
			continue
		}
		status, code := answerOf(c)
		if status == 0 && code == "" {
			continue // no answer: a timeout of the client's, a cut connection
		}
		d.Answered++
		d.ByAnswer[answerLabel(status, code)]++
		ex := func() ResponseExample {
			return ResponseExample{Index: c.Index, Invoke: p.Invoke.Index, F: p.Invoke.F, Node: p.Invoke.Node, Time: c.Time,
				Status: status, Code: code, Error: c.Error, IDs: eventIDs(p.Invoke), Process: int(p.Invoke.Process)}
		}
		switch {
		case grpc && code == "Unknown":
			if !faultAround(windows, p.Invoke.Time, c.Time) {
				d.Suspicious++
				if len(d.SuspiciousExamples) < maxExamples {
					d.SuspiciousExamples = append(d.SuspiciousExamples, ex())
				}
			}
		case !grpc && (status == 500 || code == "internal"):
			d.Internal++
			if len(d.InternalExamples) < maxExamples {
				d.InternalExamples = append(d.InternalExamples, ex())
			}
		}
	}
	d.Refusals = CountRefusals(pairs, windows)
	outside := d.Refusals[len(windows)]
	if completions == 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no client op completed: no answer to judge"}
	}
	refused := fmt.Sprintf("refusals (503/504/408): %d/%d/%d under faults, %d/%d/%d outside them",
		sumRefusals(d.Refusals[:len(windows)], 503), sumRefusals(d.Refusals[:len(windows)], 504), sumRefusals(d.Refusals[:len(windows)], 408),
		outside.Unavailable, outside.Timeout, outside.BodyTimeout)
	if d.Internal > 0 {
		return Result{Name: name, Valid: Invalid, Details: d, Summary: fmt.Sprintf(
			"%d of %d answers were 500 internal to a valid request, which the API documents for none; first: %s; %s",
			d.Internal, d.Answered, d.InternalExamples[0], refused)}
	}
	s := fmt.Sprintf("%d answers, none outside the API's contract; %s", d.Answered, refused)
	if d.Suspicious > 0 {
		s = fmt.Sprintf("%d answers; finding: %d gRPC Unknown with no fault within %s of them (suspicious, not judged); first: %s; %s",
			d.Answered, d.Suspicious, UnknownGrace, d.SuspiciousExamples[0], refused)
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: s}
}

// faultAround reports whether a fault window overlaps [from, to] widened
// by UnknownGrace after each window's end.
func faultAround(windows []FaultWindow, from, to int64) bool {
	for _, w := range windows {
		if w.Start <= to && w.End+int64(UnknownGrace) >= from {
			return true
		}
	}
	return false
}

func sumRefusals(rs []WindowRefusals, status int) int {
	n := 0
	for _, r := range rs {
		switch status {
		case 503:
			n += r.Unavailable
		case 504:
			n += r.Timeout
		case 408:
			n += r.BodyTimeout
		}
	}
	return n
}

func answerLabel(status int, code string) string {
	switch {
	case status == 0:
		return code
	case code == "":
		return strconv.Itoa(status)
	}
	return strconv.Itoa(status) + " " + code
}

// Histories written before completions carried Status and Code hold the
// answer in the error message only: tidal's client writes "... 500
// internal: ...", the etcd adapter "(grpc code 2, http 500)".
var (
	tidalAnswer = regexp.MustCompile(`^tidal: [A-Z]+ [^ ]+: ([1-5][0-9]{2}) ([a-z_]+)`)
	etcdAnswer  = regexp.MustCompile(`\(grpc code ([0-9]+), http ([0-9]{3})\)`)
)

// answerOf is what the server answered op: its recorded Status and Code,
// else what its error message says.
func answerOf(op history.Op) (int, string) {
	if op.Status != 0 || op.Code != "" {
		return op.Status, op.Code
	}
	if m := tidalAnswer.FindStringSubmatch(op.Error); m != nil {
		s, _ := strconv.Atoi(m[1])
		return s, m[2]
	}
	if m := etcdAnswer.FindStringSubmatch(op.Error); m != nil {
		c, _ := strconv.Atoi(m[1])
		s, _ := strconv.Atoi(m[2])
		// Only Unknown is judged; the others keep their number.
		code := ""
		switch {
		case c == 2:
			code = "Unknown"
		case c > 0:
			code = "grpc " + m[1]
		}
		return s, code
	}
	return 0, ""
}

// eventIDs are the ids a client op's invoke carried, when it names any.
func eventIDs(inv history.Op) []string {
	switch inv.F {
	case history.FWrite:
		if v, err := history.Decode[history.WriteValue](inv); err == nil {
			ids := make([]string, 0, len(v.Events))
			for _, e := range v.Events {
				ids = append(ids, e.ID)
			}
			return ids
		}
	case history.FAdd:
		if v, err := history.Decode[history.AddValue](inv); err == nil {
			return v.IDs
		}
	case history.FPutEmbedding:
		if v, err := history.Decode[history.PutEmbeddingValue](inv); err == nil && v.ID != "" {
			return []string{v.ID}
		}
	}
	return nil
}

// CountRefusals counts the 503, 504 and 408 answers of the client ops in
// pairs per window of windows (a completion inside a window's [Start,
// End]; in each when windows overlap), and, last, those outside every
// window.
func CountRefusals(pairs []history.Pair, windows []FaultWindow) []WindowRefusals {
	out := make([]WindowRefusals, len(windows)+1)
	for i := range windows {
		out[i].Window = &windows[i]
	}
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() || p.Pending {
			continue
		}
		c := p.Completion
		status, _ := answerOf(c)
		var count func(*WindowRefusals)
		switch status {
		case 503:
			count = func(r *WindowRefusals) { r.Unavailable++ }
		case 504:
			count = func(r *WindowRefusals) { r.Timeout++ }
		case 408:
			count = func(r *WindowRefusals) { r.BodyTimeout++ }
		default:
			continue
		}
		in := false
		for i, w := range windows {
			if c.Time >= w.Start && c.Time <= w.End {
				count(&out[i])
				in = true
			}
		}
		if !in {
			count(&out[len(windows)])
		}
	}
	return out
}
