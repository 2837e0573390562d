package etcd

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/db"
	"github.com/tidaldb/tidal/harness/history"
)

// LinearizableTimeout bounds the register search of one run when the
// configuration sets no bound (Config.LinearizableTimeout).
const LinearizableTimeout = 60 * time.Second

// Check implements db.DB: the register workload's linearizability and
// revisions, or the append workload's ledger; convergence of every node's
// keyspace.
func (d *DB) Check(in db.CheckInput) []checker.Result {
	var rs []checker.Result
	switch d.cfg.Workload {
	case Register:
		rs = append(rs, CheckRegister(in.Ops, in.Run.LinearizableDir(), d.cfg.Reads, time.Duration(d.cfg.LinearizableTimeout)))
		rs = append(rs, CheckRevisions(in.Ops, d.cfg.Reads))
	case Append:
		rs = append(rs, CheckRevisions(in.Ops, Linearizable))
		audits, err := in.Run.ReadAudits()
		if err != nil {
			rs = append(rs, checker.Result{Name: "ledger", Valid: checker.Unknown, Summary: "keys of the nodes unreadable: " + err.Error()})
			break
		}
		var applied map[string]uint64
		if digests, err := in.Run.ReadDigests(); err == nil {
			applied = map[string]uint64{}
			for n, dg := range digests {
				applied[n] = dg.AppliedIndex
			}
		}
		// applied (the digest revision) is a lower bound of what each
		// node had applied when read: keys above it on a node that lacks
		// them read as unreplicated, not lost.
		rs = append(rs, checker.LedgerCovering(in.Ops, audits, applied, in.Audit))
		rs = append(rs, CheckWatch(in.Run, audits))
	}
	rs = append(rs, checker.GRPCResponses(in.Ops))
	if digests, err := in.Run.ReadDigests(); err == nil {
		rs = append(rs, checker.ConvergenceCovering(digests, in.Digest))
	} else {
		rs = append(rs, checker.Result{Name: "convergence", Valid: checker.Unknown, Summary: "digests unreadable: " + err.Error()})
	}
	return rs
}

type regInput struct {
	f     string
	value int // put, cas: the value written
	old   int // cas
	// unknown: a put or cas that ended info. A cas of unknown outcome may
	// have compared unequal and done nothing, so it never fails to step.
	unknown bool
}

// registerModel is one key: 0 until written. A cas that completed ok
// compared equal, so it steps only from old.
var registerModel = porcupine.Model{
	Init: func() interface{} { return 0 },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		s, in := state.(int), input.(regInput)
		switch in.f {
		case FGet:
			return output.(int) == s, s
		case FPut:
			return true, in.value
		case FCAS:
			if s != in.old {
				return in.unknown, s
			}
			return true, in.value
		}
		return false, s
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(regInput)
		switch in.f {
		case FGet:
			return fmt.Sprintf("get() → %d", output.(int))
		case FPut:
			return fmt.Sprintf("put(%d)", in.value)
		}
		return fmt.Sprintf("cas(%d→%d)", in.old, in.value)
	},
	DescribeState: func(state interface{}) string { return strconv.Itoa(state.(int)) },
}

// KeyResult is the outcome for one register key.
type KeyResult struct {
	Key           string `json:"key"`
	Ops           int    `json:"ops"`
	Pending       int    `json:"pending"`
	Result        string `json:"result"` // ok, illegal, unknown
	Visualization string `json:"visualization,omitempty"`
	Error         string `json:"error,omitempty"`
}

// RegisterDetails is the Details of a CheckRegister result.
type RegisterDetails struct {
	Reads string `json:"reads"`
	// Timeout is the bound the search of each key had.
	Timeout Duration    `json:"timeout"`
	Keys    []KeyResult `json:"keys"`
	Illegal int         `json:"illegal"`
	Unknown int         `json:"unknown"`
	// ReadsLeftOut counts ok reads not checked: serializable reads may be
	// stale by etcd's documented contract, so they constrain nothing.
	ReadsLeftOut int `json:"reads_left_out,omitempty"`
	// StaleKeys, with serializable reads, is how many keys would not be
	// linearizable with those reads included: what the weaker contract was
	// used for, reported, not judged.
	StaleKeys *int `json:"stale_keys,omitempty"`
}

