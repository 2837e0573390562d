package wal

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// faultFS is the real file system with switches: a write or sync can be
// made to fail, and a sync can be held at a gate until the test opens it.
type faultFS struct {
	osFS
	writes, syncs atomic.Int64
	failWrite     atomic.Pointer[error]
	failSync      atomic.Pointer[error]

	mu       sync.Mutex
	entered  chan struct{} // receives once per Datasync that reached the gate
	release  chan struct{} // closed (or sent to) to let gated syncs go on
	gateOpen bool
}

func (fs *faultFS) CreateExclusive(path string) (segmentFile, error) {
	f, err := fs.osFS.CreateExclusive(path)
	if err != nil {
		return nil, err
	}
	return &faultFile{segmentFile: f, fs: fs}, nil
}

func (fs *faultFS) OpenWrite(path string) (segmentFile, error) {
	f, err := fs.osFS.OpenWrite(path)
	if err != nil {
		return nil, err
	}
	return &faultFile{segmentFile: f, fs: fs}, nil
}

// gate makes every later Datasync announce itself on entered and wait for
// release.
func (fs *faultFS) gate() (entered chan struct{}, release chan struct{}) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.entered, fs.release = make(chan struct{}, 16), make(chan struct{})
	return fs.entered, fs.release
}

type faultFile struct {
	segmentFile
	fs *faultFS
}

func (f *faultFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.writes.Add(1)
	if err := f.fs.failWrite.Load(); err != nil {
		return 0, *err
	}
	return f.segmentFile.WriteAt(p, off)
}

func (f *faultFile) Datasync() error {
	f.fs.mu.Lock()
	entered, release := f.fs.entered, f.fs.release
	f.fs.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
		<-release
	}
	f.fs.syncs.Add(1)
	if err := f.fs.failSync.Load(); err != nil {
		return *err
	}
	return f.segmentFile.Datasync()
}

