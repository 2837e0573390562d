package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// ErrTransferInProgress: the leader is handing leadership to another member
// and raft drops every proposal meanwhile (ErrProposalDropped while its
// leadTransferee is set). Certainly not applied; a *TransferError says to
// whom and when to retry.
var ErrTransferInProgress = errors.New("replica: leader transfer in progress")

// TransferError is a proposal raft dropped because its leader was
// transferring leadership. raft gives a transfer one election timeout
// before it abandons it, so that is when a retry can be taken (by this
// leader or by the new one).
type TransferError struct {
	Leader, Transferee uint64
	RetryAfter         time.Duration
}

func (e *TransferError) Error() string {
	return fmt.Sprintf("replica: leader transfer in progress from %d to %d; the proposal was dropped by raft and not applied; retry after %s",
		e.Leader, e.Transferee, e.RetryAfter)
}

// Is makes errors.Is(err, ErrTransferInProgress) hold.
func (e *TransferError) Is(target error) bool { return target == ErrTransferInProgress }

// electionTimeout is the time raft gives a transfer before abandoning it,
// and CheckQuorum's window.
func (r *Replica) electionTimeout() time.Duration {
	return time.Duration(r.cfg.ElectionTicks) * r.cfg.TickInterval
}

// transferringTo reports the member raft is handing this node's leadership
// to, or raft.None. It asks raft itself (a transfer may have been asked
// for through another member, or abandoned by raft), so it costs a round
// trip to raft's goroutine: call it only around a drop or a membership
// change.
func (r *Replica) transferringTo() uint64 {
	if r.leader.Load() != r.cfg.ID {
		return raft.None
	}
	st := r.node.Status()
	if st.RaftState != raft.StateLeader {
		return raft.None
	}
	return st.LeadTransferee
}

func (r *Replica) transferError(to uint64) *TransferError {
	return &TransferError{Leader: r.cfg.ID, Transferee: to, RetryAfter: r.electionTimeout()}
}

// Drop notices. raft drops a proposal without telling the follower that
// forwarded it (a follower's MsgProp gets no answer), so its proposer would
// wait out its deadline and answer 504 for a write that was certainly never
// made. Where this leader knows raft dropped (or would drop) a forwarded
// proposal, it tells the proposing node: a MsgUnreachable (a message raft
// only ever makes for itself, and which node.Step ignores when it comes
// from the network, so a release that does not know notices drops them
// harmlessly) whose Context is
//
//	u8 dropNoticeVersion | u8 cause | u64 transferee | u32 n | n × u64 request id
//
// The proposing node wakes each named request of its own with the error
// the cause stands for. A notice is sent only for a certain drop, so the
// proposer's "not applied" is true.
const (
	dropNoticeVersion = 1
	dropNoticeHeader  = 1 + 1 + 8 + 4
)

// Causes a drop notice carries.
const (
	dropTransfer   byte = 1 // a leader transfer is in progress
	dropOverloaded byte = 2 // raft's uncommitted log is full, or the forward queue
	dropNoLeader   byte = 3 // the node the proposal reached knew no leader
)

// dropNotice is one decoded notice.
type dropNotice struct {
	cause      byte
	transferee uint64
	requests   []uint64
}

func encodeDropNotice(n dropNotice) []byte {
	b := make([]byte, dropNoticeHeader, dropNoticeHeader+8*len(n.requests))
	b[0] = dropNoticeVersion
	b[1] = n.cause
	binary.BigEndian.PutUint64(b[2:], n.transferee)
	binary.BigEndian.PutUint32(b[10:], uint32(len(n.requests)))
	for _, req := range n.requests {
		b = binary.BigEndian.AppendUint64(b, req)
	}
	return b
}

