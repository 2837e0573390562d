// Package history records what the clients and the nemesis of a chaos run
// did, one operation per line of JSON (history.jsonl), and reads it back.
//
// The format is the contract between the workload and nemesis (which write
// it) and the checkers (which only ever read it), so a run can be analyzed
// again, long after the cluster is gone, from its store alone:
//
//	{"index":7,"time":1523000,"process":3,"type":"invoke","f":"write","value":{...},"node":"n1"}
//	{"index":9,"time":4121000,"process":3,"type":"ok","f":"write","value":{...},"node":"n1","seq":42,"term":2}
//	{"index":10,"time":4200000,"process":"nemesis","type":"invoke","f":"partition","value":{"kind":"halves",...}}
//
// Semantics follow Jepsen. Every operation is an invoke followed, later, by
// at most one completion from the same process: ok (it happened), fail (it
// certainly did not happen) or info (unknown: it may happen at any time
// after the invoke, even after the run ends). A process whose operation
// ended in info never invokes again; the workload continues with a fresh
// process id. An invoke with no completion in the file counts as info.
//
// Invariants of a history written by a Recorder: index starts at 0 and
// increases by one per line; time (ns since the recorder started, from the
// monotonic clock) never decreases along index, because both are assigned
// under one lock. Checkers may therefore read real-time order off either.
package history

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// Process identifies who performed an operation: a client (0, 1, 2, ...)
// or the nemesis. In JSON a client is a number and the nemesis is the
// string "nemesis".
type Process int

// Nemesis is the process that injects and heals faults.
const Nemesis Process = -1

// IsClient reports whether p is a client process rather than the nemesis.
func (p Process) IsClient() bool { return p >= 0 }

func (p Process) String() string {
	if p == Nemesis {
		return "nemesis"
	}
	return strconv.Itoa(int(p))
}

// MarshalJSON encodes clients as numbers and the nemesis as "nemesis".
func (p Process) MarshalJSON() ([]byte, error) {
	if p == Nemesis {
		return []byte(`"nemesis"`), nil
	}
	if p < 0 {
		return nil, fmt.Errorf("history: process %d: expected a client id >= 0 or Nemesis", int(p))
	}
	return strconv.AppendInt(nil, int64(p), 10), nil
}

// UnmarshalJSON accepts a non-negative integer or the string "nemesis".
func (p *Process) UnmarshalJSON(b []byte) error {
	if string(b) == `"nemesis"` {
		*p = Nemesis
		return nil
	}
	n, err := strconv.ParseInt(string(b), 10, 32)
	if err != nil || n < 0 {
		return fmt.Errorf("process: expected a non-negative integer or \"nemesis\", found %s", b)
	}
	*p = Process(n)
	return nil
}

// Type is the kind of a history line.
type Type string

const (
	Invoke Type = "invoke"
	OK     Type = "ok"
	Fail   Type = "fail" // certainly not applied
	Info   Type = "info" // outcome unknown; the process retires
)

func (t Type) valid() bool { return t == Invoke || t == OK || t == Fail || t == Info }

// IsCompletion reports whether t ends an operation.
func (t Type) IsCompletion() bool { return t == OK || t == Fail || t == Info }

// Operation names (Op.F) of the workloads. Values are the typed structs in
// values.go.
const (
	FWrite        = "write"         // ledger workload: WriteValue
	FAdd          = "add"           // counter workload: AddValue
	FRead         = "read"          // counter workload: ReadValue
	FPutEmbedding = "put-embedding" // PutEmbeddingValue
	FGetEmbedding = "get-embedding" // GetEmbeddingValue
)

// Op is one line of a history.
type Op struct {
	Index   int64           `json:"index"`
	Time    int64           `json:"time"` // ns since the recorder started
	Process Process         `json:"process"`
	Type    Type            `json:"type"`
	F       string          `json:"f"`
	Value   json.RawMessage `json:"value,omitempty"`
	Node    string          `json:"node,omitempty"`  // the node the client talked to, e.g. "n1"
	Error   string          `json:"error,omitempty"` // why a completion is fail or info
	Seq     uint64          `json:"seq,omitempty"`   // ok writes: raft log index of the entry (X-Tidal-Seq)
	Term    uint64          `json:"term,omitempty"`  // ok writes: its term (X-Tidal-Term)
	// Status and Code are what the server answered a completion that is
	// not ok, when it answered at all (a timeout or a cut connection has
	// neither): the HTTP status (500) and the API's error code (tidal's
	// "internal", "unavailable"; etcd's gRPC code name, "Unknown"). The
	// responses checker judges them against what the API documents.
	Status int    `json:"status,omitempty"`
	Code   string `json:"code,omitempty"`
}

// Answered is implemented by an error that carries a server's answer: the
// HTTP status and the API's error code. The Recorder fills a completion's
// Status and Code from the first such error in its chain.
type Answered interface {
	Answer() (status int, code string)
}

func (o Op) String() string {
	return fmt.Sprintf("op %d (process %s %s %s at %s)", o.Index, o.Process, o.Type, o.F, FormatTime(o.Time))
}

// FormatTime renders a history time (ns since start) as seconds, the unit
// people read run timelines in.
func FormatTime(ns int64) string {
	return strconv.FormatFloat(float64(ns)/1e9, 'f', 3, 64) + "s"
}

// Decode unmarshals the op's value into T, with an error naming the op.
func Decode[T any](o Op) (T, error) {
	var v T
	if len(o.Value) == 0 {
		return v, fmt.Errorf("%s: expected a %T value, found none", o, v)
	}
	if err := json.Unmarshal(o.Value, &v); err != nil {
		return v, fmt.Errorf("%s: expected a %T value: %w", o, v, err)
	}
	return v, nil
}
