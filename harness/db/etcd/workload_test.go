package etcd

import (
	"math/rand/v2"
	"testing"

	"github.com/tidaldb/tidal/harness/cluster"
)

func testWorkload(sel string, states ...cluster.State) *Workload {
	c := &Cluster{}
	for i, st := range states {
		c.nodes = append(c.nodes, &node{name: "n" + string(rune('1'+i)), state: st})
	}
	return &Workload{cfg: Config{Select: sel}, c: c, stale: make(chan struct{}, 1), last: map[string]int{}}
}

// Every selection picks a member; bound ties worker i to slot i mod n
// for the run, and leader follows the hint.
func TestTarget(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := testWorkload(Bound, cluster.Running, cluster.Paused, cluster.Running)
	for range 3 {
		for i, want := range []string{"n1", "n2", "n3", "n1", "n2"} {
			if got := w.target(i, rng); got != want {
				t.Fatalf("bound: worker %d expected %s, found %s", i, want, got)
			}
		}
	}
	// A removed slot's workers go to the members.
	w = testWorkload(Bound, cluster.Running, cluster.Removed, cluster.Running)
	for range 10 {
		if got := w.target(1, rng); got != "n1" && got != "n3" {
			t.Fatalf("bound to a removed slot: expected n1 or n3, found %s", got)
		}
	}
	w = testWorkload(Leader, cluster.Running, cluster.Running, cluster.Running)
	l := "n2"
	w.leader.Store(&l)
	for i := range 5 {
		if got := w.target(i, rng); got != "n2" {
			t.Fatalf("leader: expected n2, found %s", got)
		}
	}
	w.missed("n2")
	select {
	case <-w.stale:
	default:
		t.Fatal("leader: expected an op missed on the leader to ask for a refresh")
	}
	w = testWorkload(Random, cluster.Running, cluster.Running, cluster.Running)
	seen := map[string]bool{}
	for range 100 {
		seen[w.target(0, rng)] = true
	}
	if len(seen) != 3 {
		t.Fatalf("random: expected all 3 members picked in 100 ops, found %v", seen)
	}
}

// Values are written once each unless a range is set.
func TestValuesUnique(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := testWorkload(RoundRobin, cluster.Running)
	seen := map[int]bool{}
	for range 1000 {
		v := w.value(rng)
		if seen[v] || v <= 0 {
			t.Fatalf("expected a positive value never written before, found %d again", v)
		}
		seen[v] = true
	}
	w.cfg.Values = 5
	for range 100 {
		if v := w.value(rng); v < 1 || v > 5 {
			t.Fatalf("values 5: expected 1..5, found %d", v)
		}
	}
}
