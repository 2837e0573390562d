package shard

import (
	"fmt"
	"slices"
)

// Bootstrap computes the map of a new cluster: shards data groups
// (ids 1..shards) of replicationFactor voters each, on nodes, at epoch 1.
//
// The placement, on the nodes sorted by id n[0..N-1] (so the result does
// not depend on the order of the slice):
//
//   - Slots: group i (0-based) owns [i·NumSlots/S, (i+1)·NumSlots/S), so
//     ranges are contiguous, in group order, and differ in size by at
//     most one slot.
//   - Replicas, by striping: lay the S·R replicas out in group order and
//     deal them to n[0], n[1], ..., n[N-1], n[0], ...; group i gets
//     n[(i·R+j) mod N] for j in 0..R-1. Consecutive positions on a ring of
//     N >= R are distinct, so no group has two replicas on one node, and
//     dealing in turn gives every node ⌊S·R/N⌋ or ⌈S·R/N⌉ replicas. The
//     stripes also keep the number of distinct replica sets small (with
//     N a multiple of R, exactly N/R "copysets"), so fewer pairs of
//     failed nodes take the quorum of some group than under a scattered
//     placement: 6 of the 15 pairs for S=6, R=3, N=6, against 12 for the
//     sliding windows {i, i+1, i+2}.
//   - Preferred leaders: an assignment of each group to one of its
//     replicas in which every node leads ⌊S/N⌋ or ⌈S/N⌉ groups. Groups
//     take, in order, their least-loaded replica below ⌈S/N⌉ (ties to the
//     stripe order); when all are full an augmenting path moves
//     leaderships along; then nodes below ⌊S/N⌋ take a group from a node
//     above it along another augmenting path. Both passes find their paths
//     because every node holds ⌊S·R/N⌋ or ⌈S·R/N⌉ replicas of R-replica
//     groups, so Hall's condition holds for both bounds (the argument is
//     in docs/ARCHITECTURE.md "Shards").
//   - Replica ids are node ids (as today's single group's raft ids are);
//     NextReplicaID is one above the group's largest.
//   - Meta: the meta group's voters are the first 5 nodes when there are
//     at least 5, the first 3 when 3 or 4, else the first one (two meta
//     voters tolerate no more failures than one and need both up).
//
// With shards = 1 and replicationFactor = len(nodes), the map is one
// group, 1, owning every slot with every node a voter and the lowest id
// its preferred leader: today's single raft group. shards = 1 with a
// smaller replicationFactor is an ordinary partitioned placement (group 1
// on the R lowest ids; the other nodes host nothing and route).
//
// An even replicationFactor is allowed: raft works with it, but it
// tolerates no more failures than R-1 (R=4 survives one failure, as R=3
// does) while costing one more copy. It is the operator's choice; the
// server logs a warning for it. replicationFactor >= 1, <= len(nodes);
// shards in 1..NumSlots; node ids non-zero and distinct.
func Bootstrap(shards, replicationFactor int, nodes []NodeID) (Map, error) {
	if shards < 1 || shards > NumSlots {
		return Map{}, fmt.Errorf("bootstrap: %d shards, expected 1..%d (every group owns at least one slot)", shards, NumSlots)
	}
	if len(nodes) == 0 {
		return Map{}, fmt.Errorf("bootstrap: no nodes, expected at least one")
	}
	if replicationFactor < 1 || replicationFactor > len(nodes) {
		return Map{}, fmt.Errorf("bootstrap: replication factor %d, expected 1..%d (the number of nodes; one replica per node)", replicationFactor, len(nodes))
	}
	sorted := slices.Clone(nodes)
	slices.Sort(sorted)
	for i, n := range sorted {
		if n == 0 {
			return Map{}, fmt.Errorf("bootstrap: node id 0, expected ids >= 1")
		}
		if i > 0 && sorted[i-1] == n {
			return Map{}, fmt.Errorf("bootstrap: node %d listed twice, expected distinct ids", n)
		}
	}
	S, R, N := shards, replicationFactor, len(sorted)

	members := make([][]int, S) // node positions in sorted, stripe order
	for i := range members {
		members[i] = make([]int, R)
		for j := range R {
			members[i][j] = (i*R + j) % N
		}
	}
	leaders := assignLeaders(members, N)

	m := Map{
		Epoch:             1,
		ReplicationFactor: R,
		Nodes:             sorted,
		Meta:              slices.Clone(sorted[:metaSize(N)]),
		Groups:            make([]Group, S),
		NextGroupID:       GroupID(S + 1),
	}
	for i := range S {
		g := Group{
			ID:         GroupID(i + 1),
			Start:      Slot(i * NumSlots / S),
			End:        Slot((i + 1) * NumSlots / S),
			Leader:     sorted[leaders[i]],
			ConfEpoch:  1,
			SlotsEpoch: 1,
		}
		for _, p := range members[i] {
			n := sorted[p]
			g.Replicas = append(g.Replicas, Replica{Node: n, ID: ReplicaID(n), Role: Voter})
			g.NextReplicaID = max(g.NextReplicaID, ReplicaID(n)+1)
		}
		sortReplicas(g.Replicas)
		m.Groups[i] = g
	}
	if err := m.Validate(); err != nil {
		return Map{}, fmt.Errorf("bootstrap: %w", err)
	}
	return m, nil
}

