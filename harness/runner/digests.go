package runner

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/tidaldb/tidal/harness/checker"
)

// digestRounds bounds how often collect re-reads the digests of nodes
// that were read at different applied indexes.
const digestRounds = 5

// digestsAtOneIndex re-reads digests that were read at different applied
// indexes, after waiting for the cluster to converge, until all are at
// one index or rounds run out; it returns what it read last and a line
// per round for the run's output. The nodes are read one after another
// (each after its audit), and a converged cluster can still append — a
// restarted node publishing its client address, a new leader's empty
// entry — so digests read around such an entry are at two indexes and
// the convergence checker could only say unknown, though nothing
// diverged. A node that really lags stays behind, and the checker says
// so. A node whose re-read fails keeps its earlier digest.
func digestsAtOneIndex(ctx context.Context, digests map[string]checker.DigestSample, rounds int,
	converge func(context.Context) error, read func(context.Context, string) (checker.DigestSample, error)) (map[string]checker.DigestSample, []string) {
	var notes []string
	for round := 1; round <= rounds && !atOneIndex(digests) && ctx.Err() == nil; round++ {
		notes = append(notes, fmt.Sprintf("digests read at different applied indexes (%s); reading them again (round %d of %d)", indexesOf(digests), round, rounds))
		if err := converge(ctx); err != nil {
			notes = append(notes, fmt.Sprintf("cluster did not converge before re-reading digests: %v", err))
		}
		for _, n := range slices.Sorted(maps.Keys(digests)) {
			if d, err := read(ctx, n); err == nil {
				digests[n] = d
			}
		}
	}
	return digests, notes
}

func atOneIndex(digests map[string]checker.DigestSample) bool {
	var first uint64
	i := 0
	for _, d := range digests {
		if i > 0 && d.AppliedIndex != first {
			return false
		}
		first = d.AppliedIndex
		i++
	}
	return true
}

func indexesOf(digests map[string]checker.DigestSample) string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(digests)) {
		parts = append(parts, fmt.Sprintf("%s@%d", n, digests[n].AppliedIndex))
	}
	return strings.Join(parts, " ")
}