func decodeDropNotice(b []byte) (dropNotice, error) {
	if len(b) < dropNoticeHeader || b[0] != dropNoticeVersion {
		return dropNotice{}, fmt.Errorf("drop notice of %d bytes: expected at least %d bytes starting with version %d", len(b), dropNoticeHeader, dropNoticeVersion)
	}
	n := dropNotice{cause: b[1], transferee: binary.BigEndian.Uint64(b[2:])}
	count := binary.BigEndian.Uint32(b[10:])
	if uint64(count)*8 != uint64(len(b)-dropNoticeHeader) {
		return dropNotice{}, fmt.Errorf("drop notice of %d bytes names %d requests; expected %d bytes", len(b), count, dropNoticeHeader+8*uint64(count))
	}
	for off := dropNoticeHeader; off < len(b); off += 8 {
		n.requests = append(n.requests, binary.BigEndian.Uint64(b[off:]))
	}
	return n, nil
}

// proposers reads, from the entries of a proposal, the node that proposed
// them and their request ids: the envelope of a write (version 1), of a
// pack (versions 3 and 4) or a membership change's marker (version 2). Entries of
// any other framing (a release without envelopes) name nobody.
func proposers(ents []*raftpb.Entry) (origin uint64, reqs []uint64) {
	for _, e := range ents {
		if e.GetType() != raftpb.EntryNormal {
			continue
		}
		d := e.GetData()
		switch {
		case len(d) >= envelopeHeader && (d[0] == envelopeVersion || d[0] == confMarkerVersion):
			origin = binary.BigEndian.Uint64(d[1:9])
			reqs = append(reqs, binary.BigEndian.Uint64(d[9:17]))
		case len(d) > 0 && isPacked(d[0]):
			run, err := unpack(nil, 0, 0, d)
			if err != nil {
				continue
			}
			for _, p := range run {
				origin = p.origin
				reqs = append(reqs, p.request)
			}
		}
	}
	return origin, reqs
}

// notifyDropped tells the node that proposed the entries of m (forwarded
// here) that raft certainly did not take them, and why.
func (r *Replica) notifyDropped(m *raftpb.Message, cause byte, transferee uint64) {
	r.metrics.ProposalsDropped.Inc()
	origin, reqs := proposers(m.GetEntries())
	if origin == raft.None || len(reqs) == 0 {
		return
	}
	if origin == r.cfg.ID {
		// Stepped here after this node had forwarded it and got it back
		// (a held proposal released): wake the waiters directly.
		r.receiveDropNotice(r.cfg.ID, dropNotice{cause: cause, transferee: transferee, requests: reqs})
		return
	}
	if r.cfg.Transport == nil {
		return
	}
	data, err := proto.Marshal(&raftpb.Message{
		Type:    raftpb.MsgUnreachable.Enum(),
		To:      proto.Uint64(origin),
		From:    proto.Uint64(r.cfg.ID),
		Context: encodeDropNotice(dropNotice{cause: cause, transferee: transferee, requests: reqs}),
	})
	if err != nil {
		r.log.Error("marshal drop notice", "to", origin, "err", err)
		return
	}
	r.log.Debug("forwarded proposal dropped; telling its proposer", "origin", origin, "requests", len(reqs), "cause", cause, "transferee", transferee)
	r.cfg.Transport.Send([]Outbound{{To: origin, Data: data}})
}

// receiveDropNotice wakes this node's proposers a notice from leader names
// with the error its cause stands for. Requests no longer waited for
// (answered, timed out) are ignored.
func (r *Replica) receiveDropNotice(leader uint64, n dropNotice) {
	var err error
	switch n.cause {
	case dropTransfer:
		err = &TransferError{Leader: leader, Transferee: n.transferee, RetryAfter: r.electionTimeout()}
	case dropNoLeader:
		err = ErrNoLeader
	default:
		err = ErrOverloaded
	}
	for _, req := range n.requests {
		r.mu.Lock()
		ch, ok := r.proposals[req]
		delete(r.proposals, req)
		r.mu.Unlock()
		if ok {
			ch <- Applied{dropped: err}
		}
	}
}

// isDropNotice reports whether m, received from a peer, is a drop notice.
func isDropNotice(m *raftpb.Message) bool {
	return m.GetType() == raftpb.MsgUnreachable && len(m.GetContext()) > 0
}
