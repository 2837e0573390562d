package shard

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// Part is the share of a batch that goes to one group: the positions in
// the batch of the entities the group owns, ascending.
type Part struct {
	Group   GroupID
	Indexes []int
}

// SplitBatch splits a batch of entity ids by owning group: one Part per
// group owning at least one of them, in the order of the groups' slot
// ranges, each listing the positions of its entities in batch order. The
// request splitter sends each part to its group and maps per-event
// answers back through Indexes.
func (m *Map) SplitBatch(entities []uint64) []Part {
	if len(entities) == 0 {
		return nil
	}
	pos := make([]int, len(entities))
	if len(m.Groups) == 1 {
		for i := range pos {
			pos[i] = i
		}
		return []Part{{Group: m.Groups[0].ID, Indexes: pos}}
	}
	var giBuf [128]int32
	gi := giBuf[:0]
	if len(entities) > len(giBuf) {
		gi = make([]int32, 0, len(entities))
	}
	for _, e := range entities {
		gi = append(gi, int32(m.groupIndexOfSlot(SlotOf(e))))
	}
	if len(m.Groups) > countingSortGroups {
		// Stable: positions of one group stay in batch order.
		for i := range pos {
			pos[i] = i
		}
		slices.SortStableFunc(pos, func(a, b int) int { return cmp.Compare(gi[a], gi[b]) })
	} else {
		// Counting sort by group index, stable by construction.
		var start [countingSortGroups + 1]int32
		for _, g := range gi {
			start[g+1]++
		}
		for g := 1; g <= len(m.Groups); g++ {
			start[g] += start[g-1]
		}
		for i, g := range gi {
			pos[start[g]] = i
			start[g]++
		}
	}
	runs := 1
	for i := 1; i < len(pos); i++ {
		if gi[pos[i]] != gi[pos[i-1]] {
			runs++
		}
	}
	parts := make([]Part, 0, runs)
	for i := 0; i < len(pos); {
		j := i + 1
		for j < len(pos) && gi[pos[j]] == gi[pos[i]] {
			j++
		}
		parts = append(parts, Part{Group: m.Groups[gi[pos[i]]].ID, Indexes: pos[i:j:j]})
		i = j
	}
	return parts
}

// countingSortGroups is the most groups SplitBatch sorts a batch by
// counting, with its counters on the stack; above it, a stable sort.
const countingSortGroups = 256

// CheckRoute decides whether a node whose map is m may serve a request a
// client routed to group g, with a map at epoch routed, for these
// entities: it may when, in m, group g exists and owns the slot of every
// entity. Otherwise the answer is an *EpochMismatch carrying m, so the
// client refreshes and re-routes once (never a silent re-route by the
// node).
//
// A request routed with an older epoch whose entities g still owns is
// served: ownership, not the epoch, decides correctness, and a map
// change elsewhere (a leader hint, another group's move) must not bounce
// every client. m may itself be behind the client's map (routed >
// m.Epoch); the answer is then an EpochMismatch whose map is older than
// the client's, which the client ignores (it adopts only a higher epoch)
// and retries, while the node fetches the newer map. The node's map is a
// cache: the group's own apply is where a command for slots it no longer
// owns is finally refused (docs/ARCHITECTURE.md "Shards").
func (m *Map) CheckRoute(g GroupID, routed uint64, entities []uint64) error {
	if gi := m.groupIndex(g); gi >= 0 {
		grp := &m.Groups[gi]
		ok := true
		for _, e := range entities {
			if s := SlotOf(e); s < grp.Start || s >= grp.End {
				ok = false
				break
			}
		}
		if ok {
			return nil
		}
	}
	return &EpochMismatch{Group: g, Routed: routed, Current: m.clone()}
}

// NotLeaderOf is the answer of a node that cannot serve group g here —
// it holds no replica of g, or g's request needs the leader and this
// replica is not it — with the fix: g's replicas and a leader hint, the
// raft leader the node knows (hint) or else g's preferred leader.
func (m *Map) NotLeaderOf(g GroupID, hint NodeID) error {
	grp, ok := m.Group(g)
	if !ok {
		return &EpochMismatch{Group: g, Current: m.clone()}
	}
	if hint == 0 {
		hint = grp.Leader
	}
	return &NotLeader{Group: g, Epoch: m.Epoch, Leader: hint, Replicas: slices.Clone(grp.Replicas)}
}

// StatusMisdirected is the HTTP status of both routing answers (421
// Misdirected Request: this node cannot answer for that group; the body
// says where to go).
const StatusMisdirected = http.StatusMisdirectedRequest

// Error codes of the routing answers in the API's JSON error body.
const (
	CodeEpochMismatch = "epoch_mismatch"
	CodeNotLeader     = "not_leader"
)