// metaSize is the number of meta voters on a cluster of n nodes.
func metaSize(n int) int {
	switch {
	case n >= 5:
		return 5
	case n >= 3:
		return 3
	}
	return 1
}

// assignLeaders picks, for every group, one of its members (positions
// 0..n-1) so that each position leads ⌊S/n⌋ or ⌈S/n⌉ groups. members[g]
// lists g's candidates in preference order. Deterministic.
func assignLeaders(members [][]int, n int) []int {
	s := len(members)
	lo, hi := s/n, (s+n-1)/n
	leader := make([]int, s)
	load := make([]int, n)
	isMember := func(g, p int) bool { return slices.Contains(members[g], p) }

	// Upper bound: every group gets a leader with load <= hi.
	for g := range s {
		best := -1
		for _, p := range members[g] {
			if load[p] < hi && (best < 0 || load[p] < load[best]) {
				best = p
			}
		}
		if best >= 0 {
			leader[g], load[best] = best, load[best]+1
			continue
		}
		// Augmenting path: BFS over nodes; a node reached through group h
		// would take h's leadership, freeing its current leader to take
		// the next one, until a node below hi absorbs the extra group.
		via := make([]int, n) // group through which a node was reached, -1 = unvisited
		for i := range via {
			via[i] = -1
		}
		queue := []int{}
		for _, p := range members[g] {
			via[p] = g
			queue = append(queue, p)
		}
		leader[g] = -1
		for len(queue) > 0 {
			p := queue[0]
			queue = queue[1:]
			if load[p] < hi {
				load[p]++
				for h := via[p]; ; {
					prev := leader[h]
					leader[h] = p
					if h == g {
						break
					}
					p, h = prev, via[prev]
				}
				break
			}
			for h := range g {
				if leader[h] != p {
					continue
				}
				for _, q := range members[h] {
					if via[q] < 0 {
						via[q] = h
						queue = append(queue, q)
					}
				}
			}
		}
		if leader[g] < 0 {
			panic(fmt.Sprintf("shard: no leader assignment for group %d below %d groups a node: Hall's condition failed", g, hi))
		}
	}

	// Lower bound: a node below lo takes a group, along a path of
	// leadership moves, from a node above lo.
	for u := range n {
		for load[u] < lo {
			type step struct{ group, taker int }
			from := make([]step, n) // for node y: the group it loses and who takes it
			seen := make([]bool, n)
			seen[u] = true
			queue := []int{u}
			found := -1
			for len(queue) > 0 && found < 0 {
				x := queue[0]
				queue = queue[1:]
				for h := range s {
					y := leader[h]
					if seen[y] || !isMember(h, x) {
						continue
					}
					seen[y] = true
					from[y] = step{h, x}
					if load[y] > lo {
						found = y
						break
					}
					queue = append(queue, y)
				}
			}
			if found < 0 {
				panic(fmt.Sprintf("shard: node position %d leads %d groups, below %d, and no path gives it one: Hall's condition failed", u, load[u], lo))
			}
			load[found]--
			load[u]++
			for y := found; y != u; {
				st := from[y]
				leader[st.group] = st.taker
				y = st.taker
			}
		}
	}
	return leader
}
