package checker

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tidaldb/tidal/harness/history"
)

type counterInput struct {
	read  bool
	delta int64
}

// counterModel is a single counter starting at 0: add changes it, read
// must return it. The checker partitions histories by key itself, so the
// model sees one key.
var counterModel = porcupine.Model{
	Init: func() interface{} { return int64(0) },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		s, in := state.(int64), input.(counterInput)
		if in.read {
			return output.(int64) == s, s
		}
		return true, s + in.delta
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(counterInput)
		if in.read {
			return fmt.Sprintf("read() → %d", output.(int64))
		}
		return fmt.Sprintf("add(%+d)", in.delta)
	},
	DescribeState: func(state interface{}) string { return strconv.FormatInt(state.(int64), 10) },
}

// KeyLinearizability is the outcome for one key.
type KeyLinearizability struct {
	Key uint64 `json:"key"`
	Ops int    `json:"ops"`
	// Pending counts the adds that ended info or never completed: each
	// stays concurrent with everything after it, and the search grows
	// exponentially in their number.
	Pending int    `json:"pending"`
	Result  string `json:"result"` // "ok", "illegal", "unknown" (timed out or not reached)
	// Visualization is the porcupine HTML written for an illegal key.
	Visualization string `json:"visualization,omitempty"`
	Error         string `json:"error,omitempty"`
}

// LinearizableDetails is the Details of a Linearizable result.
type LinearizableDetails struct {
	Keys    []KeyLinearizability `json:"keys"`
	Illegal int                  `json:"illegal"`
	Unknown int                  `json:"unknown"`
}

// Linearizable checks the counter workload (add, read per key) for
// linearizability with porcupine, one key at a time.
//
// An add that failed never happened and is left out; one that ended info
// or never completed may take effect at any point after its invoke, so it
// is given an unbounded return (which also lets it never take effect as
// far as any read can tell). Reads that did not return ok constrain
// nothing and are left out.
//
// timeout bounds the whole search (0: none). Keys are searched smallest
// first, each within a fair share of what is left of the budget (what is
// left divided by the keys not yet searched), so one key whose search
// explodes cannot starve the others of their verdicts. Keys not settled
// in time are unknown, and so is the result unless some key is illegal.
// The counter workload keeps keys small enough to settle in milliseconds
// (workload.Config.OpsPerKey, InfosPerKey). For each
// illegal key porcupine's HTML visualization is written to
// outDir/linearizable-<key>.html (outDir is created if needed; empty
// outDir writes nothing).
func Linearizable(ops []history.Op, outDir string, timeout time.Duration) Result {
	const name = "linearizable"
	pairs, err := history.Pairs(ops)
	if err != nil {
		return unknown(name, "cannot pair the history: %v", err)
	}
	windows, err := FaultWindows(ops)
	if err != nil {
		return unknown(name, "cannot derive fault windows: %v", err)
	}

	keyed := NewKeyedOps[uint64]()
	readsOf := map[uint64]int{} // ok reads per key
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() || p.Type() == history.Fail {
			continue
		}
		switch p.Invoke.F {
		case history.FAdd:
			v, err := history.Decode[history.AddValue](p.Invoke)
			if err != nil {
				return unknown(name, "%v", err)
			}
			keyed.Add(v.Key, p, counterInput{delta: v.Delta}, int64(0), p.Type() != history.OK)
		case history.FRead:
			if p.Type() != history.OK {
				continue
			}
			k, value, err := okCounterRead(p)
			if err != nil {
				return unknown(name, "%v", err)
			}
			keyed.Add(k, p, counterInput{read: true}, value, false)
			readsOf[k]++
		}
	}
	outcomes, illegal, undecided := keyed.Search(counterModel, timeout, "adds",
		func(key uint64, info porcupine.LinearizationInfo) (string, error) {
			if outDir == "" {
				return "", nil
			}
			path := filepath.Join(outDir, fmt.Sprintf("linearizable-%d.html", key))
			if err := VisualizeWithFaults(counterModel, info, windows, path); err != nil {
				return "", fmt.Errorf("linearizable: %w", err)
			}
			return path, nil
		})
	d := LinearizableDetails{Illegal: illegal, Unknown: undecided}
	// A key no ok read observed is linearizable whatever its adds did:
	// nothing was checked, so it is unknown, never ok.
	var unread []string
	for _, o := range outcomes {
		kl := KeyLinearizability{Key: o.Key, Ops: o.Ops, Pending: o.Pending,
			Result: o.Result, Visualization: o.Visualization, Error: o.Error}
		if readsOf[o.Key] == 0 && kl.Result == "ok" {
			kl.Result, kl.Error = "unknown", "no ok read of the key: its adds were never observed"
			unread = append(unread, strconv.FormatUint(o.Key, 10))
			d.Unknown++
		}
		d.Keys = append(d.Keys, kl)
	}
	keys := d.Keys

	switch {
	case d.Illegal > 0:
		var bad []string
		for _, kr := range d.Keys {
			if kr.Result == "illegal" {
				s := strconv.FormatUint(kr.Key, 10)
				if kr.Visualization != "" {
					s += " (" + kr.Visualization + ")"
				}
				bad = append(bad, s)
			}
		}
		return Result{Name: name, Valid: Invalid, Details: d, Summary: fmt.Sprintf("%d of %d keys not linearizable: %s", d.Illegal, len(keys), strings.Join(bad, ", "))}
	case len(keys) == 0:
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no add or read operations to check"}
	case d.Unknown > 0:
		s := fmt.Sprintf("%d of %d keys undecided", d.Unknown, len(keys))
		if n := d.Unknown - len(unread); n > 0 {
			s += fmt.Sprintf(": %d not decided within %v", n, timeout)
		}
		if len(unread) > 0 {
			s += fmt.Sprintf("; %d never read (no ok read, so nothing to check): key %s", len(unread), strings.Join(unread, ", "))
		}
		return Result{Name: name, Valid: Unknown, Details: d, Summary: s}
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: fmt.Sprintf("all %d keys linearizable", len(keys))}
}
