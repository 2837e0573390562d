package replica

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Regression: the temporary file of a snapshot write a
// crash interrupted survived every restart. Opening the store removes it,
// with a log line naming it, and keeps the snapshots themselves.
func TestSnapStoreRemovesLeftoverTemporaries(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, snapName(2, 40)+".tmp")
	kept := filepath.Join(dir, snapName(2, 30))
	for _, f := range []string{tmp, kept} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logged bytes.Buffer
	if _, err := newSnapStore(dir, slog.New(slog.NewTextHandler(&logged, nil))); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("expected %s removed, stat says %v", filepath.Base(tmp), err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("expected the snapshot %s kept: %v", filepath.Base(kept), err)
	}
	if !strings.Contains(logged.String(), filepath.Base(tmp)) {
		t.Fatalf("expected a log line naming %s, log was:\n%s", filepath.Base(tmp), logged.String())
	}
}

// A snapshot file a newer release wrote is refused with
// the file, the version found and the versions this build reads.
func TestSnapStoreRefusesNewerFormat(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	s, err := newSnapStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := &raftpb.Snapshot{Data: []byte("state"), Metadata: &raftpb.SnapshotMetadata{
		Index: proto.Uint64(7), Term: proto.Uint64(2), ConfState: &raftpb.ConfState{Voters: []uint64{1}}}}
	func() {
		defer func() { snapWriteVersion, snapReadVersion = SnapshotFormatVersion, SnapshotFormatVersion }()
		snapWriteVersion, snapReadVersion = SnapshotFormatVersion+1, SnapshotFormatVersion+1 // a newer release
		if err := s.save(snap); err != nil {
			t.Fatal(err)
		}
		if _, err := s.load(2, 7); err != nil {
			t.Fatalf("the newer release reads its own snapshot: %v", err)
		}
	}()
	_, err = s.load(2, 7)
	var fe *wal.FormatError
	if !errors.As(err, &fe) || fe.Found != SnapshotFormatVersion+1 || fe.Supported != SnapshotFormatVersion ||
		fe.File != filepath.Join(dir, snapName(2, 7)) || !strings.Contains(err.Error(), "newer") {
		t.Fatalf("expected a format error naming %s, found version %d, supported %d; got %T %v",
			snapName(2, 7), SnapshotFormatVersion+1, SnapshotFormatVersion, err, err)
	}
}

func TestCheckDataDirFormatReadsSnapshotHeaders(t *testing.T) {
	data := t.TempDir()
	if err := CheckDataDirFormat(data); err != nil {
		t.Fatalf("an empty data dir: %v", err)
	}
	s, err := newSnapStore(filepath.Join(data, "snap"), nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := &raftpb.Snapshot{Data: []byte("state"), Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(3), Term: proto.Uint64(1)}}
	if err := s.save(snap); err != nil {
		t.Fatal(err)
	}
	if err := CheckDataDirFormat(data); err != nil {
		t.Fatalf("this build's snapshot: %v", err)
	}
	func() {
		defer func() { snapWriteVersion, snapReadVersion = SnapshotFormatVersion, SnapshotFormatVersion }()
		snapWriteVersion, snapReadVersion = SnapshotFormatVersion+1, SnapshotFormatVersion+1 // a newer release
		snap.Metadata.Index = proto.Uint64(4)
		if err := s.save(snap); err != nil {
			t.Fatal(err)
		}
	}()
	var fe *wal.FormatError
	if err := CheckDataDirFormat(data); !errors.As(err, &fe) || fe.File != filepath.Join(data, "snap", snapName(1, 4)) {
		t.Fatalf("a newer snapshot: expected a *wal.FormatError naming it, got %v", err)
	}
}

