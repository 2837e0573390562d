package shrink

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/tidaldb/tidal/harness/checker"
)

// Anomaly is one kind of violation a checker reported: the checker's
// result name and what it found, e.g. ledger / "acknowledged write lost".
type Anomaly struct {
	Checker string `json:"checker"`
	Kind    string `json:"kind"`
}

func (a Anomaly) String() string {
	if a.Kind == "" {
		return a.Checker
	}
	return a.Checker + "/" + a.Kind
}

// Signature is what a failing run found: every anomaly kind of every
// INVALID checker, checkers in priority order, each checker's kinds in
// its own order of gravity. Its first element is the primary anomaly.
type Signature []Anomaly

// Primary is the anomaly a shrink preserves: the first kind of the first
// INVALID checker in priority order (false when nothing was INVALID).
func (s Signature) Primary() (Anomaly, bool) {
	if len(s) == 0 {
		return Anomaly{}, false
	}
	return s[0], true
}

// Has says whether s contains a.
func (s Signature) Has(a Anomaly) bool { return slices.Contains(s, a) }

func (s Signature) String() string {
	if len(s) == 0 {
		return "-"
	}
	parts := make([]string, len(s))
	for i, a := range s {
		parts[i] = a.String()
	}
	return strings.Join(parts, ", ")
}

// priority orders checkers for the primary anomaly: safety before
// liveness, and among safety checkers the one whose anomaly explains the
// others (a lost write also makes replicas disagree; a crash makes the
// ledger unable to audit a node). Checkers not listed come after these,
// by name; availability and lag come last because a fault schedule makes
// them fail far more easily than it exposes a safety defect, and a shrink
// that kept "an outage" would throw away the defect the run found.
var priority = []string{
	"ledger", "linearizable", "counter", "embeddings", "aggregates",
	"convergence", "watch", "fencing", "clock", "nodes",
}

// lastPriority are ranked after every other checker, in this order.
var lastPriority = []string{"faults", "availability", "lag", "stats"}

func rank(name string) (int, string) {
	if i := slices.Index(priority, name); i >= 0 {
		return i, ""
	}
	if i := slices.Index(lastPriority, name); i >= 0 {
		return len(priority) + 1 + i, ""
	}
	return len(priority), name
}

// kindsFunc names the anomaly kinds of one INVALID result, from its
// details as generic JSON; none means the checker's name alone is the
// kind.
type kindsFunc func(d map[string]any) []string

// kindsOf holds one function per checker (etcd's results share tidal's
// names where they mean the same: ledger, linearizable, convergence; its
// own is watch).
var kindsOf = map[string]kindsFunc{
	"ledger": func(d map[string]any) []string {
		var out []string
		for _, k := range []struct{ field, kind string }{
			{"lost", "acknowledged write lost"},
			{"duplicated", "duplicated"},
			{"failed_but_applied", "failed write applied"},
			{"divergent", "unacknowledged write on some nodes only"},
			{"unexpected", "sent by no client"},
		} {
			if count(d, k.field) > 0 {
				out = append(out, k.kind)
			}
		}
		if anyCrashed(d["missing"]) {
			out = append(out, "crashed node not audited")
		}
		return out
	},
	"linearizable": func(d map[string]any) []string {
		if num(d["illegal"]) > 0 {
			return []string{"key not linearizable"}
		}
		return nil
	},
	"counter": func(d map[string]any) []string {
		if count(d, "violations") > 0 {
			return []string{"read outside the bounds of the adds"}
		}
		return nil
	},
	"aggregates": func(d map[string]any) []string {
		if count(d, "violations") > 0 {
			return []string{"aggregate outside the bounds of the adds"}
		}
		return nil
	},
	"embeddings": func(d map[string]any) []string {
		var out []string
		for _, k := range []struct{ field, kind string }{
			{"lost", "acknowledged vector lost"},
			{"unexpected", "vector no put wrote"},
			{"stale", "stale linearizable get"},
		} {
			if count(d, k.field) > 0 {
				out = append(out, k.kind)
			}
		}
		return out
	},
	"convergence": func(d map[string]any) []string {
		groups, _ := d["groups"].(map[string]any)
		for _, g := range groups {
			if byDigest, ok := g.(map[string]any); ok && len(byDigest) > 1 {
				return []string{"diverged"}
			}
		}
		if anyCrashed(d["missing"]) {
			return []string{"crashed node not compared"}
		}
		return nil
	},
	"nodes": func(d map[string]any) []string {
		if l, _ := d["crashed"].([]any); len(l) > 0 {
			return []string{"crashed"}
		}
		return nil
	},
	"fencing": func(d map[string]any) []string {
		var out []string
		if l, _ := d["acks"].([]any); len(l) > 0 {
			out = append(out, "acknowledged after a failed fsync")
		}
		if l, _ := d["silent"].([]any); len(l) > 0 {
			out = append(out, "exit without naming the corruption")
		}
		return out
	},
	"clock": func(d map[string]any) []string {
		if count(d, "violations") > 0 {
			return []string{"acknowledged with the clock out of bounds"}
		}
		return nil
	},
	"watch": func(d map[string]any) []string {
		a, _ := d["anomalies"].(map[string]any)
		ex, _ := a["examples"].([]any)
		var out []string
		for _, e := range ex {
			m, _ := e.(map[string]any)
			if k, _ := m["kind"].(string); k != "" && !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
		slices.Sort(out)
		return out
	},
	"availability": func(map[string]any) []string { return []string{"outage"} },
	"lag":          func(map[string]any) []string { return []string{"over the SLO"} },
}

// SignatureOf derives the anomaly signature of a run's checker results.
// Details are read as generic JSON, so results fresh from the checkers
// (typed details) and results read back from results.json (maps) give
// the same signature. An INVALID checker whose details name no known
// kind — a checker this package does not know, or details it cannot
// read — contributes its name alone.
func SignatureOf(results []checker.Result) Signature {
	rs := slices.Clone(results)
	slices.SortStableFunc(rs, func(a, b checker.Result) int {
		ra, na := rank(a.Name)
		rb, nb := rank(b.Name)
		if ra != rb {
			return ra - rb
		}
		return strings.Compare(na, nb)
	})
	var sig Signature
	for _, r := range rs {
		if r.Valid != checker.Invalid {
			continue
		}
		var kinds []string
		if f, ok := kindsOf[r.Name]; ok {
			kinds = f(genericDetails(r.Details))
		}
		if len(kinds) == 0 {
			sig = append(sig, Anomaly{Checker: r.Name})
			continue
		}
		for _, k := range kinds {
			sig = append(sig, Anomaly{Checker: r.Name, Kind: k})
		}
	}
	return sig
}

// SameWay says whether a run with signature got failed the way the
// shrink preserves: its signature holds the original's primary anomaly.
func SameWay(primary Anomaly, got Signature) bool { return got.Has(primary) }

func genericDetails(d any) map[string]any {
	if m, ok := d.(map[string]any); ok {
		return m
	}
	b, err := json.Marshal(d)
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

// count reads an Anomalies field's count.
func count(d map[string]any, field string) float64 {
	a, _ := d[field].(map[string]any)
	return num(a["count"])
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

func anyCrashed(missing any) bool {
	l, _ := missing.([]any)
	for _, m := range l {
		if mm, ok := m.(map[string]any); ok && mm["crashed"] == true {
			return true
		}
	}
	return false
}
