package faultfs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// FSType is how /proc/self/mountinfo names a faultfs mount.
const FSType = "fuse.faultfs"

// Available says why this process cannot mount faultfs, or nil if it can:
// it needs /dev/fuse, openable, and root or fusermount3 on PATH. The
// harness asks before it schedules a disk fault, so that a machine
// without FUSE refuses the run at once instead of failing every fault.
func Available() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return errors.New("/dev/fuse not found (load the fuse module, or give the container --device /dev/fuse)")
	}
	if err != nil {
		return fmt.Errorf("/dev/fuse: %w", err)
	}
	f.Close()
	if os.Geteuid() == 0 {
		return nil
	}
	if _, err := exec.LookPath("fusermount3"); err != nil {
		if _, err2 := exec.LookPath("fusermount"); err2 != nil {
			return errors.New("not root and no fusermount3 or fusermount on PATH")
		}
	}
	return nil
}

// A mount's source (what mountinfo shows before the options) names the
// process serving it: "faultfs[<pid>.<start>]:<backing dir>", start being
// the process's start time in clock ticks (/proc/<pid>/stat field 22),
// so a pid reused by another process does not pass for the server.
const sourcePrefix = "faultfs["

func ownerSource(dir string) string {
	start, err := procStart(os.Getpid())
	if err != nil {
		return dir
	}
	return fmt.Sprintf("%s%d.%d]:%s", sourcePrefix, os.Getpid(), start, dir)
}

// procStart is the start time of process pid in clock ticks since boot.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses: fields count
	// from after its last ')'. starttime is field 22, the 20th after it.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no ')' in %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: expected at least 22 fields, found %d", pid, len(f)+2)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// MountInfo is a faultfs mount as /proc/self/mountinfo lists it.
type MountInfo struct {
	Mountpoint string
	// Conn is the FUSE connection's number (the device minor), which
	// names it under /sys/fs/fuse/connections.
	Conn int
	// PID and Start name the serving process; 0 when the source does
	// not (a mount by an older faultfs).
	PID   int
	Start uint64
}

// ServerAlive reports whether the process that serves m still runs; ok is
// false when m does not say who serves it.
func (m MountInfo) ServerAlive() (alive, ok bool) {
	if m.PID == 0 {
		return false, false
	}
	start, err := procStart(m.PID)
	return err == nil && start == m.Start, true
}

// Mounts lists the faultfs mounts of this mount namespace at or under
// root (every one when root is empty), from /proc/self/mountinfo.
func Mounts(root string) ([]string, error) {
	ms, err := mountInfos(root)
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Mountpoint
	}
	return out, err
}

func mountInfos(root string) ([]MountInfo, error) {
	if root != "" {
		abs, err := filepath.Abs(root)
		if err != nil {
			return nil, err
		}
		root = filepath.Clean(abs)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("faultfs: list mounts: %w", err)
	}
	defer f.Close()
	var out []MountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options... - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, typ := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(typ) < 2 || typ[0] != FSType {
			continue
		}
		m := MountInfo{Mountpoint: unescapeMountinfo(fields[4])}
		if root != "" && m.Mountpoint != root && !strings.HasPrefix(m.Mountpoint, root+"/") {
			continue
		}
		if _, minor, ok := strings.Cut(fields[2], ":"); ok {
			m.Conn, _ = strconv.Atoi(minor)
		}
		if src, ok := strings.CutPrefix(unescapeMountinfo(typ[1]), sourcePrefix); ok {
			if owner, _, ok := strings.Cut(src, "]"); ok {
				pid, start, _ := strings.Cut(owner, ".")
				m.PID, _ = strconv.Atoi(pid)
				m.Start, _ = strconv.ParseUint(start, 10, 64)
			}
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// fusectl is where the kernel's FUSE control filesystem is mounted.
const fusectl = "/sys/fs/fuse/connections"

// ReapStale takes down every faultfs mount at or under root whose server
// is gone, and returns their mountpoints; mounts of a live process are
// left alone. A harness killed -9 leaves its mounts behind, and they need
// not answer "transport endpoint is not connected": seen here, the kernel
// kept the connection open with requests waiting, and anything that
// touched the mount (a stat, a glob, removing the run directory) hung in
// uninterruptible sleep. So ReapStale never touches a mount it judges:
// the source names the serving process (pid and start time); a dead
// server's connection is aborted through fusectl (mounted on
// /sys/fs/fuse/connections if it is not), which fails every waiting
// request, and the mount is detached. A mount that does not name its
// server (an older faultfs) is judged by a stat bounded to a second:
// ENOTCONN or no answer means dead.
//
// A run store calls it once it holds the store's lock, so that a killed
// run's mounts neither wedge the next run nor fail pruning.
func ReapStale(root string) ([]string, error) {
	mounts, err := mountInfos(root)
	if err != nil {
		return nil, err
	}
	var reaped []string
	var errs []error
	// Deepest first: a mount under another comes off before its parent.
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if alive, known := m.ServerAlive(); alive || !known && !unresponsive(m.Mountpoint) {
			continue
		}
		if err := abortConn(m.Conn); err != nil {
			errs = append(errs, fmt.Errorf("faultfs: dead mount %s: %w (processes using it may stay blocked)", m.Mountpoint, err))
		}
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("faultfs: unmount dead mount %s: %w", m.Mountpoint, err))
			continue
		}
		reaped = append(reaped, m.Mountpoint)
	}
	return reaped, errors.Join(errs...)
}

// unresponsive stats mp with a bound: ENOTCONN, or no answer within a
// second (the goroutine stays blocked until the connection is aborted).
func unresponsive(mp string) bool {
	done := make(chan error, 1)
	go func() {
		var st unix.Stat_t
		done <- unix.Stat(mp, &st)
	}()
	select {
	case err := <-done:
		return errors.Is(err, syscall.ENOTCONN)
	case <-time.After(time.Second):
		return true
	}
}

// abortConn aborts FUSE connection conn, mounting fusectl first if need
// be; a connection already gone is not an error.
func abortConn(conn int) error {
	if conn <= 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(fusectl, strconv.Itoa(conn))); errors.Is(err, os.ErrNotExist) {
		if entries, _ := os.ReadDir(fusectl); len(entries) == 0 {
			if err := unix.Mount("fusectl", fusectl, "fusectl", 0, ""); err != nil && !errors.Is(err, syscall.EBUSY) {
				return fmt.Errorf("mount fusectl on %s to abort connection %d: %w", fusectl, conn, err)
			}
		}
	}
	err := os.WriteFile(filepath.Join(fusectl, strconv.Itoa(conn), "abort"), []byte("1"), 0o200)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
