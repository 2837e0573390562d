package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

func TestConvergence(t *testing.T) {
	s := func(i uint64, d string) DigestSample { return DigestSample{AppliedIndex: i, Digest: d} }
	mustValid(t, Convergence(map[string]DigestSample{"n1": s(10, "ab"), "n2": s(10, "ab"), "n3": s(10, "ab")}), Valid)

	r := Convergence(map[string]DigestSample{"n1": s(10, "ab"), "n2": s(10, "ab"), "n3": s(10, "cd")})
	mustValid(t, r, Invalid)
	if !strings.Contains(r.Summary, "at index 10: n1,n2 has ab, n3 has cd") {
		t.Fatalf("summary %q", r.Summary)
	}
	// Divergence at a shared index is proof enough, whatever the laggard says.
	mustValid(t, Convergence(map[string]DigestSample{"n1": s(10, "ab"), "n2": s(10, "cd"), "n3": s(9, "ef")}), Invalid)

	r = Convergence(map[string]DigestSample{"n1": s(10, "ab"), "n2": s(10, "ab"), "n3": s(8, "ef")})
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "n3@8") || !strings.Contains(r.Summary, "n1,n2@10") {
		t.Fatalf("summary %q", r.Summary)
	}
	mustValid(t, Convergence(nil), Unknown)
}

// cluster simulates status samples of a 3-node cluster: n1 (id 1) leads
// throughout and commits rate entries per second; every 100ms each node
// is polled. applied(node, t) says how far a follower got; by default one
// sample interval behind the leader.
type cluster struct {
	rate    uint64 // entries per second
	end     time.Duration
	applied func(node string, t time.Duration) uint64
}

func (c cluster) commit(t time.Duration) uint64 { return uint64(t.Seconds() * float64(c.rate)) }

func (c cluster) samples() []LagSample {
	var out []LagSample
	for t := time.Duration(0); t <= c.end; t += 100 * ms {
		commit := c.commit(t)
		out = append(out, LagSample{Time: int64(t), Node: "n1", ID: 1, Leader: 1, Term: 2, Commit: commit, Applied: commit,
			Members: []MemberMatch{{ID: 1, Match: commit}, {ID: 2, Match: commit}, {ID: 3, Match: commit}}})
		for id, n := range []string{"n2", "n3"} {
			a := c.commit(max(t-100*ms, 0))
			if c.applied != nil {
				a = c.applied(n, t)
			}
			out = append(out, LagSample{Time: int64(t + 3*ms), Node: n, ID: uint64(id + 2), Leader: 1, Term: 2, Commit: commit, Applied: a})
		}
	}
	return out
}

func lagDetails(t *testing.T, r Result) LagDetails {
	t.Helper()
	return r.Details.(LagDetails)
}

func TestLagHealthy(t *testing.T) {
	c := cluster{rate: 1000, end: 20 * time.Second}
	r := Lag(c.samples(), nil, SLO{})
	mustValid(t, r, Valid)
	d := lagDetails(t, r)
	if len(d.Followers) != 2 || d.Followers[0].Node != "n2" {
		t.Fatalf("followers %+v", d.Followers)
	}
	f := d.Followers[1].Outside
	// One poll behind: ~100 entries and ~100ms, give or take a poll.
	if f.P99Entries < 50 || f.P99Entries > 250 || f.P99Ms < 50 || f.P99Ms > 250 || f.Samples != 201 {
		t.Fatalf("n3 lag %+v", f)
	}
	if d.SLO != DefaultSLO() {
		t.Fatalf("zero SLO became %+v, want the defaults", d.SLO)
	}
}

func TestLagOverSLO(t *testing.T) {
	c := cluster{rate: 1000, end: 20 * time.Second}
	c.applied = func(n string, t time.Duration) uint64 {
		if n == "n3" {
			return c.commit(max(t-3*time.Second, 0))
		}
		return c.commit(t)
	}
	r := Lag(c.samples(), nil, SLO{})
	mustValid(t, r, Invalid)
	d := lagDetails(t, r)
	n3 := d.Followers[1]
	if n3.Node != "n3" || n3.P99OK || n3.Outside.P99Ms < 2800 || n3.Outside.P99Ms > 3200 || n3.Outside.P99Entries < 2800 || n3.Outside.P99Entries > 3200 {
		t.Fatalf("n3 %+v: want ~3000ms and ~3000 entries of lag, over the SLO", n3)
	}
	if !d.Followers[0].P99OK || !strings.Contains(r.Summary, "n3 p99 lag outside faults") {
		t.Fatalf("n2 %+v; summary %q", d.Followers[0], r.Summary)
	}
	// A looser SLO passes the same samples.
	mustValid(t, Lag(c.samples(), nil, SLO{P99: 4 * time.Second}), Valid)
}

