package faultfs

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Options configure a mount.
type Options struct {
	// SkipBackingSync records durability without calling fsync or
	// fdatasync on the backing files: syncs then cost almost nothing, which
	// hides a slow CI disk but also the real cost of syncing. Default off:
	// every fsync reaches the backing disk.
	SkipBackingSync bool
	// AllowOther lets users other than the one running faultfs use the
	// mount (with the kernel checking permissions, default_permissions).
	AllowOther bool
	// Debug logs every FUSE request and reply (go-fuse's debug log) to
	// Logger.
	Debug bool
	// Logger receives go-fuse's messages; nil discards them.
	Logger *log.Logger
}

// FS is a mounted faultfs. Its methods are safe for concurrent use.
type FS struct {
	b          *backing
	mountpoint string
	opts       Options
	faults     *faultSet
	stats      counters

	// cutMu serializes PowerCut, Sync and Unmount.
	cutMu sync.Mutex
	// mu is shared by every operation and taken alone by a power cut,
	// which so waits for operations in flight.
	mu     sync.RWMutex
	gen    atomic.Pointer[generation]
	closed bool
}

// generation is one FUSE connection on the mountpoint with its own durable
// state; a power cut ends one and starts the next. Every operation checks
// that its generation is alive, so handles and inodes from before a cut
// fail instead of touching the rolled-back backing directory.
type generation struct {
	fs     *FS
	track  *tracker
	server *fuse.Server
	isDead atomic.Bool
	dead   chan struct{}
}

func (g *generation) kill() {
	if !g.isDead.Swap(true) {
		close(g.dead)
	}
}

// enter starts an operation: it applies SlowDisk, refuses a cut
// generation with EIO and holds fs.mu shared until done is called.
func (g *generation) enter(op opcode) (done func(), errno syscall.Errno) {
	f := g.fs
	if !g.wait(opcodes[op].class) || g.isDead.Load() {
		f.stats.deadHandle.Add(1)
		return nil, syscall.EIO
	}
	f.mu.RLock()
	if g.isDead.Load() {
		f.mu.RUnlock()
		f.stats.deadHandle.Add(1)
		return nil, syscall.EIO
	}
	f.stats.ops[op].Add(1)
	return f.mu.RUnlock, 0
}

// wait sleeps for the SlowDisk faults that apply to op; false means the
// generation died meanwhile.
func (g *generation) wait(op Op) bool {
	s := g.fs.faults
	if !s.slowArmed.Load() {
		return true
	}
	counted := false
	for {
		latency, stall, maxStall, unstall := s.delay(op)
		if latency == 0 && !stall {
			return true
		}
		if !counted {
			counted = true
			if stall {
				g.fs.stats.stalled.Add(1)
			} else {
				g.fs.stats.delayed.Add(1)
			}
		}
		if stall {
			var bound <-chan time.Time
			if maxStall > 0 {
				t := time.NewTimer(maxStall)
				defer t.Stop()
				bound = t.C
			}
			select {
			case <-unstall:
				continue // the slow faults changed: look again
			case <-bound:
				return !g.isDead.Load() // held for the bound: carry on
			case <-g.dead:
				return false
			}
		}
		t := time.NewTimer(latency)
		select {
		case <-t.C:
			return true
		case <-g.dead:
			t.Stop()
			return false
		}
	}
}

// Mount mounts a faultfs at mountpoint passing through to backing, which
// must be a directory; mountpoint is created if missing and may be backing
// itself (the mount then hides the directory it serves). Everything in
// backing at mount time counts as durable. A dead FUSE mount on mountpoint
// (left by a faultfs whose process died) is unmounted first. Mounting needs
// root or fusermount3 and /dev/fuse.
func Mount(backingDir, mountpoint string, opts Options) (*FS, error) {
	backingDir, err := filepath.Abs(backingDir)
	if err != nil {
		return nil, err
	}
	if mountpoint, err = filepath.Abs(mountpoint); err != nil {
		return nil, err
	}
	if st, err := os.Stat(backingDir); err != nil {
		return nil, fmt.Errorf("faultfs: backing directory: %w", err)
	} else if !st.IsDir() {
		return nil, fmt.Errorf("faultfs: backing %s: expected a directory, found mode %s", backingDir, st.Mode())
	}
	if _, err := os.Stat(mountpoint); errors.Is(err, syscall.ENOTCONN) {
		// A FUSE mount whose server died (a crashed harness): take it
		// down, its backing directory is intact.
		if err := unix.Unmount(mountpoint, unix.MNT_DETACH); err != nil {
			return nil, fmt.Errorf("faultfs: mountpoint %s is a dead FUSE mount and unmounting it failed: %w", mountpoint, err)
		}
	}
	if err := os.MkdirAll(mountpoint, 0o755); err != nil {
		return nil, fmt.Errorf("faultfs: mountpoint: %w", err)
	}
	b, err := openBacking(backingDir)
	if err != nil {
		return nil, err
	}
	if err := resetStateDir(b); err != nil {
		b.close()
		return nil, err
	}
	f := &FS{b: b, mountpoint: mountpoint, opts: opts, faults: newFaultSet()}
	g, err := f.mountGeneration()
	if err != nil {
		os.RemoveAll(b.stateDirPath())
		b.close()
		return nil, err
	}
	f.gen.Store(g)
	return f, nil
}

