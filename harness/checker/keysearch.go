package checker

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tidaldb/tidal/harness/history"
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

// KeyedOps gathers one porcupine history per key from a paired client
// history: each key's processes get dense client ids of their own (the
// visualization shows one row per client of that key), and an operation
// whose outcome is unknown never returns, so the search may place its
// effect anywhere after its call or nowhere. It is the collection step of
// every per-key linearizability checker; Search is the rest.
type KeyedOps[K cmp.Ordered] struct {
	ops     map[K][]porcupine.Operation
	pending map[K]int
	clients map[K]map[history.Process]int
}

// NewKeyedOps returns an empty KeyedOps.
func NewKeyedOps[K cmp.Ordered]() *KeyedOps[K] {
	return &KeyedOps[K]{ops: map[K][]porcupine.Operation{}, pending: map[K]int{}, clients: map[K]map[history.Process]int{}}
}

// Add records p's operation on key with the model's input and output.
// pending marks an operation whose outcome is unknown (its return is
// placed at the end of time and it counts as pending for the key).
func (h *KeyedOps[K]) Add(key K, p history.Pair, input, output any, pending bool) {
	ids := h.clients[key]
	if ids == nil {
		ids = map[history.Process]int{}
		h.clients[key] = ids
	}
	cid, ok := ids[p.Invoke.Process]
	if !ok {
		cid = len(ids)
		ids[p.Invoke.Process] = cid
	}
	ret := p.Completion.Time
	if pending {
		ret = math.MaxInt64
		h.pending[key]++
	}
	h.ops[key] = append(h.ops[key], porcupine.Operation{
		ClientId: cid, Input: input, Output: output, Call: p.Invoke.Time, Return: ret,
		Metadata: fmt.Sprintf("op %d, process %s via %s: %s", p.Invoke.Index, p.Invoke.Process, p.Invoke.Node, p.Type()),
	})
}

// KeyOutcome is one key's search: its size and porcupine's verdict.
type KeyOutcome[K cmp.Ordered] struct {
	Key     K
	Ops     int
	Pending int
	KeySearch
}

// Search runs SearchKeys over every key, the keys that settle at once
// first (fewest pending operations, then fewest operations) so that what
// they leave of the budget goes to the rest. It returns the outcomes in
// key order and the counts of illegal and undecided keys. pendingWord
// names a pending operation in the error of an undecided key ("adds").
func (h *KeyedOps[K]) Search(model porcupine.Model, timeout time.Duration, pendingWord string,
	visualize func(key K, info porcupine.LinearizationInfo) (string, error)) (out []KeyOutcome[K], illegal, unknown int) {
	keys := make([]K, 0, len(h.ops))
	for k := range h.ops {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b K) int {
		return cmp.Or(cmp.Compare(h.pending[a], h.pending[b]), cmp.Compare(len(h.ops[a]), len(h.ops[b])), cmp.Compare(a, b))
	})
	ordered := make([][]porcupine.Operation, len(keys))
	for i, k := range keys {
		ordered[i] = h.ops[k]
	}
	var vis func(int, porcupine.LinearizationInfo) (string, error)
	if visualize != nil {
		vis = func(i int, info porcupine.LinearizationInfo) (string, error) { return visualize(keys[i], info) }
	}
	searched := SearchKeys(model, ordered, timeout, vis, func(i int) string {
		return fmt.Sprintf("%d ops, %d pending %s", len(h.ops[keys[i]]), h.pending[keys[i]], pendingWord)
	})
	out = make([]KeyOutcome[K], len(keys))
	for i, k := range keys {
		out[i] = KeyOutcome[K]{Key: k, Ops: len(h.ops[k]), Pending: h.pending[k], KeySearch: searched[i]}
	}
	slices.SortFunc(out, func(a, b KeyOutcome[K]) int { return cmp.Compare(a.Key, b.Key) })
	illegal, unknown = Tally(searched)
	return out, illegal, unknown
}
