package shard

import (
	"fmt"
	"slices"
)

// The changes below are the only ways a map changes. Each returns a new
// Map with Epoch one higher and leaves the receiver as it was; a change
// that would break an invariant of Map returns an error naming it and no
// map. The groups a change touches get the new epoch as their ConfEpoch
// (replica set changed) or SlotsEpoch (slot range changed).

// ChangeError is a change the map refuses: Op names the change, Problem
// what it expected and found.
type ChangeError struct {
	Op      string
	Problem string
}

func (e *ChangeError) Error() string { return e.Op + ": " + e.Problem }

func refuse(op, format string, args ...any) error {
	return &ChangeError{Op: op, Problem: fmt.Sprintf(format, args...)}
}

// next returns a deep copy of m at the next epoch, for a change to edit.
func (m *Map) next() Map {
	c := m.clone()
	c.Epoch++
	return c
}

// done validates the changed map: a change that passes its own checks
// but breaks an invariant is a bug in this package, not the caller's, and
// is still refused rather than returned.
func done(op string, c Map) (Map, error) {
	if err := c.Validate(); err != nil {
		return Map{}, refuse(op, "the result is not a valid map: %v", err)
	}
	return c, nil
}

// AddNode adds a node that hosts nothing yet.
func (m *Map) AddNode(n NodeID) (Map, error) {
	op := fmt.Sprintf("add node %d", n)
	if n == 0 {
		return Map{}, refuse(op, "node id 0, expected >= 1")
	}
	if m.hasNode(n) {
		return Map{}, refuse(op, "node %d is already a node of the map", n)
	}
	c := m.next()
	i, _ := slices.BinarySearch(c.Nodes, n)
	c.Nodes = slices.Insert(c.Nodes, i, n)
	return done(op, c)
}

// RemoveNode removes a node that hosts no replica and no meta voter.
func (m *Map) RemoveNode(n NodeID) (Map, error) {
	op := fmt.Sprintf("remove node %d", n)
	if !m.hasNode(n) {
		return Map{}, refuse(op, "node %d is not a node of the map (nodes %s)", n, joinIDs(m.Nodes))
	}
	if gs := m.GroupsOn(n); len(gs) > 0 {
		return Map{}, refuse(op, "node %d still hosts replicas of groups %s, expected none (move them first)", n, joinIDs(gs))
	}
	if slices.Contains(m.Meta, n) {
		return Map{}, refuse(op, "node %d is a meta voter (%s), expected it moved out of the meta group first", n, joinIDs(m.Meta))
	}
	if len(m.Nodes)-1 < m.ReplicationFactor {
		return Map{}, refuse(op, "%d nodes would be left, expected at least %d (the replication factor)", len(m.Nodes)-1, m.ReplicationFactor)
	}
	c := m.next()
	c.Nodes = slices.DeleteFunc(c.Nodes, func(x NodeID) bool { return x == n })
	return done(op, c)
}

// AddLearner adds a learner replica of group g on node n. Its raft id is
// n's id when that id is at or above the group's NextReplicaID, so never
// used in the group — always so for nodes added in increasing id order,
// as today's single group adds members — and NextReplicaID otherwise (n
// held a replica of g before, or an id above n's was handed out since).
// NextReplicaID then moves past the id given.
func (m *Map) AddLearner(g GroupID, n NodeID) (Map, error) {
	op := fmt.Sprintf("add learner of group %d on node %d", g, n)
	gi := m.groupIndex(g)
	if gi < 0 {
		return Map{}, refuse(op, "no group %d", g)
	}
	if !m.hasNode(n) {
		return Map{}, refuse(op, "node %d is not a node of the map (nodes %s)", n, joinIDs(m.Nodes))
	}
	if r, ok := m.Groups[gi].Replica(n); ok {
		return Map{}, refuse(op, "node %d already holds replica %d (%v) of group %d, expected at most one per node", n, r.ID, r.Role, g)
	}
	c := m.next()
	grp := &c.Groups[gi]
	id := ReplicaID(n)
	if id < grp.NextReplicaID {
		id = grp.NextReplicaID
	}
	grp.NextReplicaID = id + 1
	grp.Replicas = append(grp.Replicas, Replica{Node: n, ID: id, Role: Learner})
	sortReplicas(grp.Replicas)
	grp.ConfEpoch = c.Epoch
	return done(op, c)
}

// Promote makes group g's learner on node n a voter.
func (m *Map) Promote(g GroupID, n NodeID) (Map, error) {
	op := fmt.Sprintf("promote group %d's replica on node %d", g, n)
	gi := m.groupIndex(g)
	if gi < 0 {
		return Map{}, refuse(op, "no group %d", g)
	}
	r, ok := m.Groups[gi].Replica(n)
	if !ok {
		return Map{}, refuse(op, "group %d has no replica on node %d (voters %s)", g, n, joinIDs(m.Groups[gi].Voters()))
	}
	if r.Role != Learner {
		return Map{}, refuse(op, "replica %d on node %d is a %v, expected a learner", r.ID, n, r.Role)
	}
	c := m.next()
	grp := &c.Groups[gi]
	for i := range grp.Replicas {
		if grp.Replicas[i].Node == n {
			grp.Replicas[i].Role = Voter
		}
	}
	grp.ConfEpoch = c.Epoch
	return done(op, c)
}