// A snapshot read back with a bit flipped in its payload is refused, and
// the error says "corruption in <file> at offset <n>" as the WAL's does,
// which is what the chaos harness's checkers look for in a node's log.
// Regression: corrupt-read now flips snapshot payloads,
// and the refusal said only "checksum mismatch", so a node that refused
// its snapshot rightly was judged to have exited without naming it.
func TestSnapStoreRefusesAFlippedPayloadNamingFileAndOffset(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	s, err := newSnapStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := &raftpb.Snapshot{Data: []byte("state of the machine"), Metadata: &raftpb.SnapshotMetadata{
		Index: proto.Uint64(7), Term: proto.Uint64(2), ConfState: &raftpb.ConfState{Voters: []uint64{1}}}}
	if err := s.save(snap); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, snapName(2, 7))
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	b[snapHeaderSize+3] ^= 0x01
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = s.load(2, 7)
	want := "corruption in " + name + " at offset 24"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("load of a flipped snapshot: got %v, want an error containing %q", err, want)
	}
}

// SnapshotPayload says where save put the payload: the bytes there are the
// marshalled snapshot. A file that is not a snapshot is an error.
func TestSnapshotPayloadMatchesSave(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	s, err := newSnapStore(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := &raftpb.Snapshot{Data: bytes.Repeat([]byte("state "), 100), Metadata: &raftpb.SnapshotMetadata{
		Index: proto.Uint64(9), Term: proto.Uint64(3), ConfState: &raftpb.ConfState{Voters: []uint64{1}}}}
	if err := s.save(snap); err != nil {
		t.Fatal(err)
	}
	name := filepath.Join(dir, snapName(3, 9))
	off, n, err := SnapshotPayload(name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := proto.Marshal(snap)
	if off+n != int64(len(b)) || !bytes.Equal(b[off:off+n], want) {
		t.Fatalf("expected the payload at [%d, %d) to be the marshalled snapshot (%d bytes) ending the file (%d bytes)", off, off+n, len(want), len(b))
	}
	other := filepath.Join(dir, "other.snap")
	if err := os.WriteFile(other, bytes.Repeat([]byte{1}, 64), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := SnapshotPayload(other); err == nil {
		t.Error("a file without the magic: expected an error")
	}
}

// The snapshot file written from pieces (no joined copy of a
// large snapshot's data in memory) is byte for byte the version-1 file the
// single-buffer writer made — header, proto.Marshal of the snapshot — so
// files of either build load in the other, and it loads back equal.
func TestSnapStoreSaveIsTheVersion1Encoding(t *testing.T) {
	for _, data := range [][]byte{nil, {}, []byte("state"), bytes.Repeat([]byte{7, 1, 9}, 100000)} {
		dir := filepath.Join(t.TempDir(), "snap")
		s, err := newSnapStore(dir, nil)
		if err != nil {
			t.Fatal(err)
		}
		snap := &raftpb.Snapshot{Data: data, Metadata: &raftpb.SnapshotMetadata{
			Index: proto.Uint64(9), Term: proto.Uint64(3), ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}
		if err := s.save(snap); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dir, snapName(3, 9)))
		if err != nil {
			t.Fatal(err)
		}
		// The old writer: header | proto.Marshal(snap).
		payload, err := proto.Marshal(snap)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, snapHeaderSize, snapHeaderSize+len(payload))
		copy(want, snapMagic)
		binary.LittleEndian.PutUint32(want[8:], 1)
		binary.LittleEndian.PutUint32(want[12:], crc32.Checksum(payload, castagnoli))
		binary.LittleEndian.PutUint64(want[16:], uint64(len(payload)))
		want = append(want, payload...)
		if !bytes.Equal(got, want) {
			t.Fatalf("data of %d bytes: the file (%d bytes) differs from the version-1 encoding (%d bytes)", len(data), len(got), len(want))
		}
		back, err := s.load(3, 9)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(back.GetData(), data) || back.GetMetadata().GetIndex() != 9 {
			t.Fatalf("data of %d bytes: loaded back %d bytes at index %d", len(data), len(back.GetData()), back.GetMetadata().GetIndex())
		}
	}
}
