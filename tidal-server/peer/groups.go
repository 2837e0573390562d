package peer

import (
	"context"

	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/server"
)

// Handler is one raft group's replica on this node, as the transport sees
// it: where the group's inbound messages go, whom the transport tells about
// its outbound ones, and how the group's raft ids map to nodes.
//
// Raft ids are per group (the shard map gives each replica one, usually
// its node's id); the transport connects nodes. NodeOf resolves both
// ways: an outbound message's To to the node it travels to, and an inbound
// message's From and To to the nodes admission checks (From must be the
// node the connection proved, To this node).
type Handler interface {
	// Receive hands an admitted message (or a complete snapshot
	// message) to the group's raft.
	Receive(ctx context.Context, data []byte) error
	// ReportUnreachable and ReportSnapshot take the group's raft id of
	// the replica a message was for.
	ReportUnreachable(replica uint64)
	ReportSnapshot(replica uint64, ok bool)
	// NodeOf is the node hosting the group's replica id; ok is false for
	// an id the group does not know. It is called on every message, with
	// the transport's locks held: it must be cheap and must not call the
	// transport.
	NodeOf(replica uint64) (node uint64, ok bool)
}

// legacyHandler is group 1 as one raft group per node has always had it:
// the server's Inbound, whose raft ids are node ids.
type legacyHandler struct{ server.Inbound }

func (legacyHandler) NodeOf(id uint64) (uint64, bool) { return id, true }

// Register makes h the handler of group: inbound messages tagged group
// (and snapshots) go to it, replacing any earlier handler. It returns the
// group's replica.Transport, which tags what it sends with group. Group 1
// starts registered to the Inbound the transport was built with, so a node
// that registers nothing behaves as one raft group per node always has.
func (t *Transport) Register(group uint64, h Handler) *Group {
	t.groupsMu.Lock()
	t.groups[group] = h
	t.groupsMu.Unlock()
	return &Group{t: t, id: group}
}

// Unregister removes group's handler: from then on its inbound messages
// are dropped and counted (reason unknown_group), and its Group sends
// nothing.
func (t *Transport) Unregister(group uint64) {
	t.groupsMu.Lock()
	delete(t.groups, group)
	t.groupsMu.Unlock()
}

// handler is group's handler, or nil.
func (t *Transport) handler(group uint64) Handler {
	t.groupsMu.RLock()
	defer t.groupsMu.RUnlock()
	return t.groups[group]
}

// Group is the transport as one raft group's replica uses it: a
// replica.Transport whose messages are tagged with the group and routed by
// (node, group), the node resolved by the group's Handler.NodeOf. The
// address book is per node and kept through Transport.SetPeer/RemovePeer
// (the node's membership), so a Group's SetPeer and RemovePeer do nothing:
// a group's raft ids are not node ids.
type Group struct {
	t  *Transport
	id uint64
}

var _ replica.Transport = (*Group)(nil)

// Send queues the group's messages without blocking.
func (g *Group) Send(msgs []replica.Outbound) { g.t.send(g.id, msgs) }

// SetPeer does nothing: addresses are per node (Transport.SetPeer).
func (g *Group) SetPeer(uint64, string) {}

// RemovePeer does nothing: addresses are per node (Transport.RemovePeer).
func (g *Group) RemovePeer(uint64) {}

// ID is the group's id.
func (g *Group) ID() uint64 { return g.id }

// reportUnreachable tells group's handler, if any, that replica could not
// be reached. Never under t.mu's callers' feet: it runs on its own
// goroutine, as raft's ReportUnreachable may call back into the node.
func (t *Transport) reportUnreachable(group, replica uint64) {
	if h := t.handler(group); h != nil {
		go h.ReportUnreachable(replica)
	}
}

// reportSnapshot tells group's handler, if any, how a snapshot to replica
// ended.
func (t *Transport) reportSnapshot(group, replica uint64, ok bool) {
	if h := t.handler(group); h != nil {
		h.ReportSnapshot(replica, ok)
	}
}
