package faultfs

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Faults is a set of faults, one or more kinds at once. FS.Set replaces
// the kinds present (non-nil) and leaves the others alone; FS.Clear removes
// kinds. It is also the JSON body of the control endpoint's /faults.
type Faults struct {
	FsyncError  *FsyncError   `json:"fsync_error,omitempty"`
	DiskFull    *DiskFull     `json:"disk_full,omitempty"`
	SlowDisk    []SlowDisk    `json:"slow_disk,omitempty"`
	CorruptRead []CorruptRead `json:"corrupt_read,omitempty"`
}

// Kind names a fault kind for FS.Clear and the CLI.
type Kind string

const (
	KindFsyncError  Kind = "fsync-error"
	KindDiskFull    Kind = "disk-full"
	KindSlowDisk    Kind = "slow-disk"
	KindCorruptRead Kind = "corrupt-read"
)

// Kinds lists every fault kind.
var Kinds = []Kind{KindFsyncError, KindDiskFull, KindSlowDisk, KindCorruptRead}

// ParseKind accepts a kind name as the CLI and control endpoint spell it.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("fault kind %q: expected one of %v", s, Kinds)
}

// FsyncError makes fsync and fdatasync fail with EIO. The call that fails
// drops the file's unsynced changes (see the package comment: Linux's
// lost write-back); other descriptors open on the file then see EIO once.
type FsyncError struct {
	// Path is a glob (path.Match) over the file's path in the mount when
	// it was opened, e.g. "wal/*.wal"; a pattern without "/" matches the
	// base name at any depth. Empty matches every file. A file with
	// several hard links is known by one of its names only (FUSE does not
	// say which name a program opened).
	Path string `json:"path,omitempty"`
	// After lets this many matching fsyncs succeed first (counted from
	// when the fault is set).
	After int `json:"after,omitempty"`
	// Sticky fails every matching fsync from then on, as a dying disk
	// does; otherwise exactly one fsync fails and the fault is spent.
	Sticky bool `json:"sticky,omitempty"`
	// Dirs also fails fsync of matching directories (nothing in them
	// becomes durable; their entries are not rolled back).
	Dirs bool `json:"dirs,omitempty"`
}

// DiskFull gives the disk FreeBytes of space from now: writes and
// fallocate that grow files consume it, truncates and removing a file's
// last name give it back. A write that does not fit is cut short to what
// fits (the program sees a short write, then ENOSPC); with nothing left,
// growing writes, fallocate and creating any entry fail with ENOSPC.
// Overwrites inside a file's size (its preallocated space) still succeed,
// unless CountOverwrites is set.
type DiskFull struct {
	FreeBytes int64 `json:"free_bytes"`
	// CountOverwrites charges every byte written against FreeBytes,
	// overwrites inside a file's size included, as on a copy-on-write
	// filesystem (btrfs, ZFS) where preallocated space does not hold the
	// next write: a program that writes into space it preallocated (a WAL
	// segment) meets ENOSPC after FreeBytes more bytes, not only when it
	// grows a file. Fallocate and creates count as without it.
	CountOverwrites bool `json:"count_overwrites,omitempty"`
}

// Op is an operation class a SlowDisk fault delays.
type Op string

const (
	OpRead     Op = "read"
	OpWrite    Op = "write"
	OpFsync    Op = "fsync" // fsync, fdatasync and directory fsync
	OpCreate   Op = "create"
	OpRemove   Op = "remove"   // unlink, rmdir
	OpRename   Op = "rename"   // rename, link
	OpOpen     Op = "open"     // open, release
	OpTruncate Op = "truncate" // truncate, fallocate
	OpMetadata Op = "metadata" // lookup, getattr, setattr, readdir, statfs, xattrs
)

// Ops lists every operation class.
var Ops = []Op{OpRead, OpWrite, OpFsync, OpCreate, OpRemove, OpRename, OpOpen, OpTruncate, OpMetadata}

// ParseOp accepts an operation class name.
func ParseOp(s string) (Op, error) {
	for _, o := range Ops {
		if string(o) == s {
			return o, nil
		}
	}
	return "", fmt.Errorf("operation %q: expected one of %v", s, Ops)
}

// SlowDisk delays operations of the given classes (all when Ops is empty)
// by Latency, or holds them until the fault is cleared when Stall is set
// (or for at most MaxStall, when it is non-zero). Clearing or replacing
// the slow-disk faults releases every stalled operation at once, and they
// carry on; a power cut or unmount releases them too, and they fail.
type SlowDisk struct {
	Ops      []Op          `json:"ops,omitempty"`
	Latency  time.Duration `json:"latency,omitempty"`
	Stall    bool          `json:"stall,omitempty"`
	MaxStall time.Duration `json:"max_stall,omitempty"`
}

