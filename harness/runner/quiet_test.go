package runner

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// quietHistory is a power cut of n3 from 1s to 13s with its quiet spell
// (0.7s to 1.02s, healed right after the cut took effect) inside it.
func quietHistory(t *testing.T) []history.Op {
	t.Helper()
	var ops []history.Op
	add := func(at time.Duration, typ history.Type, f string, v history.FaultValue) {
		op := history.Op{Index: int64(len(ops)), Time: int64(at), Process: history.Nemesis, Type: typ, F: f}
		op.Value, _ = json.Marshal(v)
		ops = append(ops, op)
	}
	cut := history.FaultValue{Kind: "one", Targets: []string{"n3"}}
	quiet := history.FaultValue{Kind: "before-cut"}
	add(700*time.Millisecond, history.Invoke, history.FPowerCut, cut)
	add(700*time.Millisecond, history.Invoke, history.FQuiet, quiet)
	add(700*time.Millisecond, history.OK, history.FQuiet, quiet)
	add(1010*time.Millisecond, history.Invoke, history.HealOf(history.FQuiet), quiet)
	add(1020*time.Millisecond, history.OK, history.HealOf(history.FQuiet), quiet)
	add(1030*time.Millisecond, history.OK, history.FPowerCut, cut)
	add(13*time.Second, history.Invoke, history.HealOf(history.FPowerCut), cut)
	add(13*time.Second, history.OK, history.HealOf(history.FPowerCut), cut)
	return ops
}

// lagSamples: n1 leads; n2 keeps up; n3 answers until its cut at 1s and
// again from 13.5s, caught up at once.
func lagSamples() []checker.LagSample {
	var out []checker.LagSample
	for t := time.Duration(0); t <= 20*time.Second; t += 100 * time.Millisecond {
		commit := uint64(t / time.Millisecond)
		out = append(out, checker.LagSample{Time: int64(t), Node: "n1", ID: 1, Leader: 1, Term: 2, Commit: commit, Applied: commit,
			Members: []checker.MemberMatch{{ID: 1, Match: commit}, {ID: 2, Match: commit}, {ID: 3, Match: commit}}})
		out = append(out, checker.LagSample{Time: int64(t), Node: "n2", ID: 2, Leader: 1, Term: 2, Commit: commit, Applied: commit})
		if t < time.Second || t >= 13500*time.Millisecond {
			out = append(out, checker.LagSample{Time: int64(t), Node: "n3", ID: 3, Leader: 1, Term: 2, Commit: commit, Applied: commit})
		}
	}
	return out
}

// Regression: quiet spell judged as a fault by lag. Its heal came while
// the cut node was down, so lag measured n3's catch-up from it (12.5s,
// over the 10s SLO) and said false of a cluster that caught up 0.5s after
// the cut's own heal.
func TestTimelineLeavesOutQuietSpells(t *testing.T) {
	ops := quietHistory(t)
	ws, err := timelineWindows(ops)
	if err != nil {
		t.Fatal(err)
	}
	r := checker.Lag(lagSamples(), ws, checker.SLO{P99: 2 * time.Second, CatchUp: 10 * time.Second})
	if r.Valid != checker.Valid {
		t.Fatalf("lag: expected valid, found %s: %s", r.Valid, r.Summary)
	}
	if len(ws) != 1 || ws[0].F != history.FPowerCut {
		t.Fatalf("timeline windows: expected the power cut alone, found %+v", ws)
	}
}
