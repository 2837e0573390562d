package peer

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/tidaldb/tidal/tidal-server/replica"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// Versions on the peer plane. A sender opens its
// Messages stream with its versions in the request metadata; the receiver
// answers with its own in the response header, or refuses the stream:
//
//	tidal-peer-protocol      the protocol this node speaks (ProtocolVersion)
//	tidal-peer-protocol-min  the oldest protocol it still talks to
//	tidal-entry-format       the newest raft entry format it reads
//	                         (replica.ReadableEntryFormat)
//
// Two nodes talk when each one's protocol is at least the other's
// minimum; otherwise the receiver refuses the stream with
// FailedPrecondition naming both (counted as reason "protocol_version"),
// and the sender refuses a peer whose answer is incompatible. A release
// from before the handshake sends and answers nothing, and counts as
// protocol 1 reading entry format 1: it frames messages as protocol 1
// does, so it is compatible with this one.
//
// The entry format a peer advertised is what the minimum-entry-format
// rule reads (replica.PeerFormats; see replica/format.go). Whatever was
// advertised, the receiver also checks every MsgApp: one carrying an entry
// whose format this node cannot read is dropped (reason "entry_format")
// instead of reaching raft, so a node is never sent into a log it would
// misapply.
//
// Protocol 3 adds raft groups: a peer of protocol 3 or newer reads grouped
// frames (frame.go) and the group of a snapshot stream (mdGroup). A peer
// of an older protocol is sent legacy frames only, carrying group 1's
// messages in exactly the bytes it always read; messages and snapshots of
// other groups to it are withheld, counted in
// tidal_transport_dropped_total{peer} and logged (reason "peer_protocol"),
// and raft is told the replica is unreachable. So a cluster cannot host a
// group other than 1 until every node speaks protocol 3. A sender learns a
// peer's protocol from the answer to each Messages stream it opens; until
// that answer arrives on a new stream it treats the peer as older.
const (
	ProtocolVersion    = 3
	MinProtocolVersion = 1

	// groupedProtocol is the oldest protocol that reads group tags.
	groupedProtocol = 3

	mdProtocol    = "tidal-peer-protocol"
	mdProtocolMin = "tidal-peer-protocol-min"
	mdEntryFormat = "tidal-entry-format"
	// mdGroup is the raft group of a Snapshot stream, sent only when it
	// is not group 1 (so a group-1 snapshot is the stream it always was).
	mdGroup = "tidal-peer-group"

	reasonProtocolVersion = "protocol_version"
	reasonEntryFormat     = "entry_format"
	// A message or snapshot of a group other than 1, withheld from a
	// peer that did not advertise groupedProtocol.
	reasonPeerProtocol = "peer_protocol"
)

// versions is what one side of a stream says of itself.
type versions struct {
	protocol, protocolMin, entryFormat uint32
}

// legacyVersions is a peer that said nothing: a release before the
// handshake.
var legacyVersions = versions{protocol: 1, protocolMin: 1, entryFormat: 1}

// testProtocolBump raises this process's protocol and its minimum: set
// only by SetTestNewerProtocol (a tidalbugs build's hooks_tidalbugs.go)
// and this package's tests. Atomic: a test sets it while the senders of
// nodes other tests started (closed only by their cleanup) still read it.
var testProtocolBump atomic.Uint32

func ownVersions() versions {
	bump := testProtocolBump.Load()
	return versions{
		protocol:    ProtocolVersion + bump,
		protocolMin: MinProtocolVersion + bump*(ProtocolVersion+1-MinProtocolVersion), // above ProtocolVersion when bumped
		entryFormat: replica.ReadableEntryFormat(),
	}
}

func (v versions) metadata() metadata.MD {
	return metadata.Pairs(
		mdProtocol, strconv.FormatUint(uint64(v.protocol), 10),
		mdProtocolMin, strconv.FormatUint(uint64(v.protocolMin), 10),
		mdEntryFormat, strconv.FormatUint(uint64(v.entryFormat), 10))
}

// parseVersions reads a peer's versions from md; a peer that sent none is
// legacyVersions.
func parseVersions(md metadata.MD) (versions, error) {
	if len(md.Get(mdProtocol)) == 0 {
		return legacyVersions, nil
	}
	v := legacyVersions
	for _, f := range []struct {
		key string
		dst *uint32
	}{{mdProtocol, &v.protocol}, {mdProtocolMin, &v.protocolMin}, {mdEntryFormat, &v.entryFormat}} {
		vals := md.Get(f.key)
		if len(vals) == 0 {
			continue
		}
		n, err := strconv.ParseUint(vals[len(vals)-1], 10, 32)
		if err != nil || n == 0 {
			return versions{}, fmt.Errorf("peer metadata %s: expected a version number >= 1, found %q", f.key, vals[len(vals)-1])
		}
		*f.dst = uint32(n)
	}
	return v, nil
}

// compatible says why this node (own) and a peer (theirs) cannot talk,
// or "" when they can.
func compatible(own, theirs versions) string {
	switch {
	case theirs.protocol < own.protocolMin:
		return fmt.Sprintf("the peer speaks peer protocol %d, older than the oldest this node talks to (%d; it speaks %d): "+
			"upgrade the peer to a release that speaks protocol %d or newer", theirs.protocol, own.protocolMin, own.protocol, own.protocolMin)
	case own.protocol < theirs.protocolMin:
		return fmt.Sprintf("the peer speaks peer protocol %d and talks to protocol %d or newer only; this node speaks %d: "+
			"upgrade this node, or run a release on the peer that still talks to protocol %d", theirs.protocol, theirs.protocolMin, own.protocol, own.protocol)
	}
	return ""
}

