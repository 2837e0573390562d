package history

import "fmt"

// Pair is an operation: its invoke and its completion.
type Pair struct {
	Invoke     Op
	Completion Op
	// Pending is set when the history holds no completion (the run ended
	// or crashed first). Completion is then a synthesized Info op with
	// Index -1, the time of the history's last op and no value.
	Pending bool
}

// Type is the outcome of the operation (Info when pending).
func (p Pair) Type() Type { return p.Completion.Type }

// Pairs matches every invoke with its completion and returns the
// operations in invoke order.
//
// A client process has at most one operation in flight, and never invokes
// again after an info completion (Jepsen's rule; the workload continues
// with a new process id). The nemesis may run several faults at once, so
// its completions are matched to the oldest outstanding invoke with the
// same f. Anything else (a completion nobody invoked, a second invoke in
// flight, a client coming back after info) is an error naming the op.
func Pairs(ops []Op) ([]Pair, error) {
	pairs := make([]Pair, 0, len(ops)/2+1)
	inFlight := make(map[Process]int)  // client -> index into pairs
	retired := make(map[Process]int64) // client -> index of its info op
	nemesis := make(map[string][]int)  // f -> queue of indexes into pairs
	var last int64
	for _, op := range ops {
		last = op.Time
		if op.Type == Invoke {
			pairs = append(pairs, Pair{Invoke: op})
			i := len(pairs) - 1
			if op.Process == Nemesis {
				nemesis[op.F] = append(nemesis[op.F], i)
				continue
			}
			if j, busy := inFlight[op.Process]; busy {
				return nil, fmt.Errorf("history: %s: expected process %s to be idle, found its op %d still in flight", op, op.Process, pairs[j].Invoke.Index)
			}
			if at, ok := retired[op.Process]; ok {
				return nil, fmt.Errorf("history: %s: expected process %s to stay retired after its info op %d", op, op.Process, at)
			}
			inFlight[op.Process] = i
			continue
		}

		var i int
		if op.Process == Nemesis {
			q := nemesis[op.F]
			if len(q) == 0 {
				return nil, fmt.Errorf("history: %s: expected an outstanding nemesis %s invoke, found none", op, op.F)
			}
			i, nemesis[op.F] = q[0], q[1:]
		} else {
			j, ok := inFlight[op.Process]
			if !ok {
				return nil, fmt.Errorf("history: %s: expected an outstanding invoke of process %s, found none", op, op.Process)
			}
			if f := pairs[j].Invoke.F; f != op.F {
				return nil, fmt.Errorf("history: %s: expected completion of %s (op %d), found f %s", op, f, pairs[j].Invoke.Index, op.F)
			}
			delete(inFlight, op.Process)
			if op.Type == Info {
				retired[op.Process] = op.Index
			}
			i = j
		}
		pairs[i].Completion = op
	}
	for i := range pairs {
		if pairs[i].Completion.Type == "" {
			inv := pairs[i].Invoke
			pairs[i].Pending = true
			pairs[i].Completion = Op{Index: -1, Time: last, Process: inv.Process, Type: Info, F: inv.F, Node: inv.Node, Error: "no completion recorded"}
		}
	}
	return pairs, nil
}
