package peer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

const mib = 1 << 20

func snapshotMessage(t testing.TB, from, to uint64, size int) []byte {
	return marshal(t, &raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(3),
		Snapshot: &raftpb.Snapshot{Data: bytes.Repeat([]byte{7}, size),
			Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(100), Term: proto.Uint64(3)}}})
}

// snapshotPrefix is the encoding of a MsgSnap from, to whose snapshot
// data (size bytes of 7, field 1 of the Snapshot, written last) follows.
func snapshotPrefix(t testing.TB, from, to uint64, size int) []byte {
	meta := mustMarshal(t, &raftpb.SnapshotMetadata{Index: proto.Uint64(100), Term: proto.Uint64(3)})
	inner := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), meta)
	inner = protowire.AppendTag(inner, 1, protowire.BytesType)
	inner = protowire.AppendVarint(inner, uint64(size))
	b := mustMarshal(t, &raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(3)})
	b = protowire.AppendTag(b, 9, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(inner)+size))
	return append(b, inner...)
}

func openSnapshotStream(t *testing.T, conn *grpc.ClientConn) grpc.ClientStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	st, err := conn.NewStream(ctx, snapshotDesc, "/"+serviceName+"/"+methodSnapshots)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// finish ends a snapshot stream and returns the server's verdict.
func finish(st grpc.ClientStream) error {
	if err := st.CloseSend(); err != nil {
		return err
	}
	var ack []byte
	return st.RecvMsg(&ack)
}

