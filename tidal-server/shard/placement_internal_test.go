package shard

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAssignLeadersOnPlantedInstances: on random candidate lists that
// admit a balanced assignment (one is planted: every group's list holds
// its planted leader, among random others, in random order),
// assignLeaders finds one — each group led by a candidate, each position
// leading ⌊S/n⌋ or ⌈S/n⌉. Bootstrap's stripes rarely need more than the
// greedy pass; these lists defeat it often, so both augmenting paths run
// (the test counts how often greedy alone would have failed).
func TestAssignLeadersOnPlantedInstances(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	greedyFailed := 0
	for trial := range 3000 {
		n := 1 + rng.IntN(8)
		s := 1 + rng.IntN(30)
		// Planted: a balanced assignment, shuffled.
		planted := make([]int, s)
		for g := range planted {
			planted[g] = g % n
		}
		rng.Shuffle(s, func(i, j int) { planted[i], planted[j] = planted[j], planted[i] })
		members := make([][]int, s)
		for g := range members {
			set := []int{planted[g]}
			for p := range n {
				if p != planted[g] && rng.IntN(3) == 0 {
					set = append(set, p)
				}
			}
			rng.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
			members[g] = set
		}
		if !greedyBalances(members, n) {
			greedyFailed++
		}
		leader := assignLeaders(members, n)
		load := make([]int, n)
		for g, p := range leader {
			if !slices.Contains(members[g], p) {
				t.Fatalf("trial %d: group %d led by %d, not among its candidates %v", trial, g, p, members[g])
			}
			load[p]++
		}
		for p, l := range load {
			if l < s/n || l > (s+n-1)/n {
				t.Fatalf("trial %d (S=%d, n=%d, candidates %v): position %d leads %d, expected %d..%d", trial, s, n, members, p, l, s/n, (s+n-1)/n)
			}
		}
	}
	if greedyFailed < 100 {
		t.Fatalf("greedy alone failed only %d of 3000 instances: the augmenting paths are barely exercised", greedyFailed)
	}
	t.Logf("greedy alone would have failed %d of 3000 instances", greedyFailed)
}

// greedyBalances runs only assignLeaders' first, greedy pass and says
// whether it already gave a balanced assignment.
func greedyBalances(members [][]int, n int) bool {
	s := len(members)
	lo, hi := s/n, (s+n-1)/n
	load := make([]int, n)
	for g := range s {
		best := -1
		for _, p := range members[g] {
			if load[p] < hi && (best < 0 || load[p] < load[best]) {
				best = p
			}
		}
		if best < 0 {
			return false
		}
		load[best]++
	}
	for _, l := range load {
		if l < lo {
			return false
		}
	}
	return true
}
