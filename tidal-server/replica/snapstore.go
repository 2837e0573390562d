package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// A snapshot file is
//
//	magic "TIDALSNP" | u32 version | u32 crc32c(payload) | u64 len(payload) | payload
//
// where payload is a marshalled raftpb.Snapshot. Files are written to a
// temporary name, fsynced, renamed and the directory fsynced, so a crash
// leaves either the old set of snapshots or the new one.
const (
	snapMagic      = "TIDALSNP"
	snapHeaderSize = 8 + 4 + 4 + 8
	snapsKept      = 2

	// SnapshotFormatVersion is the snapshot file version this build
	// writes; it reads MinSnapshotFormatVersion to SnapshotFormatVersion
	// and refuses others with a *wal.FormatError naming the file. Bump it
	// with any change to the file's framing or to the
	// state encodings inside it.
	SnapshotFormatVersion    = 1
	MinSnapshotFormatVersion = 1
)

// snapWriteVersion and snapReadVersion differ from SnapshotFormatVersion
// only under SetTestNewerFormat (a tidalbugs build's hooks_tidalbugs.go)
// or in this package's tests.
var (
	snapWriteVersion uint32 = SnapshotFormatVersion
	snapReadVersion  uint32 = SnapshotFormatVersion
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// snapStore keeps raft snapshots as files named <term>-<index>.snap.
type snapStore struct {
	dir string
}

// newSnapStore opens the snapshot directory, creating it durably, and
// removes the temporary files of snapshots a crash interrupted (each is
// logged): they were never renamed into place, so no WAL mark names them.
func newSnapStore(dir string, log *slog.Logger) (*snapStore, error) {
	if err := wal.MkdirAllDurable(dir); err != nil {
		return nil, fmt.Errorf("snapshot dir: %w", err)
	}
	if _, err := wal.RemoveTemporaries(dir, log); err != nil {
		return nil, fmt.Errorf("snapshot dir: %w", err)
	}
	return &snapStore{dir: dir}, nil
}

func snapName(term, index uint64) string {
	return fmt.Sprintf("%016x-%016x.snap", term, index)
}

// snapSyncEvery is how much of a snapshot file is written between
// fdatasyncs (see wal.WriteFileAtomicPieces).
const snapSyncEvery = 8 << 20

// save writes snap durably and removes all but the newest snapsKept files.
// The file is written from its pieces — header, the data field's tag and
// length, the data itself, the metadata field — with no copy of the data:
// the bytes are exactly proto.Marshal's (fields in number order), so the
// format is unchanged, and the checksum is computed over the pieces.
func (s *snapStore) save(snap *raftpb.Snapshot) error {
	md, err := proto.Marshal(&raftpb.Snapshot{Metadata: snap.GetMetadata()})
	if err != nil {
		return fmt.Errorf("marshal snapshot: %w", err)
	}
	data := snap.GetData()
	var field []byte
	if data != nil {
		field = protowire.AppendTag(nil, 1, protowire.BytesType)
		field = protowire.AppendVarint(field, uint64(len(data)))
	}
	crc := crc32.Update(0, castagnoli, field)
	crc = crc32.Update(crc, castagnoli, data)
	crc = crc32.Update(crc, castagnoli, md)
	n := len(field) + len(data) + len(md)
	hdr := make([]byte, snapHeaderSize)
	copy(hdr, snapMagic)
	binary.LittleEndian.PutUint32(hdr[8:], snapWriteVersion)
	binary.LittleEndian.PutUint32(hdr[12:], crc)
	binary.LittleEndian.PutUint64(hdr[16:], uint64(n))
	m := snap.GetMetadata()
	name := filepath.Join(s.dir, snapName(m.GetTerm(), m.GetIndex()))
	if err := wal.WriteFileAtomicPieces(name, [][]byte{hdr, field, data, md}, snapSyncEvery); err != nil {
		return err
	}
	return s.prune()
}

func (s *snapStore) names() ([]string, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".snap") {
			names = append(names, e.Name())
		}
	}
	// Fixed-width hex names sort by term, then index.
	sort.Strings(names)
	return names, nil
}

func (s *snapStore) prune() error {
	names, err := s.names()
	if err != nil {
		return err
	}
	for len(names) > snapsKept {
		if err := os.Remove(filepath.Join(s.dir, names[0])); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		names = names[1:]
	}
	return nil
}