// heapInUse is the live heap after two full collections: the second
// empties the sync.Pool victim caches gRPC's buffer pools live in, which
// survive one collection and would otherwise count as live.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// heapGrowthSettles waits for the live heap to come within limit of
// before and returns the last growth seen. It polls instead of reading
// once because buffers a cut or finishing stream still holds (a
// transport's queued frames, a reader goroutine's last chunk) are
// released on other goroutines' schedule; a receiver that keeps the
// stream in memory never comes back within the limit, however long the
// wait.
func heapGrowthSettles(before, limit int64) int64 {
	deadline := time.Now().Add(10 * time.Second)
	for {
		grew := heapInUse() - before
		if grew <= limit || time.Now().After(deadline) {
			return grew
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func spoolFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, spoolPattern))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// Regression (a forged 400 MiB snapshot stream raised a
// node's memory by ~450 MB): a snapshot is written to disk as it
// arrives. With 32 MiB streamed and the stream still open, the receiving
// process's live heap has not grown by anything like 32 MiB; once the
// stream ends, the snapshot reaches raft whole and the spool is emptied.
func TestSnapshotSpooledToDiskNotMemory(t *testing.T) {
	spool := filepath.Join(t.TempDir(), "spool")
	srv := startNode(t, 1, Options{Membership: members([]uint64{1, 2}), SpoolDir: spool, MaxSnapshotBytes: 64 * mib})
	conn := rawClient(t, srv.addr, nil)
	const size = 32 * mib
	// The message is generated as it is sent, from one reused chunk, so
	// the only copy that can grow the heap is the receiver's.
	prefix := snapshotPrefix(t, 2, 1, size)
	total := len(prefix) + size
	chunk := bytes.Repeat([]byte{7}, mib)

	before := heapInUse()
	st := openSnapshotStream(t, conn)
	if err := st.SendMsg(&prefix); err != nil {
		t.Fatal(err)
	}
	for sent := 0; sent < size; sent += len(chunk) {
		if err := st.SendMsg(&chunk); err != nil {
			t.Fatalf("sending chunk at %d: %v", sent, err)
		}
	}
	eventually(t, "the whole stream spooled", func() bool {
		files := spoolFiles(t, spool)
		if len(files) != 1 {
			return false
		}
		fi, err := os.Stat(files[0])
		return err == nil && fi.Size() == int64(total)
	})
	if grew := heapGrowthSettles(before, 8*mib); grew > 8*mib {
		t.Errorf("live heap grew by %d MiB while %d MiB were streamed in; expected the snapshot on disk, not in memory", grew/mib, size/mib)
	}
	if err := finish(st); err != nil {
		t.Fatalf("snapshot refused: %v", err)
	}
	got := srv.in.received()
	if len(got) != 1 || got[0].GetType() != raftpb.MsgSnap || srv.in.receivedSizes()[0] != total {
		t.Fatalf("raft received %d messages; expected the %d-byte MsgSnap", len(got), total)
	}
	eventually(t, "the spool emptied", func() bool { return len(spoolFiles(t, spool)) == 0 })
}

// Regression: a snapshot stream past MaxSnapshotBytes
// is cut with ResourceExhausted and counted; the 64 MiB a sender tries
// to push through an 8 MiB cap neither reaches raft nor stays in memory
// or on disk.
func TestSnapshotStreamPastCapIsCut(t *testing.T) {
	spool := filepath.Join(t.TempDir(), "spool")
	srv := startNode(t, 1, Options{Membership: members([]uint64{1, 2}), SpoolDir: spool, MaxSnapshotBytes: 8 * mib})
	conn := rawClient(t, srv.addr, nil)
	chunk := bytes.Repeat([]byte{7}, mib)

	before := heapInUse()
	st := openSnapshotStream(t, conn)
	sent := 0
	var err error
	for sent < 64*mib {
		if err = st.SendMsg(&chunk); err != nil {
			break
		}
		sent += len(chunk)
	}
	if errors.Is(err, io.EOF) || err == nil {
		err = finish(st)
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("after %d MiB sent, stream ended with %v; expected ResourceExhausted", sent/mib, err)
	}
	if grew := heapGrowthSettles(before, 8*mib); grew > 8*mib {
		t.Errorf("live heap grew by %d MiB; expected the cut stream's bytes gone", grew/mib)
	}
	if got := dropped(srv.t, reasonSnapshotTooLarge); got != 1 {
		t.Errorf("snapshot_too_large = %d; expected 1", got)
	}
	if got := value(srv.t.metrics.snapshotBytes); got > 8*mib+float64(srv.t.opts.maxMessageBytes()) {
		t.Errorf("server took %v bytes; expected at most the cap plus one chunk", got)
	}
	if got := srv.in.received(); len(got) != 0 {
		t.Fatalf("raft received %d messages; expected none", len(got))
	}
	eventually(t, "the spool emptied", func() bool { return len(spoolFiles(t, spool)) == 0 })
}

// A snapshot is admitted like any message, on its
// header read back from the spool: member 2 sending a MsgSnap as member
// 1 is refused, and under TLS a certificate naming a non-member is
// refused before anything is spooled.
func TestSnapshotAdmission(t *testing.T) {
	p := newPKI(t)
	spool := filepath.Join(t.TempDir(), "spool")
	srv := startNode(t, 3, p.secured(t, 3, Options{Membership: members([]uint64{1, 2, 3}), SpoolDir: spool}))

	send := func(conn *grpc.ClientConn, msg []byte) error {
		st := openSnapshotStream(t, conn)
		if err := st.SendMsg(&msg); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		return finish(st)
	}
	member2 := rawClient(t, srv.addr, attackerTLS(t, p.nodeDir(t, 2)))
	if err := send(member2, snapshotMessage(t, 1, 3, mib)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("member 2 sending a snapshot as member 1: %v; expected PermissionDenied", err)
	}
	if got := dropped(srv.t, reasonSenderMismatch); got != 1 {
		t.Errorf("sender_mismatch = %d; expected 1", got)
	}
	if err := send(member2, marshal(t, heartbeat(2, 3, 4))); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a heartbeat on the snapshot stream: %v; expected PermissionDenied", err)
	}
	stranger := rawClient(t, srv.addr, attackerTLS(t, p.nodeDir(t, 9)))
	if err := send(stranger, snapshotMessage(t, 9, 3, mib)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("non-member 9 sending a snapshot: %v; expected PermissionDenied", err)
	}
	if got := value(srv.t.metrics.snapshotBytes); got != float64(len(snapshotMessage(t, 1, 3, mib))+len(marshal(t, heartbeat(2, 3, 4)))) {
		t.Errorf("spooled %v bytes; expected only member 2's two streams, none of non-member 9's", got)
	}
	if got := srv.in.received(); len(got) != 0 {
		t.Fatalf("raft received %d messages; expected none", len(got))
	}
	// And an honest one passes.
	if err := send(member2, snapshotMessage(t, 2, 3, mib)); err != nil {
		t.Fatalf("member 2's own snapshot: %v", err)
	}
	if got := srv.in.received(); len(got) != 1 || got[0].GetFrom() != 2 {
		t.Fatalf("raft received %v; expected member 2's snapshot", got)
	}
}

