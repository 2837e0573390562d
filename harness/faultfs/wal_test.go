package faultfs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/wal"
)

// TestTidalWALAcrossPowerCuts runs tidal's own WAL on faultfs: every entry
// Save acknowledged with sync survives a power cut (torn or not), and the
// same WAL built not to fdatasync (NoSync, what the planted defect
// ack-before-fsync amounts to) loses acknowledged entries — the difference
// kill -9 alone cannot show.
func TestTidalWALAcrossPowerCuts(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	cases := []struct {
		name   string
		noSync bool
		cut    PowerCutOptions
	}{
		{"fdatasync", false, PowerCutOptions{}},
		{"fdatasync, torn writes", false, PowerCutOptions{TornWrites: true, Seed: 3}},
		{"no fdatasync", true, PowerCutOptions{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, _, mnt := mountForTest(t, Options{SkipBackingSync: true})
			dir := filepath.Join(mnt, "wal")
			// wal.Open creates its directory without fsyncing the parent,
			// so under faultfs's strict rules the directory itself would
			// not survive a cut. Create it durably first, as a data dir
			// set up before the node's first start would be.
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			syncPath(t, mnt)
			// Small segments: the cut also sees segment rollovers (create,
			// rename, directory fsync).
			opts := wal.Options{SegmentSize: 4 << 10, NoSync: c.noSync, Logger: quiet}
			w, _, err := wal.Open(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			const acked, unacked = 200, 50
			ctx := context.Background()
			save := func(i uint64, sync bool) {
				data := fmt.Appendf(nil, "entry %d", i)
				if err := w.Save(ctx, wal.Batch{Entries: []wal.Entry{{Index: i, Term: 1, Data: data}}}, sync); err != nil {
					t.Fatalf("save %d: %v", i, err)
				}
			}
			for i := uint64(1); i <= acked; i++ {
				save(i, true)
			}
			for i := uint64(acked + 1); i <= acked+unacked; i++ {
				save(i, false) // written, never synced
			}
			// The process dies with the machine: cut, then let the old
			// WAL's goroutines fail on the dead mount.
			if _, err := f.PowerCut(c.cut); err != nil {
				t.Fatal(err)
			}
			_ = w.Close()

			w, rec, err := wal.Open(dir, opts)
			if err != nil {
				t.Fatalf("reopen after the power cut: %v", err)
			}
			defer w.Close()
			for i, e := range rec.Entries {
				if e.Index != uint64(i+1) || string(e.Data) != fmt.Sprintf("entry %d", i+1) {
					t.Fatalf("recovered entry %d is %d %q: the log must be a prefix of what was saved", i, e.Index, e.Data)
				}
			}
			got := len(rec.Entries)
			t.Logf("%d entries survived; torn tail %+v", got, rec.TornTail)
			switch {
			case c.noSync && got >= acked:
				t.Errorf("without fdatasync %d entries survived the cut, all %d acknowledged ones: faultfs lost nothing", got, acked)
			case !c.noSync && got < acked:
				t.Errorf("with fdatasync only %d of %d acknowledged entries survived the cut", got, acked)
			case !c.noSync && !c.cut.TornWrites && got == acked+unacked:
				// A rollover fdatasyncs the segment it leaves, so some
				// unsynced saves may be durable, but never the last ones.
				t.Errorf("all %d entries survived, the last %d never synced", got, unacked)
			}
		})
	}
}

// TestTidalWALAfterOutOfOrderPowerCuts cuts power under tidal's WAL with
// out-of-order write-back: a seeded half of the unsynced pages persists,
// not a prefix. What docs/ARCHITECTURE.md promises must still hold: the
// WAL either refuses to open, naming file and offset (a hole before data
// that survived can look like corruption, not a torn tail), or recovers a
// prefix of what was saved that holds every synced entry — never a log
// silently missing a synced record.
func TestTidalWALAfterOutOfOrderPowerCuts(t *testing.T) {
	quiet := slog.New(slog.DiscardHandler)
	refused, recovered, kept := 0, 0, 0
	for seed := int64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			f, _, mnt := mountForTest(t, Options{SkipBackingSync: true})
			dir := filepath.Join(mnt, "wal")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			syncPath(t, mnt)
			// Entries of ~1.5 KiB in 64 KiB segments: the unsynced tail
			// spans several pages of one segment.
			opts := wal.Options{SegmentSize: 64 << 10, Logger: quiet}
			w, _, err := wal.Open(dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			const acked, unacked = 30, 12
			ctx := context.Background()
			data := func(i uint64) []byte {
				b := fmt.Appendf(nil, "entry %d ", i)
				for len(b) < 1500 {
					b = append(b, byte('a'+i%26))
				}
				return b
			}
			save := func(i uint64, sync bool) {
				if err := w.Save(ctx, wal.Batch{Entries: []wal.Entry{{Index: i, Term: 1, Data: data(i)}}}, sync); err != nil {
					t.Fatalf("save %d: %v", i, err)
				}
			}
			for i := uint64(1); i <= acked; i++ {
				save(i, true)
			}
			for i := uint64(acked + 1); i <= acked+unacked; i++ {
				save(i, false)
			}
			rep, err := f.PowerCut(PowerCutOptions{OutOfOrder: true, Seed: seed})
			if err != nil {
				t.Fatal(err)
			}
			_ = w.Close()
			if !rep.OutOfOrder || rep.PagesKept+rep.PagesDropped == 0 {
				t.Fatalf("expected an out-of-order cut over dirty pages, found %+v", rep)
			}
			kept += rep.PagesKept

			w, rec, err := wal.Open(dir, opts)
			if err != nil {
				var ce *wal.CorruptionError
				if !errors.As(err, &ce) || ce.File == "" || !strings.Contains(err.Error(), "at offset") {
					t.Fatalf("reopen after an out-of-order cut: expected a refusal naming file and offset, found %v", err)
				}
				t.Logf("refused (pages kept %d, dropped %d): %v", rep.PagesKept, rep.PagesDropped, err)
				refused++
				return
			}
			defer w.Close()
			recovered++
			for i, e := range rec.Entries {
				if e.Index != uint64(i+1) || string(e.Data) != string(data(uint64(i+1))) {
					t.Fatalf("recovered entry %d is %d %.20q: the log must be a prefix of what was saved", i, e.Index, e.Data)
				}
			}
			if got := len(rec.Entries); got < acked {
				t.Fatalf("after an out-of-order cut (pages kept %d, dropped %d) only %d of %d synced entries were recovered, and Open did not refuse",
					rep.PagesKept, rep.PagesDropped, got, acked)
			}
			t.Logf("recovered %d entries (pages kept %d, dropped %d); torn tail %+v", len(rec.Entries), rep.PagesKept, rep.PagesDropped, rec.TornTail)
		})
	}
	t.Logf("%d refused to open, %d recovered; %d pages kept in all", refused, recovered, kept)
	if kept == 0 {
		t.Fatal("no out-of-order cut kept a page: the option tested nothing")
	}
}
