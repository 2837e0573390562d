package checker

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// DigestSample is a node's GET /v1/audit/digest, taken after heal and
// quiesce.
type DigestSample struct {
	AppliedIndex uint64 `json:"applied_index"`
	Digest       string `json:"digest"`
}

// ConvergenceDetails is the Details of a Convergence result.
type ConvergenceDetails struct {
	Nodes map[string]DigestSample `json:"nodes"`
	// Removed were removed from the membership for good and not compared;
	// Missing should have been and were not (no digest could be read).
	Removed []string      `json:"removed,omitempty"`
	Missing []MissingNode `json:"missing,omitempty"`
	// Groups are the nodes that agree, by applied index and then digest:
	// "1532" -> "a1b2..." -> [n1 n2].
	Groups map[uint64]map[string][]string `json:"groups"`
}

// Convergence checks that every node reports the same digest at the same
// applied index. Nodes at the same index with different digests have
// diverged: Invalid, whatever the other nodes say. Nodes at different
// indexes cannot be compared — the cluster had not quiesced within the
// caller's wait, or a node is stuck — so the result is Unknown, with the
// indexes in the summary. The caller waits (all applied == commit, no
// writes in flight) before sampling.
func Convergence(digests map[string]DigestSample) Result {
	return ConvergenceCovering(digests, Coverage{})
}

// ConvergenceCovering is Convergence over the nodes cov names: digests of
// nodes removed for good are not compared, and a node of cov.Nodes with no
// digest makes the result Unknown (Invalid when it crashed) — one digest
// agreeing with itself proves nothing about the nodes that gave none.
// Divergence among the digests read is Invalid regardless.
func ConvergenceCovering(digests map[string]DigestSample, cov Coverage) Result {
	const name = "convergence"
	sampled := make([]string, 0, len(digests))
	for n := range digests {
		sampled = append(sampled, n)
	}
	nodes, missing := cov.split(sampled)
	d := ConvergenceDetails{Nodes: map[string]DigestSample{}, Groups: map[uint64]map[string][]string{},
		Removed: slices.Sorted(slices.Values(cov.Removed)), Missing: missing}
	for _, n := range nodes {
		d.Nodes[n] = digests[n]
	}
	missingValid, missingSummary := missingVerdict("digest", missing)
	if len(nodes) == 0 {
		v, s := Unknown, "no digests sampled"
		if missingValid == Invalid {
			v = Invalid
		}
		if missingSummary != "" {
			s += ": " + missingSummary
		}
		return Result{Name: name, Valid: v, Summary: s, Details: d}
	}
	for _, n := range nodes {
		s := digests[n]
		if d.Groups[s.AppliedIndex] == nil {
			d.Groups[s.AppliedIndex] = map[string][]string{}
		}
		d.Groups[s.AppliedIndex][s.Digest] = append(d.Groups[s.AppliedIndex][s.Digest], n)
	}
	indexes := make([]uint64, 0, len(d.Groups))
	for i := range d.Groups {
		indexes = append(indexes, i)
	}
	sort.Slice(indexes, func(a, b int) bool { return indexes[a] < indexes[b] })

	var diverged []string
	for _, i := range indexes {
		if byDigest := d.Groups[i]; len(byDigest) > 1 {
			diverged = append(diverged, fmt.Sprintf("at index %d: %s", i, describeGroups(byDigest)))
		}
	}
	if len(diverged) > 0 {
		return Result{Name: name, Valid: Invalid, Details: d, Summary: "replicas diverged " + strings.Join(diverged, "; ")}
	}
	if missingValid != Valid {
		return Result{Name: name, Valid: missingValid, Details: d, Summary: fmt.Sprintf(
			"%s; the %d digests read (%s) cannot vouch for the rest", missingSummary, len(nodes), strings.Join(nodes, ","))}
	}
	if len(indexes) > 1 {
		var at []string
		for _, i := range indexes {
			for _, ns := range d.Groups[i] {
				at = append(at, fmt.Sprintf("%s@%d", strings.Join(ns, ","), i))
			}
		}
		return Result{Name: name, Valid: Unknown, Details: d, Summary: fmt.Sprintf(
			"nodes were still at different applied indexes when sampled (%s), so their digests cannot be compared; the cluster did not quiesce within the wait", strings.Join(at, " "))}
	}
	var digest string
	for dg := range d.Groups[indexes[0]] {
		digest = dg
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: fmt.Sprintf("%d nodes agree on digest %s at index %d", len(nodes), digest, indexes[0])}
}

func describeGroups(byDigest map[string][]string) string {
	digests := make([]string, 0, len(byDigest))
	for dg := range byDigest {
		digests = append(digests, dg)
	}
	sort.Strings(digests)
	parts := make([]string, len(digests))
	for i, dg := range digests {
		parts[i] = fmt.Sprintf("%s has %s", strings.Join(byDigest[dg], ","), dg)
	}
	return strings.Join(parts, ", ")
}