func openFault(t *testing.T, dir string, opts Options) (*WAL, *faultFS) {
	t.Helper()
	fs := &faultFS{}
	w, _, err := open(dir, opts, fs)
	if err != nil {
		t.Fatal(err)
	}
	return w, fs
}

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func histogramCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestGroupCommitSharesOneSync holds the first fdatasync at a gate, stages
// ten more batches behind it, and checks that their waiters are not
// released before their sync and that all ten share one write and one sync.
func TestGroupCommitSharesOneSync(t *testing.T) {
	opts := testOptions()
	opts.Metrics = NewMetrics(prometheus.NewRegistry())
	w, fs := openFault(t, t.TempDir(), opts)
	defer mustClose(t, w)
	entered, release := fs.gate()

	first, err := w.Stage(Batch{Entries: entries(1, 1, 1)}, true)
	if err != nil {
		t.Fatal(err)
	}
	<-entered // the writer is inside the first fdatasync
	var rest []*Pending
	for i := uint64(2); i <= 11; i++ {
		p, err := w.Stage(Batch{Entries: entries(i, i, 1)}, true)
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	err = first.Wait(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait while the fdatasync is held: expected DeadlineExceeded, got %v", err)
	}
	close(release)
	for _, p := range append([]*Pending{first}, rest...) {
		if err := p.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	st := w.Stats()
	if st.Writes != 2 || st.Fsyncs != 2 || st.Batches != 11 {
		t.Fatalf("expected 11 batches in 2 writes and 2 fsyncs, got %+v", st)
	}
	if got := histogramCount(t, opts.Metrics.FsyncDuration); got != 2 {
		t.Fatalf("fsync histogram: expected 2 samples, got %d", got)
	}
	if got := histogramCount(t, opts.Metrics.GroupBatches); got != 2 {
		t.Fatalf("group batches histogram: expected 2 samples, got %d", got)
	}
}

func TestFailedSyncFences(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	opts.Metrics = NewMetrics(nil)
	w, fs := openFault(t, dir, opts)
	ctx := context.Background()
	mustSave(t, w, Batch{Entries: entries(1, 5, 1), HardState: &HardState{Term: 1, Commit: 5}})

	// The failing sync is held at the gate while two more batches queue
	// behind it: they must fail too, unwritten.
	entered, release := fs.gate()
	eio := error(syscall.EIO)
	fs.failSync.Store(&eio)
	doomed, err := w.Stage(Batch{Entries: entries(6, 6, 1)}, true)
	if err != nil {
		t.Fatal(err)
	}
	<-entered
	writesAtSync := fs.writes.Load()
	var queued []*Pending
	for i := uint64(7); i <= 8; i++ {
		p, err := w.Stage(Batch{Entries: entries(i, i, 1)}, true)
		if err != nil {
			t.Fatal(err)
		}
		queued = append(queued, p)
	}
	close(release)

	err = doomed.Wait(ctx)
	if !errors.Is(err, ErrFenced) || !errors.Is(err, syscall.EIO) {
		t.Fatalf("Save whose fdatasync failed: expected an error wrapping ErrFenced and EIO, got %v", err)
	}
	for _, p := range queued {
		if err := p.Wait(ctx); !errors.Is(err, ErrFenced) {
			t.Fatalf("Save queued behind the failed sync: expected ErrFenced, got %v", err)
		}
	}
	stats := w.Stats()
	if err := w.Save(ctx, Batch{Entries: entries(6, 6, 1)}, true); !errors.Is(err, ErrFenced) {
		t.Fatalf("Save after fencing: expected ErrFenced, got %v", err)
	}
	if err := w.Save(ctx, Batch{HardState: &HardState{Term: 2}}, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("unsynced Save after fencing: expected ErrFenced, got %v", err)
	}
	if got := fs.writes.Load(); got != writesAtSync {
		t.Fatalf("expected no write after the failed sync, writes went from %d to %d", writesAtSync, got)
	}
	if got := w.Stats(); got != stats {
		t.Fatalf("stats moved after fencing: %+v -> %+v", stats, got)
	}
	if got := gaugeValue(t, opts.Metrics.Fenced); got != 1 {
		t.Fatalf("tidal_wal_fenced: expected 1, got %v", got)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	// What was acknowledged is on disk; the failed batch may or may not
	// be, and nothing behind it is.
	rec := reopen(t, dir, testOptions())
	if n := len(rec.Entries); n != 5 && n != 6 {
		t.Fatalf("expected entries 1..5 (and maybe the failed 6), recovered %s", span(rec.Entries))
	}
	equalEntries(t, "acknowledged prefix", rec.Entries[:5], entries(1, 5, 1))
}

func TestFailedWriteFences(t *testing.T) {
	dir := t.TempDir()
	w, fs := openFault(t, dir, testOptions())
	ctx := context.Background()
	mustSave(t, w, Batch{Entries: entries(1, 2, 1)})
	enospc := error(syscall.ENOSPC)
	fs.failWrite.Store(&enospc)
	err := w.Save(ctx, Batch{Entries: entries(3, 3, 1)}, true)
	if !errors.Is(err, ErrFenced) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save whose write failed: expected ErrFenced wrapping ENOSPC, got %v", err)
	}
	syncs := fs.syncs.Load()
	fs.failWrite.Store(nil) // the disk "recovers"; the WAL must not
	if err := w.Save(ctx, Batch{Entries: entries(3, 3, 1)}, true); !errors.Is(err, ErrFenced) {
		t.Fatalf("Save after fencing: expected ErrFenced, got %v", err)
	}
	if got := fs.syncs.Load(); got != syncs {
		t.Fatalf("expected no fdatasync after the failed write, syncs went from %d to %d", syncs, got)
	}
	mustClose(t, w)
	equalEntries(t, "after failed write", reopen(t, dir, testOptions()).Entries, entries(1, 2, 1))
}

func TestFailedRolloverFences(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	opts.SegmentSize = 2048
	w, fs := openFault(t, dir, opts)
	ctx := context.Background()
	mustSave(t, w, Batch{Entries: entries(1, 10, 1)})
	eio := error(syscall.EIO)
	fs.failSync.Store(&eio) // the new segment's header sync fails
	if err := w.Save(ctx, Batch{Entries: entries(11, 30, 1)}, true); !errors.Is(err, ErrFenced) {
		t.Fatalf("Save that needed a failing rollover: expected ErrFenced, got %v", err)
	}
	mustClose(t, w)
	equalEntries(t, "after failed rollover", reopen(t, dir, opts).Entries, entries(1, 10, 1))
}

func TestNilMetricsAndUnsyncedSave(t *testing.T) {
	dir := t.TempDir()
	w, fs := openFault(t, dir, testOptions())
	before := fs.syncs.Load()
	if err := w.Save(context.Background(), Batch{HardState: &HardState{Term: 3, Commit: 0}}, false); err != nil {
		t.Fatal(err)
	}
	if got := fs.syncs.Load(); got != before {
		t.Fatalf("Save with sync=false: expected no fdatasync, got %d", got-before)
	}
	// A later synced Save makes the unsynced one durable too.
	mustSave(t, w, Batch{Entries: entries(1, 1, 3)})
	mustClose(t, w)
	if rec := reopen(t, dir, testOptions()); rec.HardState.Term != 3 || len(rec.Entries) != 1 {
		t.Fatalf("expected term 3 and one entry, recovered %+v", rec)
	}
}