// EpochMismatch is the answer to a request routed with a map that does
// not match the node's: Current is the node's map, which the client adopts
// if its epoch is above the client's own, and re-routes (like TiKV's
// EpochNotMatch, which carries the current regions).
type EpochMismatch struct {
	Group   GroupID // the group the request was routed to
	Routed  uint64  // the epoch of the map the client routed with; 0 when not known
	Current Map     // the node's map
}

func (e *EpochMismatch) Error() string {
	if e.Current.Epoch < e.Routed {
		return fmt.Sprintf("request routed to group %d with map epoch %d, but this node's map is older (epoch %d): retry; the node is fetching the newer map",
			e.Group, e.Routed, e.Current.Epoch)
	}
	where := fmt.Sprintf("group %d does not exist", e.Group)
	if g, ok := e.Current.Group(e.Group); ok {
		where = fmt.Sprintf("group %d owns slots [%d,%d), which do not hold every entity of the request", e.Group, g.Start, g.End)
	}
	routed := fmt.Sprintf("request routed to group %d with map epoch %d", e.Group, e.Routed)
	if e.Routed == 0 {
		routed = fmt.Sprintf("request for group %d", e.Group)
	}
	return fmt.Sprintf("%s; at epoch %d (this node's map) %s: refresh the map and re-route", routed, e.Current.Epoch, where)
}

// NotLeader is the answer of a node that cannot serve the group: go to
// Leader (0: unknown, try the replicas), or to one of Replicas.
type NotLeader struct {
	Group    GroupID
	Epoch    uint64 // the epoch of the node's map
	Leader   NodeID
	Replicas []Replica
}

func (e *NotLeader) Error() string {
	nodes := make([]NodeID, len(e.Replicas))
	for i, r := range e.Replicas {
		nodes[i] = r.Node
	}
	return fmt.Sprintf("this node cannot serve group %d: its leader is node %d (replicas on nodes %s, map epoch %d)",
		e.Group, e.Leader, joinIDs(nodes), e.Epoch)
}

// The JSON forms follow the API's error body, {"error":{"code","message",
// "field"}}, with one more member named after the code holding the fix:
//
//	{"error":{"code":"epoch_mismatch","message":"...","field":"",
//	  "epoch_mismatch":{"group":3,"routed_epoch":4,"map":{...}}}}
//	{"error":{"code":"not_leader","message":"...","field":"",
//	  "not_leader":{"group":3,"epoch":7,"leader":2,"replicas":[{"node":2,"id":2,"role":"voter"},...]}}}
//
// The map member is Map's JSON form (MarshalJSON).

type routeBody struct {
	Error struct {
		Code          string             `json:"code"`
		Message       string             `json:"message"`
		Field         string             `json:"field"`
		EpochMismatch *epochMismatchJSON `json:"epoch_mismatch,omitempty"`
		NotLeader     *notLeaderJSON     `json:"not_leader,omitempty"`
	} `json:"error"`
}

type epochMismatchJSON struct {
	Group  GroupID `json:"group"`
	Routed uint64  `json:"routed_epoch"`
	Map    *Map    `json:"map"`
}

type notLeaderJSON struct {
	Group    GroupID       `json:"group"`
	Epoch    uint64        `json:"epoch"`
	Leader   NodeID        `json:"leader"`
	Replicas []replicaJSON `json:"replicas"`
}

// EncodeRouteError returns the JSON error body of the *EpochMismatch or
// *NotLeader in err's chain (errors.As); ok is false when there is none.
func EncodeRouteError(err error) (body []byte, ok bool) {
	var b routeBody
	var em *EpochMismatch
	var nl *NotLeader
	switch {
	case errors.As(err, &em):
		b.Error.Code = CodeEpochMismatch
		b.Error.Message = em.Error()
		b.Error.EpochMismatch = &epochMismatchJSON{Group: em.Group, Routed: em.Routed, Map: &em.Current}
	case errors.As(err, &nl):
		b.Error.Code = CodeNotLeader
		b.Error.Message = nl.Error()
		j := &notLeaderJSON{Group: nl.Group, Epoch: nl.Epoch, Leader: nl.Leader, Replicas: []replicaJSON{}}
		for _, r := range nl.Replicas {
			j.Replicas = append(j.Replicas, toReplicaJSON(r))
		}
		b.Error.NotLeader = j
	default:
		return nil, false
	}
	out, jerr := json.Marshal(&b)
	if jerr != nil {
		return nil, false
	}
	return out, true
}

