package replica

import (
	"errors"
	"sync"
	"sync/atomic"
)

// ErrNoQuorum: this node leads, but has not heard from a quorum of voters
// for an election timeout, so a membership change it proposed could not
// commit; it was not proposed (certainly not applied, 503).
var ErrNoQuorum = errors.New("replica: this leader has not heard from a quorum of voters for an election timeout; the membership change was not proposed, retry")

// heardClock tracks, per peer, the tick at which this node last received a
// message from it. Ticks, not wall time: they count on the Ready loop's
// ticker, as raft's own CheckQuorum does, and a stalled loop stops them (it
// then claims nothing about silence).
type heardClock struct {
	now  atomic.Uint64 // ticks so far
	last sync.Map      // peer id -> *atomic.Uint64, the tick it was last heard at
}

func (h *heardClock) tick() { h.now.Add(1) }

// heard records a message from id, on the receive path of every message.
func (h *heardClock) heard(id uint64) {
	now := h.now.Load()
	if v, ok := h.last.Load(id); ok {
		v.(*atomic.Uint64).Store(now)
		return
	}
	v := &atomic.Uint64{}
	v.Store(now)
	if prev, loaded := h.last.LoadOrStore(id, v); loaded {
		prev.(*atomic.Uint64).Store(now)
	}
}

func (h *heardClock) lastHeard(id uint64) (uint64, bool) {
	v, ok := h.last.Load(id)
	if !ok {
		return 0, false
	}
	return v.(*atomic.Uint64).Load(), true
}

// quorumHeard reports whether self and the voters heard from within the
// last window ticks make a majority of voters. A voter never heard from
// counts as silent.
func quorumHeard(voters []uint64, self uint64, lastHeard func(uint64) (uint64, bool), now, window uint64) bool {
	active := 0
	for _, id := range voters {
		if id == self {
			active++
			continue
		}
		if at, ok := lastHeard(id); ok && now-at <= window {
			active++
		}
	}
	return active > len(voters)/2
}

// leaderLacksQuorum reports whether this node leads and has not heard from
// a quorum of voters for an election timeout: raft's CheckQuorum will
// depose it within one more, and a change proposed now could not commit
// before then. The window is the one CheckQuorum uses, so
// a healthy follower, heard at every heartbeat, is never judged silent. In
// a joint configuration it claims nothing.
func (r *Replica) leaderLacksQuorum() bool {
	if r.leader.Load() != r.cfg.ID {
		return false
	}
	r.mu.Lock()
	voters := r.confState.GetVoters()
	joint := len(r.confState.GetVotersOutgoing()) > 0
	r.mu.Unlock()
	if joint || len(voters) == 0 {
		return false
	}
	return !quorumHeard(voters, r.cfg.ID, r.heardAt.lastHeard, r.heardAt.now.Load(), uint64(r.cfg.ElectionTicks))
}
