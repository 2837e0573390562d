package checker

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Coverage says which nodes a check over what was read from the nodes
// after the run (audits, digests) must cover. A node may be left out only
// when it was removed from the membership for good; any other node without
// a sample leaves the check unable to vouch for it — Unknown — or, when
// the node crashed, Invalid: a crashed node holds none of the writes it
// should.
type Coverage struct {
	// Nodes are every node of the run; empty means the nodes sampled.
	Nodes []string
	// Removed were removed from the membership for good (by the
	// configuration or the nemesis) and are not expected to hold anything.
	Removed []string
	// Crashed exited unexpectedly or were down after the final heal (the
	// nodes checker's Crashed).
	Crashed []string
	// Why says why a node's sample is missing ("GET /v1/audit/events:
	// 500 Internal Server Error").
	Why map[string]string
}

// MissingNode is a node a check had to cover but had no sample of.
type MissingNode struct {
	Node    string `json:"node"`
	Reason  string `json:"reason"`
	Crashed bool   `json:"crashed,omitempty"`
}

func (c Coverage) isRemoved(n string) bool { return slices.Contains(c.Removed, n) }

// split returns the sampled nodes a check judges (sorted) and the nodes
// it should have judged but has no sample of.
func (c Coverage) split(sampled []string) (judged []string, missing []MissingNode) {
	have := map[string]bool{}
	for _, n := range sampled {
		if !c.isRemoved(n) {
			have[n] = true
			judged = append(judged, n)
		}
	}
	sort.Strings(judged)
	for _, n := range slices.Sorted(slices.Values(c.Nodes)) {
		if have[n] || c.isRemoved(n) {
			continue
		}
		m := MissingNode{Node: n, Reason: c.Why[n], Crashed: slices.Contains(c.Crashed, n)}
		if m.Reason == "" {
			m.Reason = "not sampled"
		}
		missing = append(missing, m)
	}
	return judged, missing
}

// missingVerdict is what missing samples alone make of a check: Invalid
// if a missing node crashed, else Unknown; Valid when nothing is missing.
func missingVerdict(what string, missing []MissingNode) (Validity, string) {
	if len(missing) == 0 {
		return Valid, ""
	}
	v := Unknown
	parts := make([]string, len(missing))
	for i, m := range missing {
		parts[i] = fmt.Sprintf("%s (%s)", m.Node, m.Reason)
		if m.Crashed {
			v = Invalid
			parts[i] = fmt.Sprintf("%s crashed (%s)", m.Node, m.Reason)
		}
	}
	return v, fmt.Sprintf("no %s of %s", what, strings.Join(parts, ", "))
}