// isolated: n3 is cut off from 20s to the heal at 30s, applies nothing in
// between, and after the heal catches up at catchUp entries per second
// more than the commit rate.
func isolated(catchUpRate uint64) (cluster, []FaultWindow) {
	c := cluster{rate: 1000, end: 60 * time.Second}
	frozen := c.commit(20 * time.Second)
	c.applied = func(n string, t time.Duration) uint64 {
		normal := c.commit(max(t-50*ms, 0))
		if n != "n3" || t < 20*time.Second {
			return normal
		}
		if t < 30*time.Second {
			return frozen
		}
		return min(normal, frozen+uint64((t-30*time.Second).Seconds()*float64(c.rate+catchUpRate)))
	}
	w := FaultWindow{F: "partition", Kind: "isolate-one", Targets: []string{"n3"}, Start: int64(20 * time.Second), Effective: int64(20 * time.Second), End: int64(30 * time.Second), Healed: true}
	return c, []FaultWindow{w}
}

func TestLagCatchUp(t *testing.T) {
	// 10s behind, gaining 5000 entries/s on a 1000/s leader: caught up ~2s after the heal.
	c, faults := isolated(5000)
	r := Lag(c.samples(), faults, SLO{})
	mustValid(t, r, Valid)
	d := lagDetails(t, r)
	var n3 CatchUp
	for _, cu := range d.CatchUps {
		if cu.Node == "n3" {
			n3 = cu
		}
	}
	if !n3.OK || n3.Ms < 1500 || n3.Ms > 2500 {
		t.Fatalf("n3 catch-up %+v, want ~2000ms", n3)
	}
	w := d.Windows[0].Followers["n3"]
	if w.MaxMs < 9000 || w.MaxEntries < 9000 {
		t.Fatalf("n3 in the window: %+v, want ~10s and ~10000 entries at worst", w)
	}
	if o := d.Followers[1].Outside; o.P99Ms > 250 {
		t.Fatalf("n3 outside faults %+v: the catch-up must not count here", o)
	}
}

func TestLagSlowCatchUp(t *testing.T) {
	// Gaining 500 entries/s: ~20s to make up 10s.
	c, faults := isolated(500)
	r := Lag(c.samples(), faults, SLO{})
	mustValid(t, r, Invalid)
	if !strings.Contains(r.Summary, "n3 took") || !strings.Contains(r.Summary, "to catch up after the heal of partition(isolate-one)") {
		t.Fatalf("summary %q", r.Summary)
	}
	// Never catching up, with samples long past the SLO.
	c, faults = isolated(0)
	r = Lag(c.samples(), faults, SLO{})
	mustValid(t, r, Invalid)
	if !strings.Contains(r.Summary, "n3 never caught up") {
		t.Fatalf("summary %q", r.Summary)
	}
	// Sampling stopped 3s after the heal: too soon to tell.
	c.end = 33 * time.Second
	mustValid(t, Lag(c.samples(), faults, SLO{}), Unknown)
	// The next fault started before n3 caught up: not judged.
	c.end = 60 * time.Second
	next := FaultWindow{F: "kill", Start: int64(35 * time.Second), Effective: int64(35 * time.Second), End: int64(36 * time.Second), Healed: true}
	r = Lag(c.samples(), append(faults, next), SLO{CatchUp: 30 * time.Second})
	d := lagDetails(t, r)
	var interrupted bool
	for _, cu := range d.CatchUps {
		interrupted = interrupted || (cu.Node == "n3" && cu.Interrupted)
	}
	if !interrupted {
		t.Fatalf("catch-ups %+v: want n3's first one interrupted", d.CatchUps)
	}
}

func TestLagNoLeader(t *testing.T) {
	mustValid(t, Lag(nil, nil, SLO{}), Unknown)
	s := []LagSample{{Time: 1, Node: "n2", ID: 2, Leader: 0, Commit: 5, Applied: 5}}
	mustValid(t, Lag(s, nil, SLO{}), Unknown)
}

