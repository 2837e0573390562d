package peer

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/tidaldb/tidal/tidal-server/server"
)

// MemberStatus is what a node knows of a raft id.
type MemberStatus uint8

const (
	// MemberUnknown: not in this node's membership, never removed from
	// it. Either not a member, or added by entries this node has not
	// applied yet (it lags, or it is a --join node with an empty table).
	MemberUnknown MemberStatus = iota
	// MemberCurrent: a voter or a learner in this node's applied
	// membership.
	MemberCurrent
	// MemberRemoved: removed; ids are never reused, so for good.
	MemberRemoved
)

func (s MemberStatus) String() string {
	switch s {
	case MemberCurrent:
		return "member"
	case MemberRemoved:
		return "removed"
	}
	return "unknown"
}

// InboundMembership is the server's replicated membership (current,
// removed, or neither) as an Options.Membership.
func InboundMembership(inbound server.Inbound) func(id uint64) MemberStatus {
	return func(id uint64) MemberStatus {
		switch current, removed := inbound.MemberStatus(id); {
		case current:
			return MemberCurrent
		case removed:
			return MemberRemoved
		}
		return MemberUnknown
	}
}

// Vouching. A node admits raft messages only from members. But its view
// of the membership is the one it applied, and it can lag: a node that
// was down while member 4 was added and then won the leadership would
// drop every message of its new leader (the only one that could bring it
// up to date), and stay behind until the leadership moved. So a message
// from an id this node does not know (neither member nor removed) is
// dropped, and the node asks its known members whether the id is a
// member; once one says so, the id is admitted for vouchTTL (and asked
// about again before that ends, while its messages keep coming). A member
// that vouches is trusted no more than raft trusts it already: it could
// lead and append anything. A removed id is never vouched for: this
// node's own "removed" wins. Under TLS the id asked about is the one the
// certificate proves, so only ids the CA issued can cause a query; in
// insecure mode anyone can, and the table's bound keeps that cheap.
const (
	vouchTTL       = 10 * time.Second
	vouchRefresh   = vouchTTL / 2
	vouchRetry     = time.Second // between rounds for an id nobody vouched for
	vouchTimeout   = 2 * time.Second
	vouchMaxTabled = 64 // ids tracked at once; more are dropped unasked
)

type vouch struct {
	granted  time.Time // zero: never vouched
	asked    time.Time // last round started
	querying bool
}

// vouches is the table of unknown ids and what known members said.
type vouches struct {
	mu sync.Mutex
	m  map[uint64]*vouch
}

// memberStatus is this node's own view: Options.Membership, or the
// address book when the server gives none.
func (t *Transport) memberStatus(id uint64) MemberStatus {
	if t.opts.Membership != nil {
		return t.opts.Membership(id)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.senders[id]; ok {
		return MemberCurrent
	}
	if t.removed[id] {
		return MemberRemoved
	}
	return MemberUnknown
}

// admitUnknown says whether a message from id, which this node's view
// does not know, may pass on a known member's word; it starts a round of
// questions when the word is missing or getting old.
func (t *Transport) admitUnknown(id uint64) bool {
	now := time.Now()
	t.vouches.mu.Lock()
	v, ok := t.vouches.m[id]
	if !ok {
		if len(t.vouches.m) >= vouchMaxTabled {
			t.evictVouchesLocked(now)
		}
		if len(t.vouches.m) >= vouchMaxTabled {
			t.vouches.mu.Unlock()
			return false
		}
		v = &vouch{}
		t.vouches.m[id] = v
	}
	valid := !v.granted.IsZero() && now.Sub(v.granted) < vouchTTL
	stale := v.granted.IsZero() || now.Sub(v.granted) >= vouchRefresh
	ask := stale && !v.querying && now.Sub(v.asked) >= vouchRetry
	if ask {
		v.querying, v.asked = true, now
	}
	t.vouches.mu.Unlock()
	if ask {
		t.startVouchRound(id)
	}
	return valid
}

func (t *Transport) evictVouchesLocked(now time.Time) {
	for id, v := range t.vouches.m {
		if !v.querying && now.Sub(v.granted) >= vouchTTL && now.Sub(v.asked) >= vouchRetry {
			delete(t.vouches.m, id)
		}
	}
}

// startVouchRound asks every known member with an address about id, in
// parallel; the first "member" grants.
func (t *Transport) startVouchRound(id uint64) {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return
	}
	var asked []*sender
	for pid, s := range t.senders {
		if pid != id && s.conn != nil {
			asked = append(asked, s)
		}
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		granted := false
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, s := range asked {
			// Only a member in this node's own view may vouch.
			if t.memberStatus(s.id) != MemberCurrent {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(s.ctx, vouchTimeout)
				defer cancel()
				st, err := s.askMember(ctx, id)
				answer := st.String()
				if err != nil {
					answer = "error"
				}
				t.metrics.memberQueries.WithLabelValues(answer).Inc()
				if err == nil && st == MemberCurrent {
					mu.Lock()
					granted = true
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		t.vouches.mu.Lock()
		if v, ok := t.vouches.m[id]; ok {
			v.querying = false
			if granted {
				if v.granted.IsZero() {
					t.log.Info("admitting messages from an id this node's membership does not list yet: a member vouched for it",
						"id", id)
				}
				v.granted = time.Now()
			}
		}
		t.vouches.mu.Unlock()
		t.vouchRounds.Add(1)
	}()
}

// serveMember answers another node's question about an id with this
// node's own view (never with what others vouched: no chains).
func (t *Transport) serveMember(req []byte) ([]byte, error) {
	if len(req) != 8 {
		return nil, fmt.Errorf("member question: expected an 8-byte id, found %d bytes", len(req))
	}
	return []byte{byte(t.memberStatus(binary.BigEndian.Uint64(req)))}, nil
}
