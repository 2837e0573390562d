package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3/raftpb"
)

// What recover --force-new-cluster keeps is exactly the
// survivor's state: its snapshot and its log replayed give the digest the
// node itself had (here a one-node cluster, where everything it logged it
// applied), and the recovered data dir starts as a one-member cluster
// that takes writes.
func TestRecoverForceNewClusterReplaysSnapshotAndLog(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	cfg := Config{ID: 1, ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", DataDir: data,
		TickInterval: 10 * time.Millisecond, ReadyWithin: 1000, SnapshotEvery: 100000, SnapshotCatchUp: 2, IDsPerGeneration: 1000,
		PackProposals: true}
	srv, err := Start(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Concurrent writers, so that some entries pack several proposals
	// (entry format 2): recovery must apply those as the apply loop does;
	// a snapshot taken halfway, so that it restores one and replays the
	// log after it.
	var wg sync.WaitGroup
	write := func(w int) {
		defer wg.Done()
		for i := 0; i < 12; i++ {
			ev := []ledger.Event{{ID: fmt.Sprintf("r-%d-%d", w, i), Entity: uint64(i % 4), Signal: "view", Weight: 1, TS: time.Now().UnixMilli()}}
			for {
				if _, err := srv.node.WriteSignals(ctx, ev); err == nil {
					break
				} else if ctx.Err() != nil {
					t.Errorf("write %d/%d: %v", w, i, err)
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	for phase := 0; phase < 2; phase++ {
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go write(phase*8 + w)
		}
		wg.Wait()
		if phase == 0 {
			if _, _, err := srv.replica.Snapshot(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	index, digest := srv.sm.Digest()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

	rec, err := wal.Read(filepath.Join(data, "wal"))
	if err != nil {
		t.Fatal(err)
	}
	packed := 0
	for _, e := range rec.Entries {
		if f, _ := replica.EntryFormatOf(raftpb.EntryType(e.Type), e.Data); f >= replica.PackedEntryFormat {
			packed++
		}
	}
	t.Logf("%d entries after the snapshot at %d, %d of them packed", len(rec.Entries), rec.Snapshot.Index, packed)

	rep, err := RecoverForceNewCluster(RecoverOptions{DataDir: data, ID: 1, IDsPerGeneration: 1000, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Survivor
	if s.SnapshotIndex == 0 || s.LastIndex != index || rep.Aside != "" {
		t.Fatalf("dry run: %+v; expected a snapshot, the log reaching applied index %d, nothing moved", rep, index)
	}
	sm := NewStateMachine(ledger.DefaultSchema(), ledger.Options{IDsPerGeneration: 1000})
	if _, err := replica.ReadSurvivor(data, sm); err != nil {
		t.Fatal(err)
	}
	if i, d := sm.Digest(); i != index || d != digest {
		t.Fatalf("replayed state: index %d digest %s; the node had index %d digest %s", i, d, index, digest)
	}

	rep, err = RecoverForceNewCluster(RecoverOptions{DataDir: data, ID: 1, IDsPerGeneration: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Aside == "" {
		t.Fatal("no directory holds the old log")
	}
	if _, err := RecoverForceNewCluster(RecoverOptions{DataDir: data, ID: 7, DryRun: true}); err == nil {
		t.Fatal("recover accepted an id that is not a member")
	}
	again, err := Start(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("start the recovered data dir: %v", err)
	}
	defer again.Shutdown(context.Background())
	ev := []ledger.Event{{ID: "after", Entity: 1, Signal: "view", Weight: 1, TS: time.Now().UnixMilli()}}
	for {
		a, err := again.node.WriteSignals(ctx, ev)
		if err == nil {
			if a.Index <= s.LastIndex {
				t.Fatalf("a write after recovery landed at index %d, not after the recovered %d", a.Index, s.LastIndex)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the recovered node takes no writes: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