// DecodeRouteError parses a JSON error body into the *EpochMismatch or
// *NotLeader it carries. The map of an EpochMismatch is validated. It
// returns an error naming what it found when the body is neither.
func DecodeRouteError(body []byte) (error, error) {
	var b routeBody
	if err := json.Unmarshal(body, &b); err != nil {
		return nil, fmt.Errorf("routing error body: %w", err)
	}
	switch b.Error.Code {
	case CodeEpochMismatch:
		em := b.Error.EpochMismatch
		if em == nil || em.Map == nil {
			return nil, fmt.Errorf("routing error body: code %q without its %q member and map", CodeEpochMismatch, "epoch_mismatch")
		}
		return &EpochMismatch{Group: em.Group, Routed: em.Routed, Current: *em.Map}, nil
	case CodeNotLeader:
		nl := b.Error.NotLeader
		if nl == nil {
			return nil, fmt.Errorf("routing error body: code %q without its %q member", CodeNotLeader, "not_leader")
		}
		e := &NotLeader{Group: nl.Group, Epoch: nl.Epoch, Leader: nl.Leader}
		for _, r := range nl.Replicas {
			rr, err := r.replica()
			if err != nil {
				return nil, fmt.Errorf("routing error body: not_leader: %w", err)
			}
			e.Replicas = append(e.Replicas, rr)
		}
		return e, nil
	}
	return nil, fmt.Errorf("routing error body: code %q, expected %q or %q", b.Error.Code, CodeEpochMismatch, CodeNotLeader)
}

// Map's JSON form, for the HTTP API (a client's cache, EpochMismatch,
// an admin endpoint). The binary encoding (Encode) is the durable one.

type mapJSON struct {
	Epoch             uint64      `json:"epoch"`
	Slots             int         `json:"slots"`
	ReplicationFactor int         `json:"replication_factor"`
	NextGroupID       GroupID     `json:"next_group_id"`
	Nodes             []NodeID    `json:"nodes"`
	Meta              []NodeID    `json:"meta"`
	Groups            []groupJSON `json:"groups"`
}

type groupJSON struct {
	ID            GroupID       `json:"id"`
	Start         Slot          `json:"start"`
	End           Slot          `json:"end"`
	Leader        NodeID        `json:"leader"`
	ConfEpoch     uint64        `json:"conf_epoch"`
	SlotsEpoch    uint64        `json:"slots_epoch"`
	NextReplicaID ReplicaID     `json:"next_replica_id"`
	Replicas      []replicaJSON `json:"replicas"`
}

type replicaJSON struct {
	Node NodeID    `json:"node"`
	ID   ReplicaID `json:"id"`
	Role string    `json:"role"`
}

func toReplicaJSON(r Replica) replicaJSON {
	return replicaJSON{Node: r.Node, ID: r.ID, Role: r.Role.String()}
}

func (r replicaJSON) replica() (Replica, error) {
	out := Replica{Node: r.Node, ID: r.ID}
	switch r.Role {
	case "voter":
		out.Role = Voter
	case "learner":
		out.Role = Learner
	default:
		return Replica{}, fmt.Errorf("replica on node %d has role %q, expected \"voter\" or \"learner\"", r.Node, r.Role)
	}
	return out, nil
}

// MarshalJSON returns m's JSON form.
func (m *Map) MarshalJSON() ([]byte, error) {
	j := mapJSON{Epoch: m.Epoch, Slots: NumSlots, ReplicationFactor: m.ReplicationFactor, NextGroupID: m.NextGroupID,
		Nodes: m.Nodes, Meta: m.Meta, Groups: make([]groupJSON, len(m.Groups))}
	for i, g := range m.Groups {
		gj := groupJSON{ID: g.ID, Start: g.Start, End: g.End, Leader: g.Leader, ConfEpoch: g.ConfEpoch,
			SlotsEpoch: g.SlotsEpoch, NextReplicaID: g.NextReplicaID, Replicas: make([]replicaJSON, len(g.Replicas))}
		for k, r := range g.Replicas {
			gj.Replicas[k] = toReplicaJSON(r)
		}
		j.Groups[i] = gj
	}
	return json.Marshal(&j)
}

// UnmarshalJSON parses m's JSON form and validates it.
func (m *Map) UnmarshalJSON(b []byte) error {
	var j mapJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	if j.Slots != NumSlots {
		return fmt.Errorf("shard map: slot count %d, this build has %d: the slot space is fixed for a cluster", j.Slots, NumSlots)
	}
	out := Map{Epoch: j.Epoch, ReplicationFactor: j.ReplicationFactor, NextGroupID: j.NextGroupID, Nodes: j.Nodes, Meta: j.Meta}
	for _, gj := range j.Groups {
		g := Group{ID: gj.ID, Start: gj.Start, End: gj.End, Leader: gj.Leader, ConfEpoch: gj.ConfEpoch,
			SlotsEpoch: gj.SlotsEpoch, NextReplicaID: gj.NextReplicaID}
		for _, rj := range gj.Replicas {
			r, err := rj.replica()
			if err != nil {
				return fmt.Errorf("shard map: group %d: %w", gj.ID, err)
			}
			g.Replicas = append(g.Replicas, r)
		}
		out.Groups = append(out.Groups, g)
	}
	if err := out.Validate(); err != nil {
		return err
	}
	*m = out
	return nil
}
