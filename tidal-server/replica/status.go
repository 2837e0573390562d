package replica

import (
	"fmt"
	"sort"

	"go.etcd.io/raft/v3"
)

// MemberStatus is one member as /cluster/status shows it.
type MemberStatus struct {
	Member
	Role      string `json:"role"`
	Match     uint64 `json:"match"`
	Lag       uint64 `json:"lag"`
	Reachable bool   `json:"reachable"`
}

// Status is a point-in-time view of this node and, on the leader, of every
// member's replication progress.
type Status struct {
	ID      uint64         `json:"node"`
	Leader  uint64         `json:"leader"`
	Term    uint64         `json:"term"`
	Commit  uint64         `json:"commit"`
	Applied uint64         `json:"applied"`
	Role    string         `json:"role"`
	Members []MemberStatus `json:"members"`
	Error   string         `json:"error,omitempty"`
}

func roleName(s raft.StateType) string {
	switch s {
	case raft.StateLeader:
		return "leader"
	case raft.StateCandidate, raft.StatePreCandidate:
		return "candidate"
	}
	return "follower"
}

// Status reports this node's view. Match and lag per member are known only
// on the leader; followers report their own applied position.
func (r *Replica) Status() Status {
	st := Status{ID: r.cfg.ID, Applied: r.appliedIndex()}
	var rs raft.Status
	running := r.Err() == nil
	if running {
		rs = r.node.Status()
		st.Leader = rs.Lead
		st.Term = rs.HardState.GetTerm()
		st.Commit = rs.HardState.GetCommit()
		st.Role = roleName(rs.RaftState)
	} else {
		st.Role = "stopped"
		st.Term = r.term.Load()
		st.Commit = r.commit.Load()
		st.Error = r.Err().Error()
	}
	r.mu.Lock()
	members := r.members.sorted()
	learners := map[uint64]bool{}
	for _, id := range r.confState.GetLearners() {
		learners[id] = true
	}
	r.mu.Unlock()
	for _, m := range members {
		ms := MemberStatus{Member: m, Role: "follower"}
		if learners[m.ID] {
			ms.Role = "learner"
		}
		if m.ID == st.Leader {
			ms.Role = "leader"
		}
		if pr, ok := rs.Progress[m.ID]; ok {
			ms.Match = pr.Match
			ms.Reachable = pr.RecentActive
			if st.Commit > pr.Match {
				ms.Lag = st.Commit - pr.Match
			}
		} else if m.ID == r.cfg.ID {
			ms.Match = st.Applied
			ms.Reachable = running
			if st.Commit > st.Applied {
				ms.Lag = st.Commit - st.Applied
			}
		}
		st.Members = append(st.Members, ms)
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].ID < st.Members[j].ID })
	return st
}

func (r *Replica) updateMetrics() {
	if r.Err() != nil {
		return
	}
	rs := r.node.Status()
	commit := rs.HardState.GetCommit()
	r.metrics.Term.Set(float64(rs.HardState.GetTerm()))
	r.metrics.CommitIndex.Set(float64(commit))
	r.metrics.AppliedIndex.Set(float64(r.appliedIndex()))
	if rs.RaftState == raft.StateLeader {
		r.metrics.IsLeader.Set(1)
	} else {
		r.metrics.IsLeader.Set(0)
	}
	for id, pr := range rs.Progress {
		if id == r.cfg.ID {
			continue
		}
		peer := fmt.Sprint(id)
		r.metrics.PeerMatch.WithLabelValues(peer).Set(float64(pr.Match))
		lag := 0.0
		if commit > pr.Match {
			lag = float64(commit - pr.Match)
		}
		r.metrics.PeerLag.WithLabelValues(peer).Set(lag)
	}
}
