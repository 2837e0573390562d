package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

// Issue 12 item 3: what recover --force-new-cluster keeps is exactly the
// survivor's state: its snapshot and its log replayed give the digest the
// node itself had (here a one-node cluster, where everything it logged it
// applied), and the recovered data dir starts as a one-member cluster
// that takes writes.
func TestRecoverForceNewClusterReplaysSnapshotAndLog(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	cfg := Config{ID: 1, ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", DataDir: data,
		TickInterval: 10 * time.Millisecond, ReadyWithin: 1000, SnapshotEvery: 5, SnapshotCatchUp: 2, IDsPerGeneration: 1000}
	srv, err := Start(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < 23; i++ {
		ev := []ledger.Event{{ID: fmt.Sprintf("r-%d", i), Entity: uint64(i % 4), Signal: "view", Weight: 1, TS: time.Now().UnixMilli()}}
		for {
			if _, err := srv.node.WriteSignals(ctx, ev); err == nil {
				break
			} else if ctx.Err() != nil {
				t.Fatalf("write %d: %v", i, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	index, digest := srv.sm.Digest()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}

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
