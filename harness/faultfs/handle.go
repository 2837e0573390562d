package faultfs

import (
	"context"
	"errors"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// fileHandle is an open regular file. Its backing descriptor is read-write
// whenever the backing file allows it, whatever the program asked for, so
// faultfs can read what a write replaces and undo changes in place.
type fileHandle struct {
	gen *generation
	fd  int
	ft  *fileTrack
	rel string // path in the mount when opened, for fault globs
	// sync: opened O_SYNC or O_DSYNC, every write is durable on return.
	sync bool
	// seenErr is the ft.errSeq this handle has reported (ft.mu).
	seenErr uint64
	closed  bool // guarded by ft.mu
}

var (
	_ fs.FileReader    = (*fileHandle)(nil)
	_ fs.FileWriter    = (*fileHandle)(nil)
	_ fs.FileAllocater = (*fileHandle)(nil)
	_ fs.FileReleaser  = (*fileHandle)(nil)
)

// openBackingFile opens the backing file at p for a program's open with
// flags, adding extra (O_CREAT|O_EXCL for a create). It asks for read-write
// access first and falls back to the program's access mode. O_TRUNC is left
// to the caller (it is a recorded change), O_APPEND to the kernel (it
// sends offsets), O_DIRECT would demand aligned buffers, and O_SYNC is
// emulated.
func openBackingFile(p string, flags uint32, extra int, mode uint32) (int, syscall.Errno) {
	base := int(flags)&^(unix.O_ACCMODE|unix.O_TRUNC|unix.O_APPEND|unix.O_DIRECT|unix.O_SYNC|unix.O_DSYNC|unix.O_CREAT|unix.O_EXCL|fuse.FMODE_EXEC) |
		unix.O_CLOEXEC | unix.O_NOFOLLOW | extra
	fd, err := unix.Open(p, base|unix.O_RDWR, mode)
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EROFS) || errors.Is(err, unix.ETXTBSY) || errors.Is(err, unix.EPERM) {
		fd, err = unix.Open(p, base|int(flags)&unix.O_ACCMODE, mode)
	}
	if err != nil {
		return -1, fs.ToErrno(err)
	}
	return fd, 0
}

// newHandle wraps fd, a backing file just opened, into a handle; it takes
// ownership of fd.
func (g *generation) newHandle(fd int, rel string, flags uint32) (*fileHandle, syscall.Errno) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fs.ToErrno(err)
	}
	ft := g.track.acquire(st.Ino)
	h := &fileHandle{gen: g, fd: fd, ft: ft, rel: rel, sync: flags&unix.O_DSYNC != 0}
	ft.mu.Lock()
	h.seenErr = ft.errSeq
	ft.mu.Unlock()
	return h, 0
}

// close lets go of the track, then closes the backing descriptor. In that
// order: once the descriptor is closed an unlinked inode is freed and its
// number may name a new file at once, which must not find this track.
func (h *fileHandle) close() {
	h.ft.mu.Lock()
	if h.closed {
		h.ft.mu.Unlock()
		return
	}
	h.closed = true
	h.ft.mu.Unlock()
	h.gen.track.release(h.ft)
	unix.Close(h.fd)
}

// Release closes the handle even when its mount was cut: the descriptor
// must not leak. Only a live generation's tracker is updated.
func (h *fileHandle) Release(ctx context.Context) syscall.Errno {
	f := h.gen.fs
	if !h.gen.isDead.Load() {
		f.mu.RLock()
		defer f.mu.RUnlock()
	}
	if h.gen.isDead.Load() {
		h.closeDead()
		return 0
	}
	f.stats.ops[opRelease].Add(1)
	h.close()
	return 0
}

// closeDead closes the descriptor of a handle whose mount was cut; its
// tracker is gone.
func (h *fileHandle) closeDead() {
	h.ft.mu.Lock()
	defer h.ft.mu.Unlock()
	if !h.closed {
		h.closed = true
		unix.Close(h.fd)
	}
}