func TestStats(t *testing.T) {
	h := newHist(t)
	h.write(0, "a", "n1", history.OK, 1)
	h.write(1, "b", "n1", history.Fail, 0)
	h.write(2, "c", "n2", history.Info, 0)
	h.fault(history.FKill, history.FaultValue{Kind: "one"})
	r1 := h.readInv(3, 1)
	h.readOK(r1, 0)
	h.write(4, "d", "n2", "", 0)
	r := Stats(h.ops)
	mustValid(t, r, Valid)
	d := r.Details.(StatsDetails)
	want := Outcomes{OK: 1, Fail: 1, Info: 2, Pending: 1}
	if d.ByF[history.FWrite] != want || d.Total.OK != 2 || d.ByNode["n2"][history.FWrite].Info != 2 || d.Faults[history.FKill].OK != 1 {
		t.Fatalf("stats %+v", d)
	}
	// A workload op that never once succeeded.
	h = newHist(t)
	h.write(0, "a", "n1", history.Fail, 0)
	r = Stats(h.ops)
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "write never succeeded") {
		t.Fatalf("summary %q", r.Summary)
	}
}

// TestLagFollowerThatBecomesLeaderHasCaughtUp: a restarted node that is
// made leader before it was ever sampled caught up as a follower has, by
// raft's rules, every committed entry; its catch-up is not "undecided".
func TestLagFollowerThatBecomesLeaderHasCaughtUp(t *testing.T) {
	var samples []LagSample
	for tm := time.Duration(0); tm <= 6*time.Second; tm += 100 * ms {
		commit := uint64(tm / ms)
		leaderID, leaderName := uint64(1), "n1"
		if tm >= 4*time.Second {
			leaderID, leaderName = 2, "n2"
		}
		samples = append(samples, LagSample{Time: int64(tm), Node: leaderName, ID: leaderID, Leader: leaderID, Commit: commit, Applied: commit})
		follower, fid := "n2", uint64(2)
		if leaderName == "n2" {
			follower, fid = "n1", 1
		}
		applied := commit
		if follower == "n2" && tm >= 2*time.Second {
			applied = 1000 // n2 restarted at 2s, a second behind, and stays so until it leads
		}
		samples = append(samples, LagSample{Time: int64(tm + 3*ms), Node: follower, ID: fid, Leader: leaderID, Commit: commit, Applied: applied})
	}
	faults := []FaultWindow{{F: "restart", Kind: "one", Targets: []string{"n2"}, Start: int64(2 * time.Second), Effective: int64(2 * time.Second), End: int64(2 * time.Second), Healed: true}}
	r := Lag(samples, faults, DefaultSLO())
	d := lagDetails(t, r)
	for _, cu := range d.CatchUps {
		if cu.Node == "n2" && (cu.Undecided || cu.CaughtUpAt != int64(4*time.Second)) {
			t.Fatalf("n2's catch-up: %+v, want caught up at 4s when it became leader", cu)
		}
	}
	if r.Valid == Unknown {
		t.Fatalf("lag verdict unknown: %s", r.Summary)
	}
}

// A follower the sampler never reached after a heal, while it kept
// sampling the others, has an unmeasured catch-up: unknown, naming the
// follower and the window, never true by omission.
func TestLagFollowerUnsampledAfterHealIsUnknown(t *testing.T) {
	t.Run("Regression: unsampled follower after heal", func(t *testing.T) {
		c := cluster{rate: 1000, end: 20 * time.Second}
		w := FaultWindow{F: "partition", Kind: "isolate", Targets: []string{"n3"}, Start: int64(5 * time.Second), Effective: int64(5 * time.Second), End: int64(8 * time.Second), Healed: true}
		var samples []LagSample
		for _, s := range c.samples() {
			if s.Node == "n3" && s.Time >= int64(5*time.Second) {
				continue // n3 unreachable from the fault on, and never again
			}
			samples = append(samples, s)
		}
		r := Lag(samples, []FaultWindow{w}, SLO{})
		mustValid(t, r, Unknown)
		if !strings.Contains(r.Summary, "follower n3 never sampled after the heal of partition(isolate)") || !strings.Contains(r.Summary, "5.000s..8.000s") {
			t.Fatalf("summary should name the follower and the window: %s", r.Summary)
		}
	})
	t.Run("removed member is not required to catch up", func(t *testing.T) {
		c := cluster{rate: 1000, end: 20 * time.Second}
		w := FaultWindow{F: "member", Kind: "remove", Targets: []string{"n3"}, Start: int64(5 * time.Second), Effective: int64(5 * time.Second), End: int64(8 * time.Second), Healed: true}
		var samples []LagSample
		for _, s := range c.samples() {
			if s.Node == "n3" && s.Time >= int64(5*time.Second) {
				continue
			}
			if s.Node == "n1" && s.Time >= int64(5*time.Second) {
				s.Members = s.Members[:2] // n3 (id 3) removed
			}
			samples = append(samples, s)
		}
		mustValid(t, Lag(samples, []FaultWindow{w}, SLO{}), Valid)
	})
}
