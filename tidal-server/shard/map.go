package shard

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// NodeID names a tidal-server process (its --id): > 0, never reused.
type NodeID uint64

// GroupID names a raft group. Data groups are numbered from 1; MetaGroup
// (0) is the group that keeps the shard map itself and owns no slots.
type GroupID uint64

// MetaGroup is the id of the meta group, the raft group whose replicated
// state is the shard map (docs/ARCHITECTURE.md "Shards").
const MetaGroup GroupID = 0

// ReplicaID is a replica's raft id inside its group. It is unique in the
// group for the group's whole life: a removed replica's id is never given
// to another replica of that group, so its raft messages can be refused
// for ever (every id below the group's NextReplicaID that is not a current
// replica is a tombstone).
type ReplicaID uint64

// Role is a replica's raft role.
type Role uint8

const (
	// Voter is a full raft member: it counts for quorum and may lead.
	Voter Role = 1
	// Learner receives the log but does not vote: a replica being added
	// joins as a learner and is promoted once it has caught up.
	Learner Role = 2
)

func (r Role) String() string {
	switch r {
	case Voter:
		return "voter"
	case Learner:
		return "learner"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Replica is one copy of a group on a node.
type Replica struct {
	Node NodeID
	ID   ReplicaID
	Role Role
}

// Group is one data group: the slots [Start, End) and the replicas that
// hold them.
type Group struct {
	ID GroupID
	// Start and End bound the contiguous slot range the group owns,
	// Start < End <= NumSlots.
	Start, End Slot
	// Replicas, ordered by node id; at most one per node.
	Replicas []Replica
	// Leader is the preferred leader: a voter of the group that placement
	// wants to lead it (raft elects whom it elects; a leader transfer
	// moves leadership here). It is also the leader hint of a NotLeader
	// answer when the node knows no better.
	Leader NodeID
	// ConfEpoch is the map epoch at which the group's replica set (nodes
	// or roles) last changed; SlotsEpoch the map epoch at which its slot
	// range last changed. Together they are the group's epoch, TiKV's
	// region epoch {conf_ver, version} counted on the map's clock, so that
	// any two are ordered: a client whose map epoch is below SlotsEpoch
	// routed with a range the group no longer has.
	ConfEpoch, SlotsEpoch uint64
	// NextReplicaID is above every replica id the group ever used.
	NextReplicaID ReplicaID
}

// Map is the shard map: which group owns each slot, which nodes hold each
// group, and the epoch the whole map is at.
//
// A Map is a value. Its methods never modify it: every change returns a
// new Map, sharing nothing mutable with the old one, with Epoch one
// higher. A Map that a function of this package returns without error
// satisfies Validate; callers that build one by hand (a decoder, a test)
// must call Validate before using it.
type Map struct {
	// Epoch is bumped by every change; 1 for a bootstrapped map.
	Epoch uint64
	// ReplicationFactor is the number of voters every group must have at
	// least (a group passes through R+1 voters while a replica moves).
	ReplicationFactor int
	// Nodes is every node of the cluster, ascending.
	Nodes []NodeID
	// Meta is the voters the meta group was placed on, ascending.
	Meta []NodeID
	// Groups, ordered by Start: their ranges tile [0, NumSlots) exactly.
	Groups []Group
	// NextGroupID is above every group id the map ever used: a merged
	// group's id is never given to another group.
	NextGroupID GroupID
}

// GroupOf returns the data group that owns the entity's slot.
func (m *Map) GroupOf(entity uint64) GroupID {
	return m.Groups[m.groupIndexOfSlot(SlotOf(entity))].ID
}

// GroupOfSlot returns the data group that owns slot s (s < NumSlots).
func (m *Map) GroupOfSlot(s Slot) GroupID {
	return m.Groups[m.groupIndexOfSlot(s)].ID
}

// groupIndexOfSlot is the index in m.Groups of the group owning s: the
// last group starting at or before s (the ranges tile the slot space).
func (m *Map) groupIndexOfSlot(s Slot) int {
	i, j := 0, len(m.Groups)
	for j-i > 1 {
		h := int(uint(i+j) >> 1)
		if m.Groups[h].Start <= s {
			i = h
		} else {
			j = h
		}
	}
	return i
}

// Group returns the group with id g.
func (m *Map) Group(g GroupID) (Group, bool) {
	if i := m.groupIndex(g); i >= 0 {
		return m.Groups[i], true
	}
	return Group{}, false
}

func (m *Map) groupIndex(g GroupID) int {
	for i := range m.Groups {
		if m.Groups[i].ID == g {
			return i
		}
	}
	return -1
}

// GroupsOn returns the groups with a replica (voter or learner) on node n,
// by slot order.
func (m *Map) GroupsOn(n NodeID) []GroupID {
	var out []GroupID
	for i := range m.Groups {
		if _, ok := m.Groups[i].Replica(n); ok {
			out = append(out, m.Groups[i].ID)
		}
	}
	return out
}

// Replica returns the group's replica on node n.
func (g *Group) Replica(n NodeID) (Replica, bool) {
	for _, r := range g.Replicas {
		if r.Node == n {
			return r, true
		}
	}
	return Replica{}, false
}

// Voters returns the nodes holding a voter of the group, ascending.
func (g *Group) Voters() []NodeID {
	var out []NodeID
	for _, r := range g.Replicas {
		if r.Role == Voter {
			out = append(out, r.Node)
		}
	}
	return out
}

// Tombstoned reports whether id is a replica id the group used and
// removed: its raft messages are refused for ever.
func (g *Group) Tombstoned(id ReplicaID) bool {
	if id == 0 || id >= g.NextReplicaID {
		return false
	}
	for _, r := range g.Replicas {
		if r.ID == id {
			return false
		}
	}
	return true
}

// Slots returns the number of slots the group owns.
func (g *Group) Slots() int { return int(g.End - g.Start) }

// clone returns a deep copy of m.
func (m *Map) clone() Map {
	c := *m
	c.Nodes = slices.Clone(m.Nodes)
	c.Meta = slices.Clone(m.Meta)
	c.Groups = make([]Group, len(m.Groups))
	for i, g := range m.Groups {
		g.Replicas = slices.Clone(g.Replicas)
		c.Groups[i] = g
	}
	return c
}

// ValidationError is a map that breaks an invariant of Map: Where names
// the part (the map, a group, a slot range), Problem what was expected and
// what was found there.
type ValidationError struct {
	Where   string
	Problem string
}

func (e *ValidationError) Error() string {
	return "invalid shard map: " + e.Where + ": " + e.Problem
}

func invalidf(where, format string, args ...any) error {
	return &ValidationError{Where: where, Problem: fmt.Sprintf(format, args...)}
}

// Validate checks every invariant of a Map and returns the first one
// broken, as a *ValidationError:
//
//   - Epoch >= 1; 1 <= ReplicationFactor <= len(Nodes).
//   - Nodes and Meta ascending without duplicates or zero; Meta non-empty
//     and made of known nodes.
//   - Groups ordered by Start, each Start < End, the first starting at
//     slot 0, each starting where the previous ended (else a slot is
//     owned twice or by nobody), the last ending at NumSlots.
//   - Group ids unique, not MetaGroup, below NextGroupID.
//   - Per group: replicas ordered by node, one per node, on known nodes,
//     with roles Voter or Learner and distinct ids in [1, NextReplicaID);
//     at least ReplicationFactor voters; Leader one of them; 1 <=
//     ConfEpoch, SlotsEpoch <= Epoch.
func (m *Map) Validate() error {
	if m.Epoch == 0 {
		return invalidf("map", "epoch is 0, expected >= 1")
	}
	if err := checkIDs("nodes", m.Nodes); err != nil {
		return err
	}
	if len(m.Nodes) == 0 {
		return invalidf("nodes", "no nodes, expected at least one")
	}
	if m.ReplicationFactor < 1 || m.ReplicationFactor > len(m.Nodes) {
		return invalidf("map", "replication factor %d, expected 1..%d (the number of nodes)", m.ReplicationFactor, len(m.Nodes))
	}
	if err := checkIDs("meta", m.Meta); err != nil {
		return err
	}
	if len(m.Meta) == 0 {
		return invalidf("meta", "no meta voters, expected at least one")
	}
	for _, n := range m.Meta {
		if !m.hasNode(n) {
			return invalidf("meta", "node %d is not a node of the map (nodes %s)", n, joinIDs(m.Nodes))
		}
	}
	if len(m.Groups) == 0 {
		return invalidf("groups", "no groups, expected the slots [0,%d) to be owned", NumSlots)
	}
	ids := make(map[GroupID]bool, len(m.Groups))
	next := Slot(0)
	for i := range m.Groups {
		g := &m.Groups[i]
		where := fmt.Sprintf("group %d", g.ID)
		if g.ID == MetaGroup {
			return invalidf(where, "id 0 is the meta group's, which owns no slots; data groups are numbered from 1")
		}
		if ids[g.ID] {
			return invalidf(where, "listed twice")
		}
		if g.ID >= m.NextGroupID {
			return invalidf(where, "id %d, expected below the next group id %d", g.ID, m.NextGroupID)
		}
		ids[g.ID] = true
		if g.Start >= g.End || g.End > NumSlots {
			return invalidf(where, "slot range [%d,%d), expected start < end <= %d", g.Start, g.End, NumSlots)
		}
		switch {
		case g.Start > next:
			return invalidf(fmt.Sprintf("slots [%d,%d)", next, g.Start), "owned by no group (the next group, %d, starts at %d)", g.ID, g.Start)
		case g.Start < next:
			prev := m.Groups[i-1]
			return invalidf(fmt.Sprintf("slots [%d,%d)", g.Start, min(next, g.End)), "owned twice: by group %d [%d,%d) and group %d [%d,%d)",
				prev.ID, prev.Start, prev.End, g.ID, g.Start, g.End)
		}
		next = g.End
		if err := m.validateGroup(g, where); err != nil {
			return err
		}
	}
	if next != NumSlots {
		return invalidf(fmt.Sprintf("slots [%d,%d)", next, NumSlots), "owned by no group (the last group, %d, ends at %d)", m.Groups[len(m.Groups)-1].ID, next)
	}
	return nil
}

func (m *Map) validateGroup(g *Group, where string) error {
	if g.ConfEpoch == 0 || g.ConfEpoch > m.Epoch || g.SlotsEpoch == 0 || g.SlotsEpoch > m.Epoch {
		return invalidf(where, "conf epoch %d and slots epoch %d, expected each in 1..%d (the map's epoch)", g.ConfEpoch, g.SlotsEpoch, m.Epoch)
	}
	seen := make(map[ReplicaID]NodeID, len(g.Replicas))
	voters, leaderVotes := 0, false
	for j, r := range g.Replicas {
		if j > 0 && g.Replicas[j-1].Node >= r.Node {
			if g.Replicas[j-1].Node == r.Node {
				return invalidf(where, "two replicas on node %d, expected at most one per node", r.Node)
			}
			return invalidf(where, "replicas out of order (node %d after node %d), expected ascending node ids", r.Node, g.Replicas[j-1].Node)
		}
		if !m.hasNode(r.Node) {
			return invalidf(where, "replica on unknown node %d (nodes %s)", r.Node, joinIDs(m.Nodes))
		}
		if r.Role != Voter && r.Role != Learner {
			return invalidf(where, "replica on node %d has %v, expected voter or learner", r.Node, r.Role)
		}
		if r.ID == 0 || r.ID >= g.NextReplicaID {
			return invalidf(where, "replica on node %d has id %d, expected 1..%d (below the next replica id)", r.Node, r.ID, g.NextReplicaID-1)
		}
		if other, dup := seen[r.ID]; dup {
			return invalidf(where, "replica id %d used on nodes %d and %d, expected unique ids", r.ID, other, r.Node)
		}
		seen[r.ID] = r.Node
		if r.Role == Voter {
			voters++
			leaderVotes = leaderVotes || r.Node == g.Leader
		}
	}
	if voters < m.ReplicationFactor {
		return invalidf(where, "%d voters (nodes %s), expected at least %d (the replication factor)", voters, joinIDs(g.Voters()), m.ReplicationFactor)
	}
	if !leaderVotes {
		return invalidf(where, "preferred leader %d is not one of its voters (%s)", g.Leader, joinIDs(g.Voters()))
	}
	return nil
}

func checkIDs(where string, ids []NodeID) error {
	for i, n := range ids {
		if n == 0 {
			return invalidf(where, "node id 0, expected ids >= 1")
		}
		if i > 0 && ids[i-1] >= n {
			if ids[i-1] == n {
				return invalidf(where, "node %d listed twice", n)
			}
			return invalidf(where, "node %d after node %d, expected ascending ids", n, ids[i-1])
		}
	}
	return nil
}

func (m *Map) hasNode(n NodeID) bool {
	_, ok := slices.BinarySearch(m.Nodes, n)
	return ok
}

func joinIDs[T ~uint64](ids []T) string {
	if len(ids) == 0 {
		return "none"
	}
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(uint64(id))
	}
	return strings.Join(s, ",")
}

// sortReplicas orders replicas by node id, the order Validate requires.
func sortReplicas(rs []Replica) {
	sort.Slice(rs, func(i, j int) bool { return rs[i].Node < rs[j].Node })
}
