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

// Mounts lists the faultfs mountpoints of this mount namespace at or
// under root (every one when root is empty), from /proc/self/mountinfo.
func Mounts(root string) ([]string, error) {
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
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options... - fstype source super
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, typ := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(typ) < 1 || typ[0] != FSType {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if root == "" || mp == root || strings.HasPrefix(mp, root+"/") {
			out = append(out, mp)
		}
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

// ReapStale lazily unmounts every faultfs mount at or under root whose
// server is gone ("transport endpoint is not connected": the process that
// served it was killed before it could unmount), and returns their
// mountpoints. Mounts that still answer belong to a live process and are
// left alone. The backing directories keep what was written through the
// dead mount (see README "Limits"); nothing else is touched.
//
// A run store calls it once it holds the store's lock, so that a killed
// run's mounts neither fail the pruning of its run directory nor hang a
// tool walking the store.
func ReapStale(root string) ([]string, error) {
	mounts, err := Mounts(root)
	if err != nil {
		return nil, err
	}
	var reaped []string
	var errs []error
	// Deepest first: a mount under another comes off before its parent.
	for i := len(mounts) - 1; i >= 0; i-- {
		mp := mounts[i]
		var st unix.Stat_t
		if err := unix.Stat(mp, &st); !errors.Is(err, syscall.ENOTCONN) {
			continue
		}
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("faultfs: unmount dead mount %s: %w", mp, err))
			continue
		}
		reaped = append(reaped, mp)
	}
	return reaped, errors.Join(errs...)
}
