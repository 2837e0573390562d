package runner

import (
	"context"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/harness/checker"
)

// Regression (the multiproc suite's digest flake, 2021 vs 2023, in the
// chaos runner's collect): digests read one node after another, each
// after its audit, straddled an entry the converged cluster still
// appended (a restarted node publishing its address), and the
// convergence checker could only say unknown, though nothing diverged.
// Digests at two indexes are read again after the cluster converges; a
// node that really lags stays behind, and a divergence still shows.
func TestDigestsAreReadAgainUntilAtOneIndex(t *testing.T) {
	cov := checker.Coverage{Nodes: []string{"n1", "n2", "n3"}}
	straddled := func() map[string]checker.DigestSample {
		return map[string]checker.DigestSample{"n1": {AppliedIndex: 2021, Digest: "a"}, "n2": {AppliedIndex: 2023, Digest: "b"}, "n3": {AppliedIndex: 2023, Digest: "b"}}
	}
	if r := checker.ConvergenceCovering(straddled(), cov); r.Valid != checker.Unknown {
		t.Fatalf("the straddling reads: expected the checker unknown, found %s: %s", r.Valid, r.Summary)
	}
	converged := 0
	converge := func(context.Context) error { converged++; return nil }
	now := map[string]checker.DigestSample{"n1": {AppliedIndex: 2023, Digest: "b"}, "n2": {AppliedIndex: 2023, Digest: "b"}, "n3": {AppliedIndex: 2023, Digest: "b"}}
	read := func(_ context.Context, n string) (checker.DigestSample, error) { return now[n], nil }
	got, notes := digestsAtOneIndex(context.Background(), straddled(), digestRounds, converge, read)
	if r := checker.ConvergenceCovering(got, cov); r.Valid != checker.Valid {
		t.Fatalf("after reading again: expected valid, found %s: %s", r.Valid, r.Summary)
	}
	if converged != 1 || len(notes) != 1 || !strings.Contains(notes[0], "n1@2021 n2@2023 n3@2023") {
		t.Fatalf("expected one round, after one convergence, noted with the indexes; found %d convergences, notes %q", converged, notes)
	}

	// A node that stays behind: every round reads it there again; the
	// checker still says unknown, after the rounds ran out.
	now["n1"] = checker.DigestSample{AppliedIndex: 2021, Digest: "a"}
	converged = 0
	got, notes = digestsAtOneIndex(context.Background(), straddled(), 3, converge, read)
	if r := checker.ConvergenceCovering(got, cov); r.Valid != checker.Unknown || converged != 3 || len(notes) != 3 {
		t.Fatalf("a lagging node: expected unknown after 3 rounds, found %s (%d rounds, notes %q): %s", r.Valid, converged, notes, r.Summary)
	}

	// Diverged at one index: nothing to read again, and invalid.
	now["n1"] = checker.DigestSample{AppliedIndex: 2023, Digest: "x"}
	converged = 0
	got, _ = digestsAtOneIndex(context.Background(), straddled(), digestRounds, converge, read)
	if r := checker.ConvergenceCovering(got, cov); r.Valid != checker.Invalid {
		t.Fatalf("a diverged node: expected invalid, found %s: %s", r.Valid, r.Summary)
	}
}