// resetStateDir empties the state directory: what a faultfs that died
// left there is of no use, the backing directory is the durable state now.
func resetStateDir(b *backing) error {
	if err := os.RemoveAll(b.stateDirPath()); err != nil {
		return fmt.Errorf("faultfs: clear state directory in %s: %w", b.dir, err)
	}
	if err := os.MkdirAll(b.stateDirPath("graves"), 0o700); err != nil {
		return fmt.Errorf("faultfs: create state directory in %s: %w", b.dir, err)
	}
	return nil
}

func (f *FS) mountGeneration() (*generation, error) {
	g := &generation{fs: f, track: newTracker(f.b), dead: make(chan struct{})}
	var st unix.Stat_t
	if err := unix.Fstat(f.b.fd, &st); err != nil {
		return nil, err
	}
	entry, attr, negative := time.Second, time.Duration(0), time.Duration(0)
	logger := f.opts.Logger
	if logger == nil {
		logger = log.New(discard{}, "", 0)
	}
	mo := fuse.MountOptions{
		// The source names the serving process, so that a later run can
		// tell a mount whose server died without touching it (see
		// ReapStale: touching one can hang).
		FsName:        ownerSource(f.b.dir),
		Name:          "faultfs",
		DirectMount:   true,
		MaxWrite:      1 << 20,
		DisableXAttrs: true,
		// Shared mmap of a direct-I/O file (Linux 6.6+; older kernels
		// refuse the mmap with ENODEV): bbolt, etcd's backend, maps its
		// db file to read it and writes it with pwrite. The kernel drops
		// the mapped pages a direct write covers, so a map never shows
		// bytes older than the file's; reads through a map are served
		// from the page cache once faulted in, so read faults reach them
		// only on the first fault of each page.
		ExtraCapabilities: fuse.CAP_DIRECT_IO_ALLOW_MMAP,
		AllowOther:        f.opts.AllowOther,
		Debug:             f.opts.Debug,
		Logger:            logger,
	}
	if f.opts.AllowOther {
		mo.Options = append(mo.Options, "default_permissions")
	}
	// go-fuse v2.12.1 opens /dev/fuse without O_CLOEXEC and, on the
	// direct-mount path, never sets it afterwards: every process this
	// one starts later (the cluster's nodes) inherited the FUSE
	// connection of every mount. When the harness died, the nodes kept
	// the connections open, so they were never aborted; the nodes,
	// killed while waiting on a request, could not exit, and whatever
	// touched a mount hung. So: direct mounts only, with fork held off
	// (syscall.ForkLock, as the standard library does between creating
	// a descriptor and marking it) until the descriptor is marked
	// close-on-exec. Without root, fusermount mounts, and go-fuse marks
	// that descriptor itself.
	strict := os.Geteuid() == 0
	mo.DirectMountStrict = strict
	if strict {
		syscall.ForkLock.RLock()
	}
	server, err := fs.Mount(f.mountpoint, &node{gen: g}, &fs.Options{
		MountOptions: mo,
		// Entries change only through the kernel or at a power cut, which
		// remounts. Attributes are never cached: a failed fsync shrinks
		// files behind the kernel's back.
		EntryTimeout:    &entry,
		AttrTimeout:     &attr,
		NegativeTimeout: &negative,
		RootStableAttr:  &fs.StableAttr{Ino: st.Ino, Mode: syscall.S_IFDIR},
		Logger:          logger,
	})
	if strict {
		closeFUSEOnExec()
		syscall.ForkLock.RUnlock()
	}
	if err != nil {
		return nil, fmt.Errorf("faultfs: mount %s on %s: %w (needs root or fusermount3, and /dev/fuse)", f.b.dir, f.mountpoint, err)
	}
	g.server = server
	return g, nil
}

// closeFUSEOnExec marks every /dev/fuse descriptor of this process
// close-on-exec (see mountGeneration).
func closeFUSEOnExec() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == "/dev/fuse" {
			unix.CloseOnExec(fd)
		}
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Mountpoint is where the filesystem is mounted.
func (f *FS) Mountpoint() string { return f.mountpoint }

// Backing is the backing directory.
func (f *FS) Backing() string { return f.b.dir }

