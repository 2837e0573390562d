package peer

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Reasons a message is dropped (the reason label of
// tidal_peer_messages_dropped_total).
const (
	// The connection's certificate proves one member, From names another.
	reasonSenderMismatch = "sender_mismatch"
	// From is this node itself: never sent over the network.
	reasonFromSelf = "from_self"
	// To is another node (a misrouted link, or a forgery).
	reasonWrongRecipient = "wrong_recipient"
	// From is not a member in this node's view, and no member vouched.
	reasonNotMember = "not_member"
	// From was removed from the cluster.
	reasonRemovedMember = "removed_member"
	// The bytes are not a raft message.
	reasonMalformed = "malformed"
	// A TLS stream without a verified member certificate (cannot happen
	// with a ServerTLS that requires one; counted if it does).
	reasonUnauthenticated = "unauthenticated"
	// A message on the snapshot stream that is not a MsgSnap.
	reasonNotSnapshot = "not_snapshot"
	// A snapshot stream past MaxSnapshotBytes.
	reasonSnapshotTooLarge = "snapshot_too_large"
	// A snapshot stream beyond MaxConcurrentSnapshots.
	reasonSnapshotBusy = "snapshot_busy"
	// A message (or snapshot) of a group with no handler on this node.
	reasonUnknownGroup = "unknown_group"
	// From names a raft id its group does not know (Handler.NodeOf).
	reasonUnknownReplica = "unknown_replica"
)

func (t *Transport) secure() bool { return t.opts.ServerTLS != nil }

// authenticate returns the member the stream's TLS certificate proves;
// 0 in insecure mode, where nothing is proved.
func (t *Transport) authenticate(ctx context.Context) (uint64, error) {
	if !t.secure() {
		return 0, nil
	}
	p, ok := grpcpeer.FromContext(ctx)
	if !ok {
		return 0, errors.New("no peer information on the stream")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return 0, errors.New("stream is not over TLS")
	}
	return auth.MemberFromState(&info.State)
}

func remoteAddr(ctx context.Context) string {
	if p, ok := grpcpeer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// admit decides whether raft may see a message with header h that came
// on a stream authenticated as member authID (0: insecure). "" admits;
// anything else is the reason to drop it.
func (t *Transport) admit(authID uint64, h header) string {
	if t.secure() && h.From != authID && !t.forwardedTransfer(authID, h) {
		return reasonSenderMismatch
	}
	if h.From == t.self {
		return reasonFromSelf
	}
	if h.To != t.self {
		return reasonWrongRecipient
	}
	if h.From == 0 {
		return reasonNotMember
	}
	switch t.memberStatus(h.From) {
	case MemberCurrent:
		return ""
	case MemberRemoved:
		return reasonRemovedMember
	}
	if t.admitUnknown(h.From) {
		return ""
	}
	return reasonNotMember
}

// forwardedTransfer reports whether h is a leadership transfer request a
// current member forwards: raft's follower hands MsgTransferLeader on to
// the leader unchanged, and its From names the transferee, not the
// sender. The transferee is then checked like any From. A member can ask
// for a transfer anyway; what it cannot do is speak for another member
// in the messages raft counts (votes, appends, heartbeats).
func (t *Transport) forwardedTransfer(authID uint64, h header) bool {
	return h.Type == raftpb.MsgTransferLeader && authID != 0 && t.memberStatus(authID) == MemberCurrent
}

// drop counts a refused message and logs it on transitions.
func (t *Transport) drop(reason string, authID uint64, h header, remote string) {
	t.metrics.messagesDropped.WithLabelValues(reason).Inc()
	t.drops.note("dropping peer messages", reason, "remote", remote, "authenticated_member", authID,
		"from", h.From, "to", h.To, "type", h.Type.String(), "term", h.Term)
}

func (t *Transport) serveMessages(_ any, stream grpc.ServerStream) error {
	ctx := stream.Context()
	remote := remoteAddr(ctx)
	authID, err := t.authenticate(ctx)
	if err != nil {
		t.metrics.messagesDropped.WithLabelValues(reasonUnauthenticated).Inc()
		t.drops.note("refusing peer stream", reasonUnauthenticated, "remote", remote, "err", err)
		return status.Error(codes.Unauthenticated, err.Error())
	}
	own := ownVersions()
	theirs, err := t.checkVersions(ctx, authID, remote)
	if err != nil {
		return err
	}
	if err := stream.SendHeader(own.metadata()); err != nil {
		return err
	}
	if authID != 0 {
		t.notePeerVersions(authID, theirs)
	}
	noted := authID != 0
	for {
		var buf []byte
		if err := stream.RecvMsg(&buf); err != nil {
			if errors.Is(err, io.EOF) {
				return stream.SendMsg(&[]byte{})
			}
			return err
		}
		msgs, err := decodeFrame(buf)
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		// A frame's messages mostly share few groups: look each up once
		// per run of the same group.
		var (
			lastGroup uint64
			looked    bool
			g         Handler
		)
		for _, in := range msgs {
			m := in.data
			h, err := parseHeader(m)
			if err != nil {
				t.drop(reasonMalformed, authID, h, remote)
				continue
			}
			if !looked || in.group != lastGroup {
				lastGroup, g, looked = in.group, t.handler(in.group), true
			}
			if g == nil {
				t.dropGroup(reasonUnknownGroup, in.group, authID, h, remote)
				continue
			}
			nh, reason := nodeHeader(g, h)
			if reason == "" {
				reason = t.admit(authID, nh)
			}
			if reason != "" {
				t.dropGroup(reason, in.group, authID, h, remote)
				if reason == reasonRemovedMember && (authID == 0 || authID == nh.From) {
					// Tell the removed member, which may never have
					// applied its removal.
					return removedStatus(stream, nh.From)
				}
				continue
			}
			if !noted {
				t.notePeerVersions(nh.From, theirs)
				noted = true
			}
			if h.Type == raftpb.MsgApp {
				if idx, env, bad := unreadableEntry(m); bad {
					t.metrics.messagesDropped.WithLabelValues(reasonEntryFormat).Inc()
					t.drops.note("dropping appends with entries in a format this node cannot read; upgrade it", reasonEntryFormat,
						"remote", remote, "group", in.group, "from", h.From, "index", idx, "envelope", env, "entry_format", replica.ReadableEntryFormat())
					continue
				}
			}
			if err := g.Receive(ctx, m); err != nil {
				return err
			}
		}
	}
}

// nodeHeader is h with its raft ids (From, To) replaced by the nodes that
// host them in the group of handler g: what admission checks. A From the
// group does not know is refused as unknown_replica; a To it does not
// know cannot be this node (wrong_recipient). For group 1 of a node with
// one group the ids are node ids and nodeHeader returns h.
func nodeHeader(g Handler, h header) (header, string) {
	from, ok := g.NodeOf(h.From)
	if !ok {
		return h, reasonUnknownReplica
	}
	to, ok := g.NodeOf(h.To)
	if !ok {
		return h, reasonWrongRecipient
	}
	h.From, h.To = from, to
	return h, ""
}

// dropGroup is drop for a message of a group: the group is logged, never
// a metric label (see metrics.go).
func (t *Transport) dropGroup(reason string, group, authID uint64, h header, remote string) {
	t.metrics.messagesDropped.WithLabelValues(reason).Inc()
	t.drops.note("dropping peer messages", reason, "remote", remote, "group", group, "authenticated_member", authID,
		"from", h.From, "to", h.To, "type", h.Type.String(), "term", h.Term)
}

// countingCreds counts and logs failed server handshakes: a peer without
// a certificate, with one from another CA, or speaking plaintext.
type countingCreds struct {
	credentials.TransportCredentials
	onFailure func(net.Conn, error)
}

func (c countingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.onFailure(conn, err)
	}
	return out, info, err
}

func (c countingCreds) Clone() credentials.TransportCredentials {
	return countingCreds{c.TransportCredentials.Clone(), c.onFailure}
}

func (t *Transport) noteHandshakeFailure(conn net.Conn, err error) {
	t.metrics.handshakeFailures.Inc()
	t.drops.note("refusing peer connections: TLS handshake failed", "handshake", "remote", conn.RemoteAddr().String(), "err", err)
}

// mdMemberRemoved is the trailer that tells a sender its member id was
// removed from the cluster: the value is the id.
const mdMemberRemoved = "tidal-member-removed"

// removedStatus ends a stream whose sender was removed from the cluster,
// saying so in a way the sender acts on (sender.watch).
func removedStatus(stream grpc.ServerStream, id uint64) error {
	stream.SetTrailer(metadata.Pairs(mdMemberRemoved, strconv.FormatUint(id, 10)))
	return status.Errorf(codes.FailedPrecondition, "member %d was removed from the cluster", id)
}