// load reads the snapshot at (term, index), which the WAL named as the
// newest durable one. A missing or damaged file is an error naming it: the
// WAL already dropped the entries that snapshot replaced, so starting
// without it would silently lose state.
func (s *snapStore) load(term, index uint64) (*raftpb.Snapshot, error) {
	name := filepath.Join(s.dir, snapName(term, index))
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("snapshot at index %d term %d named by the WAL: %w", index, term, err)
	}
	return decodeSnapshotFile(name, data)
}

// SnapshotPayload returns where the payload of the snapshot file at path
// lies, as its header says: offset bytes in, length bytes long. Only the
// header is read, and checked against the file (magic, and the length
// against the file's size); the version and checksum are not: it is for
// tools that aim at a snapshot's payload (the chaos harness's corrupt-read
// picker), so that they do not keep a copy of the framing.
func SnapshotPayload(path string) (offset, length int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	var h [snapHeaderSize]byte
	if _, err := io.ReadFull(f, h[:]); err != nil || string(h[:8]) != snapMagic {
		return 0, 0, fmt.Errorf("%s: not a tidal snapshot (expected magic %q at offset 0)", path, snapMagic)
	}
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	n := binary.LittleEndian.Uint64(h[16:])
	if payload := st.Size() - snapHeaderSize; uint64(payload) != n {
		return 0, 0, fmt.Errorf("%s: payload is %d bytes, header says %d", path, payload, n)
	}
	return snapHeaderSize, int64(n), nil
}

func decodeSnapshotFile(name string, data []byte) (*raftpb.Snapshot, error) {
	if len(data) < snapHeaderSize || string(data[:8]) != snapMagic {
		return nil, fmt.Errorf("%s: not a tidal snapshot (expected magic %q at offset 0)", name, snapMagic)
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v < MinSnapshotFormatVersion || v > snapReadVersion {
		return nil, &wal.FormatError{File: name, What: "snapshot", Found: v, MinSupported: MinSnapshotFormatVersion, Supported: snapReadVersion}
	}
	want := binary.LittleEndian.Uint32(data[12:])
	n := binary.LittleEndian.Uint64(data[16:])
	payload := data[snapHeaderSize:]
	if uint64(len(payload)) != n {
		return nil, fmt.Errorf("%s: payload is %d bytes, header says %d", name, len(payload), n)
	}
	if got := crc32.Checksum(payload, castagnoli); got != want {
		return nil, fmt.Errorf("snapshot: corruption in %s at offset %d: checksum mismatch: header %08x, payload %08x", name, snapHeaderSize, want, got)
	}
	snap := &raftpb.Snapshot{}
	if err := proto.Unmarshal(payload, snap); err != nil {
		return nil, fmt.Errorf("%s: decode snapshot: %w", name, err)
	}
	return snap, nil
}

// CheckDataDirFormat returns a *wal.FormatError for the first WAL segment
// or snapshot file of dataDir written in a format version this build does
// not read, reading only their headers; nil otherwise (damage is reported
// when the node opens them). tidal-server checks this before it writes
// anything into a data dir.
func CheckDataDirFormat(dataDir string) error {
	if err := wal.CheckFormat(filepath.Join(dataDir, "wal")); err != nil {
		return err
	}
	if err := checkSnapDirFormat(filepath.Join(dataDir, "snap")); err != nil {
		return err
	}
	// Every other group's snapshots (GroupDir): a group a newer release
	// created is refused as the default group's would be.
	groups, err := os.ReadDir(filepath.Join(dataDir, "groups"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, g := range groups {
		if !g.IsDir() {
			continue
		}
		if err := checkSnapDirFormat(filepath.Join(dataDir, "groups", g.Name(), "snap")); err != nil {
			return err
		}
	}
	return nil
}

// checkSnapDirFormat is CheckDataDirFormat for one group's snapshot dir.
func checkSnapDirFormat(dir string) error {
	s := &snapStore{dir: dir}
	names, err := s.names()
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, n := range names {
		name := filepath.Join(s.dir, n)
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		var head [12]byte
		_, err = io.ReadFull(f, head[:])
		f.Close()
		if err != nil || string(head[:8]) != snapMagic {
			continue // damage: load reports it, for the snapshot the WAL names
		}
		if v := binary.LittleEndian.Uint32(head[8:]); v < MinSnapshotFormatVersion || v > snapReadVersion {
			return &wal.FormatError{File: name, What: "snapshot", Found: v, MinSupported: MinSnapshotFormatVersion, Supported: snapReadVersion}
		}
	}
	return nil
}