// Unmount unmounts the filesystem as a clean shutdown: what the backing
// directory holds stays (a real kernel would write it back), and the state
// directory goes. If a process still holds a file open, the mount is
// detached lazily and its operations fail with EIO. Unmount twice is a
// no-op.
func (f *FS) Unmount() error {
	f.cutMu.Lock()
	defer f.cutMu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	g := f.gen.Load()
	g.kill()
	// Wait for operations in flight; later ones fail at once, so the
	// kernel's unmount never waits on faultfs.
	f.mu.Lock()
	f.mu.Unlock()
	var errs []error
	if err := g.server.Unmount(); err != nil {
		if derr := unix.Unmount(f.mountpoint, unix.MNT_DETACH); derr != nil {
			errs = append(errs, fmt.Errorf("faultfs: unmount %s: %w; lazy unmount: %w", f.mountpoint, err, derr))
		}
	}
	if err := os.RemoveAll(f.b.stateDirPath()); err != nil {
		errs = append(errs, fmt.Errorf("faultfs: remove state directory: %w", err))
	}
	if err := f.b.close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Set arms the kinds of fault present in faults, replacing any of the same
// kind; the others stay.
func (f *FS) Set(faults Faults) error {
	if err := faults.Validate(); err != nil {
		return err
	}
	f.faults.set(faults)
	return nil
}

// Clear disarms the given kinds of fault, every kind when none is given.
// Stalled operations resume.
func (f *FS) Clear(kinds ...Kind) { f.faults.clear(kinds) }

// Faults returns the armed faults; DiskFull shows the space left.
func (f *FS) Faults() Faults { return f.faults.current() }

// Stats returns the counters since Mount and what is unsynced now.
func (f *FS) Stats() Stats {
	s := f.stats.snapshot()
	s.Unsynced = f.gen.Load().track.unsynced()
	return s
}

// Sync makes everything durable, as syncfs(2) would on a kernel
// filesystem (FUSE never sees syncfs).
func (f *FS) Sync() error {
	f.cutMu.Lock()
	defer f.cutMu.Unlock()
	if f.closed {
		return errors.New("faultfs: sync: unmounted")
	}
	return f.gen.Load().track.syncAll()
}

// PowerCutOptions shape a power cut.
type PowerCutOptions struct {
	// TornWrites keeps, per file, a random prefix of its unsynced changes
	// (the last kept write possibly cut at a 512-byte sector boundary)
	// instead of none.
	TornWrites bool `json:"torn_writes,omitempty"`
	// OutOfOrder keeps, per file, a seeded subset of the 4 KiB pages its
	// unsynced writes touched, in any order, as a disk's write-back does:
	// a later page can persist while an earlier one does not, leaving a
	// hole of durable (often zero) bytes before data that survived. Each
	// dirty page keeps its newest content or its durable one; the file's
	// size is the durable size, grown to cover a kept page past it.
	// Supersedes TornWrites. Synced content is never touched.
	OutOfOrder bool `json:"out_of_order,omitempty"`
	// Seed drives TornWrites and OutOfOrder; 0 picks one from the clock
	// (the report gives it).
	Seed int64 `json:"seed,omitempty"`
}

// PowerCut loses everything not durable, as if the machine lost power and
// rebooted: it detaches the mount (handles opened before fail with EIO),
// rolls the backing directory back to its durable state and mounts a fresh
// connection on the same mountpoint. Kill the processes using the mount
// first. Armed faults stay armed. On error the mount is still replaced,
// but the backing directory may be only partly rolled back.
func (f *FS) PowerCut(o PowerCutOptions) (PowerCutReport, error) {
	f.cutMu.Lock()
	defer f.cutMu.Unlock()
	if f.closed {
		return PowerCutReport{}, errors.New("faultfs: power cut: unmounted")
	}
	start := time.Now()
	if (o.TornWrites || o.OutOfOrder) && o.Seed == 0 {
		o.Seed = start.UnixNano()
	}
	old := f.gen.Load()
	old.kill()
	f.mu.Lock()
	var errs []error
	if err := unix.Unmount(f.mountpoint, unix.MNT_DETACH); err != nil {
		errs = append(errs, fmt.Errorf("faultfs: power cut: detach %s: %w", f.mountpoint, err))
	}
	rep, err := rollback(f.b, old.track, o)
	if err != nil {
		// Leave the state directory as it is: it may hold the only copy
		// of what the rollback was moving.
		errs = append(errs, fmt.Errorf("faultfs: power cut: roll back %s (see %s): %w", f.b.dir, StateDirName, err))
		if err := os.MkdirAll(f.b.stateDirPath("graves"), 0o700); err != nil {
			errs = append(errs, err)
		}
	} else if err := resetStateDir(f.b); err != nil {
		errs = append(errs, err)
	}
	f.mu.Unlock()
	g, err := f.mountGeneration()
	if err != nil {
		// Nothing is mounted now: this FS is done.
		f.closed = true
		errs = append(errs, err, os.RemoveAll(f.b.stateDirPath()), f.b.close())
	} else {
		f.gen.Store(g)
	}
	rep.At, rep.Duration = start, time.Since(start)
	f.stats.powerCut(rep)
	return rep, errors.Join(errs...)
}