// A snapshot raft hands to Send goes out in chunks, is spooled and
// admitted at the peer over mutual TLS, and the sender's raft learns it
// arrived.
func TestSnapshotBetweenTransports(t *testing.T) {
	p := newPKI(t)
	view := members([]uint64{1, 2})
	n1 := startNode(t, 1, p.secured(t, 1, Options{Membership: view, ChunkSize: 256 << 10}))
	n2 := startNode(t, 2, p.secured(t, 2, Options{Membership: view}))
	n1.t.SetPeer(2, n2.addr)
	n1.t.Send([]replicaOutbound{{To: 2, Snapshot: true, Data: snapshotMessage(t, 1, 2, 3*mib)}})
	eventually(t, "member 1 told the snapshot arrived", func() bool { return len(n1.in.snapshotReports(2)) == 1 })
	if r := n1.in.snapshotReports(2); !r[0] {
		t.Fatal("snapshot reported failed; expected success")
	}
	if got := n2.in.received(); len(got) != 1 || got[0].GetType() != raftpb.MsgSnap {
		t.Fatalf("member 2 received %v; expected one MsgSnap", got)
	}
}

// Spool files an earlier run left behind (a crash in
// the middle of a snapshot) are removed at start; other files are not
// touched.
func TestStaleSpoolFilesRemovedAtStart(t *testing.T) {
	spool := filepath.Join(t.TempDir(), "spool")
	if err := os.MkdirAll(spool, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"tidal-snap-123.spool", "tidal-snap-456.spool", "keep.txt"} {
		if err := os.WriteFile(filepath.Join(spool, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	startNode(t, 1, Options{SpoolDir: spool})
	if left := spoolFiles(t, spool); len(left) != 0 {
		t.Errorf("stale spool files left: %v", left)
	}
	if _, err := os.Stat(filepath.Join(spool, "keep.txt")); err != nil {
		t.Errorf("a file that is not a spool file was touched: %v", err)
	}
}

// A snapshot larger than the receiver's cap is cut there, and the
// sender's raft is told it failed (it will retry, and the receiver's log
// says why).
func TestSnapshotOverPeerCapReportedFailed(t *testing.T) {
	view := members([]uint64{1, 2})
	n1 := startNode(t, 1, Options{Membership: view, ChunkSize: 256 << 10})
	n2 := startNode(t, 2, Options{Membership: view, MaxSnapshotBytes: mib})
	n1.t.SetPeer(2, n2.addr)
	n1.t.Send([]replicaOutbound{{To: 2, Snapshot: true, Data: snapshotMessage(t, 1, 2, 3*mib)}})
	eventually(t, "member 1 told how the snapshot went", func() bool { return len(n1.in.snapshotReports(2)) == 1 })
	if r := n1.in.snapshotReports(2); r[0] {
		t.Fatal("snapshot past the receiver's cap reported delivered")
	}
	if got := dropped(n2.t, reasonSnapshotTooLarge); got != 1 {
		t.Errorf("snapshot_too_large at member 2 = %d; expected 1", got)
	}
	if got := n2.in.received(); len(got) != 0 {
		t.Fatalf("member 2's raft received %d messages; expected none", len(got))
	}
}

// SnapshotBuffers counts an inbound snapshot while it is in memory on
// its way to raft (read from the spool, Receive not returned) and not
// before or after.
func TestSnapshotBuffersCountWhatIsInMemory(t *testing.T) {
	srv := startNode(t, 1, Options{Membership: members([]uint64{1, 2}), MaxSnapshotBytes: 64 * mib})
	var during int64 = -1
	srv.in.onReceive = func() { during, _ = srv.t.SnapshotBuffers() }
	const size = 2 * mib
	msg := snapshotMessage(t, 2, 1, size)
	if in, out := srv.t.SnapshotBuffers(); in != 0 || out != 0 {
		t.Fatalf("before any snapshot: expected 0 inbound and outbound, found %d, %d", in, out)
	}
	st := openSnapshotStream(t, rawClient(t, srv.addr, nil))
	if err := st.SendMsg(&msg); err != nil {
		t.Fatal(err)
	}
	if err := finish(st); err != nil {
		t.Fatalf("snapshot refused: %v", err)
	}
	if during != int64(len(msg)) {
		t.Fatalf("while raft received it: expected %d inbound bytes, found %d", len(msg), during)
	}
	if in, _ := srv.t.SnapshotBuffers(); in != 0 {
		t.Fatalf("once raft took it: expected 0 inbound bytes, found %d", in)
	}
}
