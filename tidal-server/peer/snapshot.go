package peer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// spoolPattern names spool files; New removes what matches at start.
const spoolPattern = "tidal-snap-*.spool"

// serveSnapshot receives one MsgSnap. Memory: the stream is written to a
// spool file chunk by chunk, holding one chunk (at most maxMessageBytes)
// at a time, and cut once it passes MaxSnapshotBytes. Under TLS a
// connection whose certificate proves no admissible member is refused
// before a byte is spooled. Once complete, the message's header is read
// from the file and admitted like any message (From is the proven
// member, a member, To is this node; and it must be a MsgSnap); only then
// is it read into memory and handed to raft, one snapshot at a time.
// That hand-off holds the whole snapshot (up to MaxSnapshotBytes), and
// raft's decoding copies its data once more: the Inbound interface and
// raft's MsgSnap carry the snapshot in the message. So the bound is one
// chunk per stream while streaming, and about 2 x MaxSnapshotBytes for
// one admitted snapshot at hand-off; nothing a sender that is refused or
// cut can make this node hold.
func (t *Transport) serveSnapshot(_ any, stream grpc.ServerStream) error {
	ctx := stream.Context()
	remote := remoteAddr(ctx)
	authID, err := t.authenticate(ctx)
	if err != nil {
		t.metrics.messagesDropped.WithLabelValues(reasonUnauthenticated).Inc()
		t.drops.note("refusing peer stream", reasonUnauthenticated, "remote", remote, "err", err)
		return status.Error(codes.Unauthenticated, err.Error())
	}
	if _, err := t.checkVersions(ctx, authID, remote); err != nil {
		return err
	}
	group, err := snapshotGroup(ctx)
	if err != nil {
		t.metrics.messagesDropped.WithLabelValues(reasonMalformed).Inc()
		t.drops.note("refusing peer stream", reasonMalformed, "remote", remote, "authenticated_member", authID, "err", err)
		return status.Error(codes.InvalidArgument, err.Error())
	}
	g := t.handler(group)
	if g == nil {
		t.dropGroup(reasonUnknownGroup, group, authID, header{Type: raftpb.MsgSnap, From: authID}, remote)
		return status.Errorf(codes.NotFound, "snapshot for group %d refused: this node hosts no replica of it", group)
	}
	if t.secure() {
		// Refuse a connection that could not pass admission before
		// spooling anything: the header check below repeats it.
		probe := header{Type: raftpb.MsgSnap, From: authID, To: t.self}
		if reason := t.admit(authID, probe); reason != "" {
			t.drop(reason, authID, probe, remote)
			return status.Errorf(codes.PermissionDenied, "snapshot from member %d refused: %s", authID, reason)
		}
	}
	select {
	case t.snapshotSlot <- struct{}{}:
		defer func() { <-t.snapshotSlot }()
	default:
		t.drop(reasonSnapshotBusy, authID, header{Type: raftpb.MsgSnap, From: authID}, remote)
		return status.Errorf(codes.ResourceExhausted, "already receiving %d snapshots; retry later", cap(t.snapshotSlot))
	}

	start := time.Now()
	f, err := os.CreateTemp(t.spoolDir, spoolPattern)
	if err != nil {
		t.log.Error("cannot spool an inbound snapshot", "dir", t.spoolDir, "err", err)
		return status.Errorf(codes.Unavailable, "spooling snapshot: %v", err)
	}
	defer func() {
		f.Close()
		os.Remove(f.Name())
	}()
	size, err := t.spool(stream, f)
	if err != nil {
		var tooLarge *snapshotTooLargeError
		if errors.As(err, &tooLarge) {
			t.drop(reasonSnapshotTooLarge, authID, header{Type: raftpb.MsgSnap, From: authID}, remote)
			return status.Error(codes.ResourceExhausted, err.Error())
		}
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return status.Errorf(codes.Internal, "rewinding spooled snapshot: %v", err)
	}
	h, err := readHeader(bufio.NewReaderSize(f, 64<<10))
	if err != nil {
		t.drop(reasonMalformed, authID, h, remote)
		return status.Error(codes.InvalidArgument, err.Error())
	}
	nh, reason := nodeHeader(g, h)
	if reason == "" {
		reason = t.admit(authID, nh)
	}
	if reason == "" && h.Type != raftpb.MsgSnap {
		reason = reasonNotSnapshot
	}
	if reason != "" {
		t.dropGroup(reason, group, authID, h, remote)
		return status.Errorf(codes.PermissionDenied, "snapshot message refused: %s", reason)
	}
	if err := t.handOff(ctx, g, f, size); err != nil {
		return err
	}
	t.metrics.snapshotsReceived.Inc()
	t.log.Info("received snapshot", "from", h.From, "term", h.Term, "bytes", size, "took", time.Since(start))
	return stream.SendMsg(&[]byte{})
}

type snapshotTooLargeError struct{ max int64 }

func (e *snapshotTooLargeError) Error() string {
	return fmt.Sprintf("snapshot stream exceeds this node's --max-snapshot-bytes (%d); cut", e.max)
}

// spool writes the stream's chunks to f, one receive buffer reused, and
// returns the size.
func (t *Transport) spool(stream grpc.ServerStream, f *os.File) (int64, error) {
	var size int64
	var chunk []byte
	for {
		err := stream.RecvMsg(&chunk)
		if errors.Is(err, io.EOF) {
			return size, nil
		}
		if err != nil {
			return size, err
		}
		size += int64(len(chunk))
		t.metrics.snapshotBytes.Add(float64(len(chunk)))
		if size > t.opts.MaxSnapshotBytes {
			return size, &snapshotTooLargeError{max: t.opts.MaxSnapshotBytes}
		}
		if _, err := f.Write(chunk); err != nil {
			return size, status.Errorf(codes.Unavailable, "spooling snapshot: %v", err)
		}
	}
}

// handOff reads the admitted snapshot into memory and gives it to raft,
// one at a time.
func (t *Transport) handOff(ctx context.Context, g Handler, f *os.File, size int64) error {
	t.handoff.Lock()
	defer t.handoff.Unlock()
	t.snapInbound.Add(size)
	defer t.snapInbound.Add(-size)
	data := make([]byte, size)
	if _, err := f.ReadAt(data, 0); err != nil {
		return status.Errorf(codes.Internal, "reading spooled snapshot: %v", err)
	}
	// The file is no longer needed: free the disk before raft works.
	os.Remove(f.Name())
	return g.Receive(ctx, data)
}

// snapshotGroup is the raft group a Snapshot stream's metadata names;
// group 1 when it names none (every release before groupedProtocol).
func snapshotGroup(ctx context.Context) (uint64, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(mdGroup)
	if len(vals) == 0 {
		return LegacyGroup, nil
	}
	g, err := strconv.ParseUint(vals[len(vals)-1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("peer metadata %s: expected a raft group id, found %q", mdGroup, vals[len(vals)-1])
	}
	return g, nil
}

// SnapshotBuffers reports the snapshot bytes this transport holds in
// memory now: inbound, read from a spooled stream and not yet taken by
// raft (Receive returned); outbound, being streamed to peers. An outbound
// snapshot is the data of the MsgSnap raft handed to Send, a clone raft
// made of its snapshot for that message: memory of its own.
func (t *Transport) SnapshotBuffers() (inbound, outbound int64) {
	return t.snapInbound.Load(), t.snapOutbound.Load()
}
