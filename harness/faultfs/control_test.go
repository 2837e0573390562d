package faultfs

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestControlAPI drives a mount through the control endpoint the way the
// CLI does: set, list, clear, stats, power cut.
func TestControlAPI(t *testing.T) {
	f, backing, mnt := mountForTest(t, Options{})
	srv := httptest.NewServer(f.Handler())
	t.Cleanup(srv.Close)
	c := NewClient(srv.URL)
	ctx := context.Background()

	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Backing != backing || info.Mountpoint != mnt {
		t.Errorf("info %+v, want backing %s and mountpoint %s", info, backing, mnt)
	}

	durableFile(t, mnt, "a", "durable")
	armed, err := c.Set(ctx, Faults{
		FsyncError: &FsyncError{Path: "a", Sticky: true},
		SlowDisk:   []SlowDisk{{Ops: []Op{OpRead}, Latency: 1500 * time.Microsecond}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if armed.FsyncError == nil || len(armed.SlowDisk) != 1 || armed.SlowDisk[0].Latency != 1500*time.Microsecond {
		t.Errorf("armed after set: %+v", armed)
	}
	fd := openRW(t, filepath.Join(mnt, "a"))
	if err := unix.Fsync(fd); !isErrno(err, syscall.EIO) {
		t.Errorf("fsync with an fsync error armed over the API: got %v, want EIO", err)
	}
	if armed, err = c.Clear(ctx, KindFsyncError); err != nil {
		t.Fatal(err)
	}
	if armed.FsyncError != nil || len(armed.SlowDisk) != 1 {
		t.Errorf("clearing fsync-error only left %+v", armed)
	}
	if err := unix.Fsync(fd); err != nil {
		t.Errorf("fsync after clear: %v", err)
	}
	if armed, err = c.Clear(ctx); err != nil || len(armed.SlowDisk) != 0 {
		t.Errorf("clear all: %+v, %v", armed, err)
	}

	if _, err := unix.Pwrite(fd, []byte("unsynced"), 0); err != nil {
		t.Fatal(err)
	}
	rep, err := c.PowerCut(ctx, PowerCutOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Files != 1 || rep.BytesDiscarded != 8 {
		t.Errorf("power cut report over the API: %+v, want 1 file and 8 bytes", rep)
	}
	if got := readFile(t, filepath.Join(mnt, "a")); got != "durable" {
		t.Errorf("after the power cut over the API: %q", got)
	}
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.PowerCuts != 1 || st.Faults.FsyncEIO != 1 || st.Ops["fsync"] == 0 {
		t.Errorf("stats over the API: %d cuts, %d fsync EIOs, %d fsyncs", st.PowerCuts, st.Faults.FsyncEIO, st.Ops["fsync"])
	}
	if err := c.Sync(ctx); err != nil {
		t.Errorf("sync over the API: %v", err)
	}
}

// TestControlAPIRejectsBadInput: the API names the field at fault.
func TestControlAPIRejectsBadInput(t *testing.T) {
	f, _, _ := mountForTest(t, Options{})
	srv := httptest.NewServer(f.Handler())
	t.Cleanup(srv.Close)
	c := NewClient(srv.URL)
	ctx := context.Background()
	var apiErr *Error
	if _, err := c.Set(ctx, Faults{FsyncError: &FsyncError{Path: "[bad"}}); !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Field != "fsync_error.path" {
		t.Errorf("bad glob: got %v, want 400 naming fsync_error.path", err)
	}
	if _, err := c.Set(ctx, Faults{SlowDisk: []SlowDisk{{Ops: []Op{"sideways"}, Latency: time.Millisecond}}}); !errors.As(err, &apiErr) || apiErr.Field != "slow_disk[0].ops" {
		t.Errorf("unknown op: got %v, want 400 naming slow_disk[0].ops", err)
	}
	if _, err := c.Clear(ctx, "everything"); !errors.As(err, &apiErr) || apiErr.Field != "kind" {
		t.Errorf("unknown kind: got %v, want 400 naming kind", err)
	}
	resp, err := http.Post(srv.URL+"/faults", "application/json", strings.NewReader(`{"fsync_eror":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("unknown field in a fault body: status %d, want 400", resp.StatusCode)
	}
	if got := f.Faults(); got.FsyncError != nil || got.SlowDisk != nil {
		t.Errorf("rejected requests armed faults: %+v", got)
	}
}

// TestControlOverUnixSocket serves the API on a unix socket, as the CLI's
// --control unix:PATH does.
func TestControlOverUnixSocket(t *testing.T) {
	f, _, _ := mountForTest(t, Options{})
	sock := "unix:" + filepath.Join(t.TempDir(), "faultfs.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: f.Handler()}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	armed, err := NewClient(sock).Set(context.Background(), Faults{DiskFull: &DiskFull{FreeBytes: 5}})
	if err != nil {
		t.Fatal(err)
	}
	if armed.DiskFull == nil || armed.DiskFull.FreeBytes != 5 {
		t.Errorf("armed over the unix socket: %+v", armed)
	}
}

func TestSlowDiskJSONSpellsMilliseconds(t *testing.T) {
	b, err := json.Marshal(SlowDisk{Ops: []Op{OpFsync}, Latency: 2500 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"ops":["fsync"],"latency_ms":2.5}` {
		t.Errorf("SlowDisk JSON: %s", b)
	}
	var s SlowDisk
	if err := json.Unmarshal([]byte(`{"latency_ms":40,"stall":true}`), &s); err != nil {
		t.Fatal(err)
	}
	if s.Latency != 40*time.Millisecond || !s.Stall {
		t.Errorf("decoded %+v", s)
	}
}
