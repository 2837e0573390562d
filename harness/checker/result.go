// Package checker decides whether a chaos run kept its promises. Every
// checker is a pure function of recorded data — the history, and what was
// fetched from the nodes after the run (audits, digests, status samples) —
// and does no I/O except writing visualizations where asked, so a run can
// be re-analyzed from its store long after the cluster is gone.
//
// A checker answers true (the property held), false (it was violated, with
// evidence in Details) or unknown (the data cannot decide: a malformed
// history, a search that ran out of time, nodes that never settled).
package checker

import "fmt"

// Validity is a checker's answer. In JSON it is true, false or "unknown".
// The zero value is Unknown, so a result nobody filled in never passes.
type Validity int8

const (
	Unknown Validity = iota
	Valid
	Invalid
)

func (v Validity) String() string {
	switch v {
	case Valid:
		return "true"
	case Invalid:
		return "false"
	}
	return "unknown"
}

func (v Validity) MarshalJSON() ([]byte, error) {
	if v == Unknown {
		return []byte(`"unknown"`), nil
	}
	return []byte(v.String()), nil
}

func (v *Validity) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "true":
		*v = Valid
	case "false":
		*v = Invalid
	case `"unknown"`:
		*v = Unknown
	default:
		return fmt.Errorf("valid: expected true, false or \"unknown\", found %s", b)
	}
	return nil
}

// Result is one checker's verdict.
type Result struct {
	Name  string   `json:"name"`
	Valid Validity `json:"valid"`
	// Summary is one line a person can act on without opening Details,
	// e.g. "2 of 5120 acknowledged writes lost; first: id w-17 acked by n1
	// seq 412 term 3 at 12.3s, during partition(halves)".
	Summary string `json:"summary"`
	Details any    `json:"details,omitempty"`
}

// Compose folds checker results into one verdict: Invalid if any result
// is, else Unknown if any result is, else Valid. No results is Unknown:
// nothing was checked.
func Compose(results ...Result) Validity {
	if len(results) == 0 {
		return Unknown
	}
	out := Valid
	for _, r := range results {
		switch r.Valid {
		case Invalid:
			return Invalid
		case Unknown:
			out = Unknown
		}
	}
	return out
}

// Results is the composed verdict with its parts, in the shape
// results.json embeds.
type Results struct {
	Valid   Validity `json:"valid"`
	Results []Result `json:"results"`
}

// NewResults composes rs.
func NewResults(rs ...Result) Results { return Results{Valid: Compose(rs...), Results: rs} }

// maxExamples bounds how many instances of each kind of anomaly a result
// lists; counts are always complete.
const maxExamples = 20

func unknown(name string, format string, args ...any) Result {
	return Result{Name: name, Valid: Unknown, Summary: fmt.Sprintf(format, args...)}
}