func (h *fileHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	done, errno := h.gen.enter(opRead)
	if errno != 0 {
		return nil, errno
	}
	defer done()
	n, err := unix.Pread(h.fd, dest, off)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	f := h.gen.fs
	f.stats.bytesRead.Add(uint64(n))
	if changed := f.faults.corruptRange(h.rel, dest[:n], off); changed > 0 {
		f.stats.corruptReads.Add(1)
		f.stats.corruptBytes.Add(uint64(changed))
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *fileHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	done, errno := h.gen.enter(opWrite)
	if errno != 0 {
		return 0, errno
	}
	defer done()
	f := h.gen.fs
	ft := h.ft
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Fstat(h.fd, &st); err != nil {
		return 0, fs.ToErrno(err)
	}
	n := int64(len(data))
	if allowed, taken := f.faults.writeRoom(off, n, st.Size); allowed < n {
		// The disk has room for part of the write (a short write) or
		// none of it.
		f.stats.enospc.Add(1)
		if allowed <= 0 {
			f.faults.release(taken)
			return 0, syscall.ENOSPC
		}
		n = allowed
	}
	if err := ft.record(h.fd, changeWrite, off, n, st.Size); err != nil {
		return 0, syscall.EIO
	}
	w, err := unix.Pwrite(h.fd, data[:n], off)
	if err != nil {
		ft.dropLast()
		return 0, fs.ToErrno(err)
	}
	if int64(w) < n {
		ft.undo[len(ft.undo)-1].length = int64(w)
	}
	f.stats.bytesWritten.Add(uint64(w))
	if h.sync {
		if errno := h.syncLocked(true); errno != 0 {
			return 0, errno
		}
	}
	return uint32(w), 0
}

// dropLast forgets the newest undo record: its change did not happen.
// mu held.
func (ft *fileTrack) dropLast() {
	r := ft.undo[len(ft.undo)-1]
	for _, b := range r.blocks {
		ft.held -= int64(len(b.data))
	}
	ft.undo = ft.undo[:len(ft.undo)-1]
}

func (h *fileHandle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	done, errno := h.gen.enter(opFallocate)
	if errno != 0 {
		return errno
	}
	defer done()
	const supported = unix.FALLOC_FL_KEEP_SIZE | unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_ZERO_RANGE
	if mode&^supported != 0 {
		return syscall.EOPNOTSUPP // collapse and insert range shift content: not modelled
	}
	f := h.gen.fs
	ft := h.ft
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Fstat(h.fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	o, l := int64(off), int64(size)
	end := o + l
	grows := mode&unix.FALLOC_FL_KEEP_SIZE == 0 && end > st.Size
	if grows {
		growth := end - st.Size
		if fits := f.faults.grow(growth); fits < growth {
			f.faults.release(fits)
			f.stats.enospc.Add(1)
			return syscall.ENOSPC
		}
	}
	recorded := true
	var err error
	switch {
	case mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0:
		err = ft.record(h.fd, changeAllocate, o, l, st.Size)
	case grows:
		err = ft.record(h.fd, changeAllocate, st.Size, end-st.Size, st.Size)
	default:
		recorded = false // allocates blocks, changes no byte
	}
	if err != nil {
		return syscall.EIO
	}
	if err := unix.Fallocate(h.fd, mode, o, l); err != nil {
		if recorded {
			ft.dropLast()
		}
		return fs.ToErrno(err)
	}
	if h.sync {
		return h.syncLocked(true)
	}
	return 0
}

// truncate changes the file's size through the handle.
func (h *fileHandle) truncate(size int64) syscall.Errno {
	return h.gen.truncate(h.ft, h.fd, size)
}

// truncate sets the size of the file open at fd, recording what it
// removes (or that it grew: growing by truncate allocates nothing).
func (g *generation) truncate(ft *fileTrack, fd int, size int64) syscall.Errno {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	if size == st.Size {
		return 0
	}
	off, length := min(size, st.Size), max(size, st.Size)-min(size, st.Size)
	if err := ft.record(fd, changeTruncate, off, length, st.Size); err != nil {
		return syscall.EIO
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		ft.dropLast()
		return fs.ToErrno(err)
	}
	g.fs.faults.release(st.Size - size)
	return 0
}

// fsync serves fsync (flags 0) and fdatasync (flags&1) of the file.
func (h *fileHandle) fsync(flags uint32) syscall.Errno {
	op := opFsync
	if flags&1 != 0 {
		op = opFdatasync
	}
	done, errno := h.gen.enter(op)
	if errno != 0 {
		return errno
	}
	defer done()
	h.ft.mu.Lock()
	defer h.ft.mu.Unlock()
	return h.syncLocked(op == opFdatasync)
}

// syncLocked makes the file's changes durable, or fails the way Linux
// fails a write-back. ft.mu held.
func (h *fileHandle) syncLocked(datasync bool) syscall.Errno {
	f, ft := h.gen.fs, h.ft
	if h.seenErr != ft.errSeq {
		// A write-back failed while this descriptor was open: report it
		// once (errseq).
		h.seenErr = ft.errSeq
		f.stats.lostWritebackEIO.Add(1)
		return syscall.EIO
	}
	if f.faults.fsyncFails(h.rel, false) {
		// The write-back fails: the unsynced changes are gone, from the
		// disk and from the page cache.
		_, lost, err := ft.rollback(h.fd, 0, 0)
		ft.errSeq++
		h.seenErr = ft.errSeq
		f.stats.fsyncEIO.Add(1)
		f.stats.lostBytes.Add(uint64(lost))
		if err != nil {
			ft.commit() // what could not be undone stays
		}
		return syscall.EIO
	}
	if !f.opts.SkipBackingSync {
		sync := unix.Fsync
		if datasync {
			sync = unix.Fdatasync
		}
		if err := sync(h.fd); err != nil {
			return fs.ToErrno(err)
		}
	}
	ft.commit()
	return 0
}