// RemoveReplica removes group g's replica on node n; its id becomes a
// tombstone. A voter may go only while ReplicationFactor voters remain,
// and never the preferred leader (SetLeader elsewhere first).
func (m *Map) RemoveReplica(g GroupID, n NodeID) (Map, error) {
	op := fmt.Sprintf("remove group %d's replica on node %d", g, n)
	gi := m.groupIndex(g)
	if gi < 0 {
		return Map{}, refuse(op, "no group %d", g)
	}
	grp := m.Groups[gi]
	r, ok := grp.Replica(n)
	if !ok {
		return Map{}, refuse(op, "group %d has no replica on node %d", g, n)
	}
	if grp.Leader == n {
		return Map{}, refuse(op, "node %d is the group's preferred leader, expected another voter to be made leader first", n)
	}
	if v := len(grp.Voters()); r.Role == Voter && v-1 < m.ReplicationFactor {
		return Map{}, refuse(op, "%d voters would be left, expected at least %d (the replication factor): add and promote a replacement first", v-1, m.ReplicationFactor)
	}
	c := m.next()
	cg := &c.Groups[gi]
	cg.Replicas = slices.DeleteFunc(cg.Replicas, func(x Replica) bool { return x.Node == n })
	cg.ConfEpoch = c.Epoch
	return done(op, c)
}

// SetLeader makes the voter of group g on node n its preferred leader.
// The replica set is unchanged, so ConfEpoch stays.
func (m *Map) SetLeader(g GroupID, n NodeID) (Map, error) {
	op := fmt.Sprintf("set group %d's preferred leader to node %d", g, n)
	gi := m.groupIndex(g)
	if gi < 0 {
		return Map{}, refuse(op, "no group %d", g)
	}
	if r, ok := m.Groups[gi].Replica(n); !ok || r.Role != Voter {
		return Map{}, refuse(op, "node %d holds no voter of group %d (voters %s)", n, g, joinIDs(m.Groups[gi].Voters()))
	}
	c := m.next()
	c.Groups[gi].Leader = n
	return done(op, c)
}

// Split cuts group g at slot at: g keeps [Start, at), and a new group
// takes [at, End) on the same nodes with the same roles and preferred
// leader (a raft-level split creates it beside g on every replica, as
// TiKV and CockroachDB split). The new group's id is NextGroupID; group
// ids, like replica ids, are never reused. Returns the new map and the new
// group's id.
func (m *Map) Split(g GroupID, at Slot) (Map, GroupID, error) {
	op := fmt.Sprintf("split group %d at slot %d", g, at)
	gi := m.groupIndex(g)
	if gi < 0 {
		return Map{}, 0, refuse(op, "no group %d", g)
	}
	old := m.Groups[gi]
	if at <= old.Start || at >= old.End {
		return Map{}, 0, refuse(op, "group %d owns [%d,%d), expected a split slot in %d..%d", g, old.Start, old.End, old.Start+1, old.End-1)
	}
	c := m.next()
	id := c.NextGroupID
	c.NextGroupID++
	right := Group{ID: id, Start: at, End: old.End, Leader: old.Leader, ConfEpoch: c.Epoch, SlotsEpoch: c.Epoch}
	for _, r := range old.Replicas {
		right.Replicas = append(right.Replicas, Replica{Node: r.Node, ID: ReplicaID(r.Node), Role: r.Role})
		right.NextReplicaID = max(right.NextReplicaID, ReplicaID(r.Node)+1)
	}
	c.Groups[gi].End = at
	c.Groups[gi].SlotsEpoch = c.Epoch
	c.Groups = slices.Insert(c.Groups, gi+1, right)
	out, err := done(op, c)
	if err != nil {
		return Map{}, 0, err
	}
	return out, id, nil
}

// Merge folds group right into group left: they must be adjacent (left
// ends where right starts) and have replicas on the same nodes with the
// same roles (a raft-level merge needs both on every replica). left takes
// [left.Start, right.End); right's id is retired for ever.
func (m *Map) Merge(left, right GroupID) (Map, error) {
	op := fmt.Sprintf("merge group %d into group %d", right, left)
	li, ri := m.groupIndex(left), m.groupIndex(right)
	switch {
	case li < 0:
		return Map{}, refuse(op, "no group %d", left)
	case ri < 0:
		return Map{}, refuse(op, "no group %d", right)
	case ri != li+1:
		return Map{}, refuse(op, "group %d owns [%d,%d) and group %d [%d,%d), expected the second to start where the first ends",
			left, m.Groups[li].Start, m.Groups[li].End, right, m.Groups[ri].Start, m.Groups[ri].End)
	}
	lg, rg := m.Groups[li], m.Groups[ri]
	if placement(lg) != placement(rg) {
		return Map{}, refuse(op, "group %d has replicas %s and group %d %s, expected the same nodes and roles", left, placement(lg), right, placement(rg))
	}
	c := m.next()
	c.Groups[li].End = rg.End
	c.Groups[li].SlotsEpoch = c.Epoch
	c.Groups = slices.Delete(c.Groups, ri, ri+1)
	return done(op, c)
}

// placement is a group's nodes and roles, for comparing two groups.
func placement(g Group) string {
	s := ""
	for i, r := range g.Replicas {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%d", r.Node)
		if r.Role == Learner {
			s += "(learner)"
		}
	}
	return "[" + s + "]"
}