// CorruptRead flips bits in what reads of matching files return over
// [Offset, Offset+Length) (to the end of the file when Length is 0). The
// backing bytes are untouched: clearing the fault makes reads good again.
type CorruptRead struct {
	// Path is a glob, as for FsyncError; empty matches every file.
	Path   string `json:"path,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	Length int64  `json:"length,omitempty"`
	// Mask is XORed into every byte of the range; 0 means 0x01, one
	// flipped bit per byte.
	Mask byte `json:"mask,omitempty"`
}

// FieldError says which field of a Faults is wrong and why.
type FieldError struct {
	Field, Msg string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldError(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Validate reports what is wrong with f as a *FieldError.
func (f Faults) Validate() error {
	if e := f.FsyncError; e != nil {
		if err := checkGlob(e.Path); err != nil {
			return fieldError("fsync_error.path", "%v", err)
		}
		if e.After < 0 {
			return fieldError("fsync_error.after", "expected >= 0, found %d", e.After)
		}
	}
	if d := f.DiskFull; d != nil && d.FreeBytes < 0 {
		return fieldError("disk_full.free_bytes", "expected >= 0, found %d", d.FreeBytes)
	}
	for i, s := range f.SlowDisk {
		for _, o := range s.Ops {
			if _, err := ParseOp(string(o)); err != nil {
				return fieldError(fmt.Sprintf("slow_disk[%d].ops", i), "%v", err)
			}
		}
		if s.Latency < 0 {
			return fieldError(fmt.Sprintf("slow_disk[%d].latency_ms", i), "expected >= 0, found %s", s.Latency)
		}
		if s.Latency == 0 && !s.Stall {
			return fieldError(fmt.Sprintf("slow_disk[%d]", i), "expected a latency or a stall")
		}
		if s.MaxStall < 0 || (s.MaxStall > 0 && !s.Stall) {
			return fieldError(fmt.Sprintf("slow_disk[%d].max_stall_ms", i), "expected >= 0 and only with a stall, found %s (stall %v)", s.MaxStall, s.Stall)
		}
	}
	for i, c := range f.CorruptRead {
		if err := checkGlob(c.Path); err != nil {
			return fieldError(fmt.Sprintf("corrupt_read[%d].path", i), "%v", err)
		}
		if c.Offset < 0 || c.Length < 0 {
			return fieldError(fmt.Sprintf("corrupt_read[%d]", i), "expected offset and length >= 0, found %d and %d", c.Offset, c.Length)
		}
	}
	return nil
}

func checkGlob(p string) error {
	_, err := path.Match(p, "")
	return err
}

// matchPath reports whether glob matches rel, the slash-separated path of
// a file in the mount. A glob without "/" matches the base name.
func matchPath(glob, rel string) bool {
	if glob == "" {
		return true
	}
	if !strings.Contains(glob, "/") {
		rel = path.Base(rel)
	}
	ok, _ := path.Match(glob, rel)
	return ok
}

// faultSet is the armed faults and their running state.
type faultSet struct {
	mu sync.Mutex

	fsync      *FsyncError
	fsyncCalls int // matching fsyncs since fsync was set

	diskFull bool
	free     int64
	// countAll charges overwrites too (DiskFull.CountOverwrites).
	countAll bool
	// fullArmed lets writes skip the lock while no DiskFull is set.
	fullArmed atomic.Bool

	slow []SlowDisk
	// slowArmed lets operations skip the lock while no SlowDisk is set.
	slowArmed atomic.Bool
	// unstall is closed when the slow faults change, releasing stalled
	// operations so they re-read the faults.
	unstall chan struct{}

	corrupt []CorruptRead
}

func newFaultSet() *faultSet {
	return &faultSet{unstall: make(chan struct{})}
}

func (s *faultSet) set(f Faults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.FsyncError != nil {
		e := *f.FsyncError
		s.fsync, s.fsyncCalls = &e, 0
	}
	if f.DiskFull != nil {
		s.diskFull, s.free, s.countAll = true, f.DiskFull.FreeBytes, f.DiskFull.CountOverwrites
		s.fullArmed.Store(true)
	}
	if f.SlowDisk != nil {
		s.slow = slices.Clone(f.SlowDisk)
		s.slowArmed.Store(len(s.slow) > 0)
		close(s.unstall)
		s.unstall = make(chan struct{})
	}
	if f.CorruptRead != nil {
		s.corrupt = slices.Clone(f.CorruptRead)
	}
}

func (s *faultSet) clear(kinds []Kind) {
	if len(kinds) == 0 {
		kinds = Kinds
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range kinds {
		switch k {
		case KindFsyncError:
			s.fsync, s.fsyncCalls = nil, 0
		case KindDiskFull:
			s.diskFull, s.free, s.countAll = false, 0, false
			s.fullArmed.Store(false)
		case KindSlowDisk:
			s.slow = nil
			s.slowArmed.Store(false)
			close(s.unstall)
			s.unstall = make(chan struct{})
		case KindCorruptRead:
			s.corrupt = nil
		}
	}
}

// current returns the armed faults; DiskFull shows the space left.
func (s *faultSet) current() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	var f Faults
	if s.fsync != nil {
		e := *s.fsync
		f.FsyncError = &e
	}
	if s.diskFull {
		f.DiskFull = &DiskFull{FreeBytes: s.free, CountOverwrites: s.countAll}
	}
	f.SlowDisk = slices.Clone(s.slow)
	f.CorruptRead = slices.Clone(s.corrupt)
	return f
}

// fsyncFails counts an fsync of rel and reports whether it must fail.
func (s *faultSet) fsyncFails(rel string, dir bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.fsync
	if e == nil || (dir && !e.Dirs) || !matchPath(e.Path, rel) {
		return false
	}
	s.fsyncCalls++
	if s.fsyncCalls <= e.After {
		return false
	}
	if !e.Sticky {
		s.fsync = nil
	}
	return true
}

// delay returns how long an operation of class op waits and whether it
// stalls; stall waits on the returned channel (closed when the slow faults
// change), for at most maxStall when that is non-zero. A stall without a
// bound outweighs a bounded one.
func (s *faultSet) delay(op Op) (wait time.Duration, stall bool, maxStall time.Duration, unstall <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	unbounded := false
	for _, sd := range s.slow {
		if len(sd.Ops) > 0 && !slices.Contains(sd.Ops, op) {
			continue
		}
		wait = max(wait, sd.Latency)
		if sd.Stall {
			stall = true
			unbounded = unbounded || sd.MaxStall == 0
			maxStall = max(maxStall, sd.MaxStall)
		}
	}
	if unbounded {
		maxStall = 0
	}
	return wait, stall, maxStall, s.unstall
}

// grow asks for growth bytes of space and returns how many of them fit:
// all of them while no DiskFull fault is set.
func (s *faultSet) grow(growth int64) int64 {
	if growth <= 0 {
		return growth
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.diskFull {
		return growth
	}
	ok := min(growth, s.free)
	s.free -= ok
	return ok
}

// writeRoom returns how many of the n bytes a write puts at off into a
// file of size may be written, and the space it took: all n, taking
// nothing, while no DiskFull is set or the write grows nothing (unless
// overwrites count). A result <= 0 means none; the caller gives the
// space taken back with release.
func (s *faultSet) writeRoom(off, n, size int64) (allowed, taken int64) {
	if !s.fullArmed.Load() {
		return n, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.diskFull {
		return n, 0
	}
	if s.countAll {
		taken = min(n, max(s.free, 0))
		s.free -= taken
		return taken, taken
	}
	growth := off + n - size
	if growth <= 0 {
		return n, 0
	}
	taken = min(growth, max(s.free, 0))
	s.free -= taken
	return n - (growth - taken), taken
}

// release gives shrink bytes back to a full disk.
func (s *faultSet) release(shrink int64) {
	if shrink <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.diskFull {
		s.free += shrink
	}
}

// full reports whether a DiskFull fault has no space left: creates fail.
func (s *faultSet) full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.diskFull && s.free <= 0
}

// freeBytes is the space left and whether a DiskFull fault is set.
func (s *faultSet) freeBytes() (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.free, s.diskFull
}

// corruptRange applies the corrupt-read faults matching rel to buf, which
// holds the file's bytes from off, and returns how many bytes it changed.
func (s *faultSet) corruptRange(rel string, buf []byte, off int64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := 0
	for _, c := range s.corrupt {
		if !matchPath(c.Path, rel) {
			continue
		}
		lo, hi := max(c.Offset, off), off+int64(len(buf))
		if c.Length > 0 {
			hi = min(hi, c.Offset+c.Length)
		}
		mask := c.Mask
		if mask == 0 {
			mask = 0x01
		}
		for i := lo; i < hi; i++ {
			buf[i-off] ^= mask
			changed++
		}
	}
	return changed
}
