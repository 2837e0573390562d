package checker

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"
)

// KeySearch is the outcome of porcupine's search on one key's operations.
type KeySearch struct {
	Result        string // "ok", "illegal", "unknown" (timed out or not reached)
	Visualization string // porcupine's HTML, written for an illegal key
	Error         string
}

// SearchKeys runs porcupine's search with model on each key's operations,
// in the order given, sharing timeout among them: each key gets what is
// left of it divided by the keys left, so the keys that settle at once
// (put them first) leave their share to the rest. A zero timeout is no
// bound. For an illegal key, visualize (when non-nil) writes porcupine's
// HTML and returns its path. size(i) describes key i's size for the error
// of an undecided key ("120 ops, 3 pending adds"). It is the search of
// every per-key linearizability checker (the counter's here, etcd's
// register in harness/db/etcd).
func SearchKeys(model porcupine.Model, perKey [][]porcupine.Operation, timeout time.Duration,
	visualize func(i int, info porcupine.LinearizationInfo) (string, error), size func(i int) string) []KeySearch {
	out := make([]KeySearch, len(perKey))
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	for i, ops := range perKey {
		ks := &out[i]
		ks.Result = "unknown"
		budget := time.Duration(0)
		if !deadline.IsZero() {
			if budget = time.Until(deadline) / time.Duration(len(perKey)-i); budget <= 0 {
				ks.Error = "not checked: the time budget ran out on earlier keys"
				continue
			}
		}
		res, info := porcupine.CheckOperationsVerbose(model, ops, budget)
		switch res {
		case porcupine.Ok:
			ks.Result = "ok"
		case porcupine.Illegal:
			ks.Result = "illegal"
			if visualize != nil {
				if path, err := visualize(i, info); err != nil {
					ks.Error = err.Error()
				} else {
					ks.Visualization = path
				}
			}
		default:
			ks.Error = fmt.Sprintf("search did not finish within its share %v of the %v budget (%s)", budget.Round(time.Millisecond), timeout, size(i))
		}
	}
	return out
}

// Tally counts the illegal and the unknown (undecided) keys of a search.
func Tally(searched []KeySearch) (illegal, unknown int) {
	for _, ks := range searched {
		switch ks.Result {
		case "illegal":
			illegal++
		case "unknown":
			unknown++
		}
	}
	return illegal, unknown
}

// VisualizeWithFaults writes porcupine's HTML of info to path, with the
// nemesis faults as a row of their own below the clients, so a reader
// sees what was broken when.
func VisualizeWithFaults(model porcupine.Model, info porcupine.LinearizationInfo, windows []FaultWindow, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("visualization: %w", err)
	}
	anns := make([]porcupine.Annotation, 0, len(windows))
	for _, w := range windows {
		anns = append(anns, porcupine.Annotation{
			Tag: "nemesis", Start: w.Start, End: w.End,
			Description: w.Label(), Details: w.String(), BackgroundColor: "#f4c7c3",
		})
	}
	info.AddAnnotations(anns)
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		return fmt.Errorf("writing visualization %s: %w", path, err)
	}
	return nil
}