// notePeerVersions remembers what peer id advertised, logging it when it
// is new or changed.
func (t *Transport) notePeerVersions(id uint64, v versions) {
	t.versionsMu.Lock()
	prev, had := t.peerVersions[id]
	t.peerVersions[id] = v
	t.versionsMu.Unlock()
	if !had || prev != v {
		t.log.Info("peer versions", "peer", id, "protocol", v.protocol, "protocol_min", v.protocolMin, "entry_format", v.entryFormat)
	}
}

// forgetPeerVersions drops what peer id advertised, until it says again.
func (t *Transport) forgetPeerVersions(id uint64) {
	t.versionsMu.Lock()
	delete(t.peerVersions, id)
	t.versionsMu.Unlock()
}

// PeerEntryFormat implements replica.PeerFormats.
func (t *Transport) PeerEntryFormat(id uint64) (uint32, bool) {
	t.versionsMu.Lock()
	defer t.versionsMu.Unlock()
	v, ok := t.peerVersions[id]
	return v.entryFormat, ok
}

// checkVersions reads the versions on an inbound stream (Messages or
// Snapshot) and refuses, counted and logged, a peer this node cannot talk
// to; the error is the stream's status.
func (t *Transport) checkVersions(ctx context.Context, authID uint64, remote string) (versions, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	theirs, err := parseVersions(md)
	if err != nil {
		t.metrics.messagesDropped.WithLabelValues(reasonProtocolVersion).Inc()
		t.drops.note("refusing peer stream", reasonProtocolVersion, "remote", remote, "authenticated_member", authID, "err", err)
		return versions{}, status.Error(codes.InvalidArgument, err.Error())
	}
	own := ownVersions()
	if why := compatible(own, theirs); why != "" {
		t.metrics.messagesDropped.WithLabelValues(reasonProtocolVersion).Inc()
		t.drops.note("refusing peer stream: incompatible peer protocol", reasonProtocolVersion, "remote", remote,
			"authenticated_member", authID, "peer_protocol", theirs.protocol, "peer_protocol_min", theirs.protocolMin,
			"protocol", own.protocol, "protocol_min", own.protocolMin, "why", why)
		return versions{}, status.Error(codes.FailedPrecondition, "peer protocol: "+why)
	}
	return theirs, nil
}

// unreadableEntry returns the first entry of a marshalled MsgApp whose
// format this node cannot read (index, envelope byte), or ok=false. A
// message it cannot parse is left to raft, which refuses it.
func unreadableEntry(msg []byte) (index uint64, envelope byte, found bool) {
	return entryAbove(msg, replica.ReadableEntryFormat())
}

// withholds is the sending half of the entry-format gate: whether a
// message for peer id is a MsgApp carrying an entry of a format id has not
// advertised it reads (a peer that advertised nothing reads format 1). The
// minimum-entry-format rule keeps such entries out of the log while such a
// peer is a member; this catches one added later, or one that lags behind
// entries written before it joined, which a release without the receiving
// half would otherwise skip at apply and diverge. Free while every peer
// reads all this node does.
func (t *Transport) withholds(id uint64, data []byte) (index uint64, format uint32, withheld bool) {
	format, ok := t.PeerEntryFormat(id)
	if !ok {
		format = 1
	}
	if format >= replica.ReadableEntryFormat() {
		return 0, format, false
	}
	if h, err := parseHeader(data); err != nil || h.Type != raftpb.MsgApp {
		return 0, format, false
	}
	index, _, withheld = entryAbove(data, format)
	return index, format, withheld
}

// entryAbove returns the first entry of a marshalled MsgApp whose format
// is above max or unknown to this build.
func entryAbove(msg []byte, max uint32) (index uint64, envelope byte, found bool) {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return 0, 0, false
		}
		msg = msg[n:]
		if num != 7 || typ != protowire.BytesType { // entries = 7
			n = protowire.ConsumeFieldValue(num, typ, msg)
			if n < 0 {
				return 0, 0, false
			}
			msg = msg[n:]
			continue
		}
		ent, n := protowire.ConsumeBytes(msg)
		if n < 0 {
			return 0, 0, false
		}
		msg = msg[n:]
		idx, etype, data, ok := entryFields(ent)
		if !ok {
			return 0, 0, false
		}
		f, known := replica.EntryFormatOf(etype, data)
		if !known || f > max {
			return idx, data[0], true
		}
	}
	return 0, 0, false
}

// entryFields reads a marshalled raftpb.Entry's index, type and data (the
// last occurrence of each wins, as in proto.Unmarshal).
func entryFields(b []byte) (index uint64, typ raftpb.EntryType, data []byte, ok bool) {
	for len(b) > 0 {
		num, wtyp, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, 0, nil, false
		}
		b = b[n:]
		switch {
		case num == 1 && wtyp == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, 0, nil, false
			}
			typ, b = raftpb.EntryType(int32(v)), b[n:]
		case num == 3 && wtyp == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, 0, nil, false
			}
			index, b = v, b[n:]
		case num == 4 && wtyp == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, 0, nil, false
			}
			data, b = v, b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, wtyp, b)
			if n < 0 {
				return 0, 0, nil, false
			}
			b = b[n:]
		}
	}
	return index, typ, data, true
}