// CheckRegister checks the register workload for linearizability with
// porcupine, one key at a time. A put or cas that failed did not happen
// and is left out; one that ended info may take effect at any point after
// its invoke (unbounded return). Reads that did not complete ok are left
// out. With serializable reads (etcd documents that they may be stale)
// the reads are left out too and only the writes are checked, and the
// summary says so. An illegal key's porcupine visualization is written to
// outDir/register-<key>.html.
func CheckRegister(ops []history.Op, outDir, reads string, timeout time.Duration) checker.Result {
	const name = "linearizable"
	pairs, err := history.Pairs(ops)
	if err != nil {
		return checker.Result{Name: name, Valid: checker.Unknown, Summary: fmt.Sprintf("cannot pair the history: %v", err)}
	}
	windows, _ := checker.FaultWindows(ops)
	d := RegisterDetails{Reads: reads, Timeout: Duration(timeout)}
	keyed := checker.NewKeyedOps[string]()
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() || p.Type() == history.Fail {
			continue
		}
		if p.Invoke.F != FGet && p.Invoke.F != FPut && p.Invoke.F != FCAS {
			continue
		}
		v, err := history.Decode[RegisterValue](p.Invoke)
		if err != nil {
			return checker.Result{Name: name, Valid: checker.Unknown, Summary: err.Error()}
		}
		in := regInput{f: p.Invoke.F, value: v.Value, old: v.Old}
		var out int
		pending := false
		if p.Invoke.F == FGet {
			if p.Type() != history.OK {
				continue
			}
			if reads == Serializable {
				d.ReadsLeftOut++
				continue
			}
			got, err := history.Decode[RegisterValue](p.Completion)
			if err != nil {
				return checker.Result{Name: name, Valid: checker.Unknown, Summary: err.Error()}
			}
			out = got.Value
		} else if p.Type() != history.OK {
			in.unknown = true
			pending = true
		}
		keyed.Add(v.Key, p, in, out, pending)
	}
	outcomes, illegal, undecided := keyed.Search(registerModel, timeout, "writes",
		func(key string, info porcupine.LinearizationInfo) (string, error) {
			if outDir == "" {
				return "", nil
			}
			path := filepath.Join(outDir, "register-"+strings.ReplaceAll(strings.TrimPrefix(key, registerPrefix), "/", "_")+".html")
			return path, checker.VisualizeWithFaults(registerModel, info, windows, path)
		})
	d.Illegal, d.Unknown = illegal, undecided
	for _, o := range outcomes {
		d.Keys = append(d.Keys, KeyResult{Key: o.Key, Ops: o.Ops, Pending: o.Pending,
			Result: o.Result, Visualization: o.Visualization, Error: o.Error})
	}
	keys := d.Keys
	scope := "linearizable reads and writes"
	if reads == Serializable {
		scope = fmt.Sprintf("writes only: %d serializable reads left out (etcd documents them as possibly stale)", d.ReadsLeftOut)
		if with, ok := CheckRegister(ops, "", Linearizable, timeout).Details.(RegisterDetails); ok && with.Unknown == 0 {
			d.StaleKeys = &with.Illegal
			scope += fmt.Sprintf("; with them included %d of %d keys would not be linearizable", with.Illegal, len(with.Keys))
		}
	}
	switch {
	case d.Illegal > 0:
		var bad []string
		for _, kr := range d.Keys {
			if kr.Result == "illegal" && len(bad) < 5 {
				bad = append(bad, kr.Key+" ("+kr.Visualization+")")
			}
		}
		if d.Illegal > len(bad) {
			bad = append(bad, fmt.Sprintf("and %d more", d.Illegal-len(bad)))
		}
		return checker.Result{Name: name, Valid: checker.Invalid, Details: d, Summary: fmt.Sprintf("%d of %d register keys not linearizable (%s): %s", d.Illegal, len(keys), scope, strings.Join(bad, ", "))}
	case len(keys) == 0:
		return checker.Result{Name: name, Valid: checker.Unknown, Details: d, Summary: "no register operations to check"}
	case d.Unknown > 0:
		return checker.Result{Name: name, Valid: checker.Unknown, Details: d, Summary: fmt.Sprintf("%d of %d register keys undecided within %v", d.Unknown, len(keys), timeout)}
	}
	return checker.Result{Name: name, Valid: checker.Valid, Details: d, Summary: fmt.Sprintf("all %d register keys linearizable (%s)", len(keys), scope)}
}
