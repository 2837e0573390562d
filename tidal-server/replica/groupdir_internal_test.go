package replica

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/tidaldb/tidal/tidal-server/wal"
)

// A group's files: the data dir for the default group, groups/<g> for
// the others.
func TestGroupDir(t *testing.T) {
	for _, c := range []struct {
		group uint64
		want  string
	}{{1, "/d"}, {2, "/d/groups/2"}, {0, "/d/groups/0"}, {4096, "/d/groups/4096"}} {
		if got := GroupDir("/d", c.group); got != c.want {
			t.Errorf("GroupDir(/d, %d) = %s; expected %s", c.group, got, c.want)
		}
	}
}

// Regression: group snapshot format unchecked. A snapshot in a newer
// format in another group's dir refuses the data dir, as one in the
// default group's snap/ does.
func TestCheckDataDirFormatReadsEveryGroupsSnapshots(t *testing.T) {
	data := t.TempDir()
	s, err := newSnapStore(filepath.Join(GroupDir(data, 2), "snap"), nil)
	if err != nil {
		t.Fatal(err)
	}
	snap := &raftpb.Snapshot{Data: []byte("state"), Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(3), Term: proto.Uint64(1)}}
	if err := s.save(snap); err != nil {
		t.Fatal(err)
	}
	if err := CheckDataDirFormat(data); err != nil {
		t.Fatalf("group 2 holds this build's snapshot: %v", err)
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
	want := filepath.Join(data, "groups", "2", "snap", snapName(1, 4))
	if err := CheckDataDirFormat(data); !errors.As(err, &fe) || fe.File != want {
		t.Fatalf("a newer snapshot of group 2: expected a *wal.FormatError naming %s, got %v", want, err)
	}
}

// Regression: recovery drops other groups. ReadSurvivor rebuilds the
// default group alone and ForceNewCluster sets the whole WAL aside, so a
// WAL that holds another group's log is refused, naming the group.
func TestReadSurvivorRefusesAWALOfSeveralGroups(t *testing.T) {
	data := t.TempDir()
	w, _, err := wal.Open(filepath.Join(data, "wal"), wal.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []uint64{wal.DefaultGroup, 2} {
		b := wal.Batch{Entries: []wal.Entry{{Index: 1, Term: 1, Type: uint8(raftpb.EntryNormal)}}, HardState: &wal.HardState{Term: 1, Commit: 1}}
		if err := w.Group(g).Save(context.Background(), b, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = ReadSurvivor(data, &nopSM{})
	if err == nil || !strings.Contains(err.Error(), "raft group 2") {
		t.Fatalf("ReadSurvivor of a WAL holding groups 1 and 2: got %v; expected a refusal naming group 2", err)
	}
}

// Every group's collectors register in one registry when labelled by
// group; unlabelled ones of a second replica would panic there.
func TestGroupMetricsRegisterSideBySide(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewGroupMetrics(reg, 1)
	NewGroupMetrics(reg, 2)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("NewMetrics twice in one registry: expected a duplicate registration panic (the check can fail)")
			}
		}()
		reg := prometheus.NewRegistry()
		NewMetrics(reg)
		NewMetrics(reg)
	}()
}

// Config.Recovered is only read for a log the node opened.
func TestRecoveredWithoutLogRefused(t *testing.T) {
	_, err := Start(Config{ID: 1, DataDir: t.TempDir(), StateMachine: &nopSM{}, Recovered: &wal.GroupRecovered{}})
	if err == nil || !strings.Contains(err.Error(), "Recovered without Config.Log") {
		t.Fatalf("Start with Recovered and no Log: got %v; expected a refusal", err)
	}
}

// nopSM is a state machine that keeps nothing.
type nopSM struct{}

func (nopSM) Apply(uint64, uint64, []byte) any { return nil }
func (nopSM) SetApplied(uint64)                {}
func (nopSM) Snapshot(io.Writer) error         { return nil }
func (nopSM) Restore(io.Reader) error          { return nil }
