package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/process"
	"golang.org/x/sys/unix"
)

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// exampleCommands collects the faultfs command lines from the --help
// examples of cmd and its subcommands, split into arguments.
func exampleCommands(cmd *cobra.Command) [][]string {
	var out [][]string
	for line := range strings.Lines(cmd.Example) {
		line = strings.TrimSuffix(strings.TrimSpace(line), " &")
		if !strings.HasPrefix(line, "tidal-chaos faultfs ") {
			continue
		}
		var args []string
		for _, f := range strings.Fields(line)[1:] {
			args = append(args, strings.Trim(f, "'"))
		}
		out = append(out, args)
	}
	for _, c := range cmd.Commands() {
		out = append(out, exampleCommands(c)...)
	}
	return out
}

// TestFaultfsCLI runs `faultfs mount` in the foreground, every example
// from the faultfs --help pages against it, then drives a fault and a power
// cut through the CLI and stops the mount as SIGTERM would.
func TestFaultfsCLI(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("faultfs mounts a FUSE filesystem: needs root and /dev/fuse (CI has both)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("faultfs needs /dev/fuse (CI has it): %v", err)
	}
	dir := t.TempDir()
	backing, mnt := filepath.Join(dir, "disk"), filepath.Join(dir, "node")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	control := "unix:" + filepath.Join(dir, "control.sock")

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	root := newRoot()
	var out process.Output
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"faultfs", "mount", "--backing", backing, "--mountpoint", mnt, "--control", control})
	mounted := make(chan error, 1)
	go func() { mounted <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		stop()
		// A failed test may leave the mount: take it down by path.
		_ = unix.Unmount(mnt, unix.MNT_DETACH)
	})
	client := faultfs.NewClient(control)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := client.Info(context.Background()); err == nil {
			break
		}
		select {
		case err := <-mounted:
			t.Fatalf("faultfs mount exited: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("faultfs mount did not serve its control API\n%s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}

	var faultfsCmd *cobra.Command
	for _, c := range newRoot().Commands() {
		if c.Name() == "faultfs" {
			faultfsCmd = c
		}
	}
	examples := exampleCommands(faultfsCmd)
	if len(examples) < 10 {
		t.Fatalf("found %d faultfs examples in the help pages, expected every command's", len(examples))
	}
	for _, args := range examples {
		if args[1] == "mount" {
			continue // running above, with test paths
		}
		if o, err := runCLI(t, append(args, "--control", control)...); err != nil {
			t.Errorf("help example `tidal-chaos %s`: %v\n%s", strings.Join(args, " "), err, o)
		}
	}
	// The stall's bound and the quota that counts overwrites reach the
	// mount.
	if o, err := runCLI(t, "faultfs", "set", "slow-disk", "--ops", "fsync", "--stall", "--max-stall", "5s", "--control", control); err != nil {
		t.Fatalf("set slow-disk: %v\n%s", err, o)
	}
	if o, err := runCLI(t, "faultfs", "set", "disk-full", "--free", "1KiB", "--count-overwrites", "--control", control); err != nil {
		t.Fatalf("set disk-full: %v\n%s", err, o)
	}
	if f, err := client.Faults(context.Background()); err != nil || len(f.SlowDisk) != 1 || f.SlowDisk[0].MaxStall != 5*time.Second ||
		f.DiskFull == nil || !f.DiskFull.CountOverwrites || f.DiskFull.FreeBytes != 1024 {
		t.Errorf("armed after --max-stall and --count-overwrites: %+v (%v)", f, err)
	}
	if o, err := runCLI(t, "faultfs", "clear", "--control", control); err != nil {
		t.Fatalf("clear: %v\n%s", err, o)
	}

	p := filepath.Join(mnt, "a")
	if err := os.WriteFile(p, []byte("durable"), 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := runCLI(t, "faultfs", "sync", "--control", control); err != nil {
		t.Fatalf("sync: %v\n%s", err, o)
	}
	if o, err := runCLI(t, "faultfs", "set", "fsync-error", "--path", "a", "--control", control); err != nil {
		t.Fatalf("set fsync-error: %v\n%s", err, o)
	}
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Pwrite(fd, []byte("lost"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fsync(fd); err != syscall.EIO {
		t.Errorf("fsync after `set fsync-error`: got %v, want EIO", err)
	}
	if _, err := unix.Pwrite(fd, []byte("LOST"), 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	o, err := runCLI(t, "faultfs", "power-cut", "--control", control)
	if err != nil {
		t.Fatalf("power-cut: %v\n%s", err, o)
	}
	var rep faultfs.PowerCutReport
	if err := json.Unmarshal([]byte(o), &rep); err != nil || rep.BytesDiscarded != 4 {
		t.Errorf("power-cut printed %q (%v), want a report of 4 bytes discarded", o, err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "durable" {
		t.Errorf("after the power cut: %q, %v", b, err)
	}
	o, err = runCLI(t, "faultfs", "stats", "--control", control)
	if err != nil {
		t.Fatalf("stats: %v\n%s", err, o)
	}
	var st faultfs.Stats
	if err := json.Unmarshal([]byte(o), &st); err != nil || st.Faults.FsyncEIO != 1 || st.PowerCuts < 3 {
		t.Errorf("stats printed %q (%v), want 1 fsync EIO and the example cuts plus one", o, err)
	}
	if _, err := runCLI(t, "faultfs", "clear", "no-such-kind", "--control", control); err == nil {
		t.Errorf("clear of an unknown kind succeeded")
	}

	stop()
	select {
	case err := <-mounted:
		if err != nil {
			t.Errorf("faultfs mount after its context ended: %v\n%s", err, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("faultfs mount did not return after its context ended\n%s", out.String())
	}
	if !strings.Contains(out.String(), "unmounted "+mnt) {
		t.Errorf("mount output: %q, want it to say it unmounted", out.String())
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	if strings.Contains(string(mounts), " "+mnt+" ") {
		t.Errorf("%s still mounted after faultfs mount returned", mnt)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "4096": 4096, "64MiB": 64 << 20, "1 KiB": 1024, "2GiB": 2 << 30} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "1.5MiB", "lots"} {
		if _, err := parseBytes(bad); err == nil {
			t.Errorf("parseBytes(%q) succeeded", bad)
		}
	}
}
