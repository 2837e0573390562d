package replica

import (
	"encoding/json"
	"fmt"
	"sort"

	"go.etcd.io/raft/v3/raftpb"
)

// Member is one node of the cluster as the replicated membership table
// knows it. The addresses travel in the ConfChange's context, so every node
// learns them from the log, and they are part of every snapshot.
type Member struct {
	ID         uint64 `json:"id"`
	PeerAddr   string `json:"peer_addr"`
	ClientAddr string `json:"client_addr,omitempty"`
}

// confContext is what a ConfChange carries: the member it adds (if any)
// and the request id of the proposer waiting for it.
type confContext struct {
	Member  Member `json:"member"`
	Request uint64 `json:"request,omitempty"`
	Origin  uint64 `json:"origin,omitempty"`
}

// membership is the replicated membership table. It is mutated only by the
// apply loop, in log order, so it is identical on every node at the same
// applied index.
type membership struct {
	Members map[uint64]Member `json:"members"`
	// Removed holds every id that was ever removed: ids are never reused,
	// because a removed node's stale log and votes must not count for a
	// newcomer that happens to get its id.
	Removed map[uint64]bool `json:"removed"`
}

func newMembership() *membership {
	return &membership{Members: map[uint64]Member{}, Removed: map[uint64]bool{}}
}

func (m *membership) sorted() []Member {
	out := make([]Member, 0, len(m.Members))
	for _, mem := range m.Members {
		out = append(out, mem)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// checkAdd reports why id cannot be added, or nil.
func (m *membership) checkAdd(id uint64) error {
	if id == 0 {
		return fmt.Errorf("member id 0 is reserved")
	}
	if m.Removed[id] {
		return fmt.Errorf("member id %d was removed earlier; ids are never reused", id)
	}
	if _, ok := m.Members[id]; ok {
		return fmt.Errorf("member id %d is already a member", id)
	}
	return nil
}

// refuse reports why the membership table refuses a change that reached
// the log, or "". The proposer checked the same things, but against its own
// applied table, which may lag (a follower that has not yet applied a
// removal) or race another change (a promotion racing a removal), so apply
// decides again, identically on every node.
func (m *membership) refuse(typ raftpb.ConfChangeType, id uint64) string {
	if id == 0 {
		return ""
	}
	switch typ {
	case raftpb.ConfChangeType_ConfChangeAddNode, raftpb.ConfChangeType_ConfChangeAddLearnerNode:
		if m.Removed[id] {
			return fmt.Sprintf("member id %d was removed earlier; ids are never reused", id)
		}
		// Adding a voter as a learner would demote it.
		if _, ok := m.Members[id]; ok && typ == raftpb.ConfChangeType_ConfChangeAddLearnerNode {
			return fmt.Sprintf("member id %d is already a member", id)
		}
	}
	return ""
}

// encodeSnapshot frames the membership table ahead of the state machine's
// bytes: u32 length | JSON | state machine snapshot.
func (m *membership) marshal() ([]byte, error) { return json.Marshal(m) }

func unmarshalMembership(b []byte) (*membership, error) {
	m := newMembership()
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("decode membership: %w", err)
	}
	if m.Members == nil {
		m.Members = map[uint64]Member{}
	}
	if m.Removed == nil {
		m.Removed = map[uint64]bool{}
	}
	return m, nil
}

// MemberStatus is what this node's applied membership says of id, for the
// peer transport's admission (who may send raft messages): current (a
// voter or a learner), removed (for good: ids are never reused), or
// neither. While the table is empty — a --join node before its first
// snapshot, or any node before it applied its bootstrap entries — the ids
// of Config.Peers count as current: they are the cluster this node was
// told it belongs to, and the one that will fill the table.
func (r *Replica) MemberStatus(id uint64) (current, removed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.members.Members[id]; ok {
		return true, false
	}
	if r.members.Removed[id] {
		return false, true
	}
	if len(r.members.Members) == 0 {
		for _, p := range r.cfg.Peers {
			if p.ID == id {
				return true, false
			}
		}
	}
	return false, false
}

// Voters are the voting members of this node's applied configuration,
// itself included when it votes (the clock check counts a majority of
// them).
func (r *Replica) Voters() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.confState.GetVoters()...)
}

// ReportRemoved tells the replica that member by, which the peer plane
// reached, has this node's id among the removed ones in its applied
// membership. Removal is committed before anyone applies it and ids are
// never reused, so the word of any member is final: a removed node that
// was down or cut off while its removal committed would otherwise never
// learn of it (the leader no longer sends to it) and run on, campaigning
// in vain (etcd answers such a member 410 "member
// removed"). The replica stops as if it had applied the removal itself:
// ErrRemoved, and tidal-server exits 5.
func (r *Replica) ReportRemoved(by uint64) {
	r.mu.Lock()
	_, member := r.members.Members[by]
	if by == r.cfg.ID || r.removed || (!member && len(r.members.Members) > 0) {
		r.mu.Unlock()
		return
	}
	r.removed = true
	r.mu.Unlock()
	r.log.Warn("a member says this node was removed from the cluster; stopping raft", "told_by", by)
	r.halt(nil)
}
