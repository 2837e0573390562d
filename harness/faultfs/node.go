package faultfs

import (
	"context"
	"errors"
	"os"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is one inode of the mount. It holds no state of its own: its
// backing path comes from go-fuse's tree, its identity (StableAttr.Ino) is
// the backing inode number, and what is durable lives in the generation's
// tracker.
type node struct {
	fs.Inode
	gen *generation
}

var (
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeSetattrer  = (*node)(nil)
	_ fs.NodeStatfser   = (*node)(nil)
	_ fs.NodeReadlinker = (*node)(nil)
	_ fs.NodeReaddirer  = (*node)(nil)
	_ fs.NodeOpener     = (*node)(nil)
	_ fs.NodeCreater    = (*node)(nil)
	_ fs.NodeMkdirer    = (*node)(nil)
	_ fs.NodeMknoder    = (*node)(nil)
	_ fs.NodeSymlinker  = (*node)(nil)
	_ fs.NodeLinker     = (*node)(nil)
	_ fs.NodeUnlinker   = (*node)(nil)
	_ fs.NodeRmdirer    = (*node)(nil)
	_ fs.NodeRenamer    = (*node)(nil)
	_ fs.NodeFsyncer    = (*node)(nil)
)

// rel is the node's slash-separated path in the mount ("" for the root).
func (n *node) rel() string { return n.Path(n.Root()) }

func (n *node) childRel(name string) string {
	if r := n.rel(); r != "" {
		return r + "/" + name
	}
	return name
}

func (n *node) isRoot() bool { return n.Root() == n.EmbeddedInode() }

func (n *node) ino() uint64 { return n.StableAttr().Ino }

// reserved reports whether name is the state directory's, which the mount
// does not show.
func (n *node) reserved(name string) bool { return name == StateDirName && n.isRoot() }

func (n *node) track() *tracker { return n.gen.track }

func (n *node) bpath(rel string) string { return n.gen.fs.b.path(rel) }

// newChild returns the go-fuse inode for a backing entry.
func (n *node) newChild(ctx context.Context, st *syscall.Stat_t, gen uint64, out *fuse.EntryOut) *fs.Inode {
	out.Attr.FromStat(st)
	return n.NewInode(ctx, &node{gen: n.gen}, fs.StableAttr{Mode: st.Mode, Ino: st.Ino, Gen: gen})
}

// lstatGen stats path without following a final symlink and returns a
// generation for the inode number (its birth time), as go-fuse's loopback
// does, so a reused inode number is a new inode to the kernel.
func lstatGen(dirfd int, path string, flags int) (syscall.Stat_t, uint64, error) {
	var x unix.Statx_t
	var st syscall.Stat_t
	if err := unix.Statx(dirfd, path, flags|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &x); err != nil {
		return st, 0, err
	}
	st.Dev = unix.Mkdev(x.Dev_major, x.Dev_minor)
	st.Ino = x.Ino
	st.Nlink = uint64(x.Nlink)
	st.Mode = uint32(x.Mode)
	st.Uid, st.Gid = x.Uid, x.Gid
	st.Rdev = unix.Mkdev(x.Rdev_major, x.Rdev_minor)
	st.Size = int64(x.Size)
	st.Blksize = int64(x.Blksize)
	st.Blocks = int64(x.Blocks)
	st.Atim = syscall.Timespec{Sec: x.Atime.Sec, Nsec: int64(x.Atime.Nsec)}
	st.Mtim = syscall.Timespec{Sec: x.Mtime.Sec, Nsec: int64(x.Mtime.Nsec)}
	st.Ctim = syscall.Timespec{Sec: x.Ctime.Sec, Nsec: int64(x.Ctime.Nsec)}
	gen := uint64(1)
	if x.Mask&unix.STATX_BTIME != 0 {
		gen = uint64(x.Btime.Sec)*1e9 + uint64(x.Btime.Nsec)
	}
	return st, gen, nil
}

// chownToCaller gives a new entry to the user who created it, as a kernel
// filesystem would (faultfs runs as root).
func chownToCaller(ctx context.Context, p string) {
	if os.Geteuid() != 0 {
		return
	}
	if c, ok := fuse.FromContext(ctx); ok {
		_ = unix.Lchown(p, int(c.Uid), int(c.Gid))
	}
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	done, errno := n.gen.enter(opLookup)
	if errno != 0 {
		return nil, errno
	}
	defer done()
	if n.reserved(name) {
		return nil, syscall.ENOENT
	}
	st, gen, err := lstatGen(unix.AT_FDCWD, n.bpath(n.childRel(name)), 0)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.newChild(ctx, &st, gen, out), 0
}

func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	done, errno := n.gen.enter(opGetattr)
	if errno != 0 {
		return errno
	}
	defer done()
	return n.getattr(f, out)
}

func (n *node) getattr(f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	var st syscall.Stat_t
	var err error
	if h, ok := f.(*fileHandle); ok {
		err = syscall.Fstat(h.fd, &st)
	} else if n.isRoot() {
		// The root's backing path is the /proc/self/fd magic link.
		err = syscall.Fstat(n.gen.fs.b.fd, &st)
	} else {
		err = syscall.Lstat(n.bpath(n.rel()), &st)
	}
	if err != nil {
		return fs.ToErrno(err)
	}
	out.FromStat(&st)
	return 0
}

func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	op := opSetattr
	size, truncate := in.GetSize()
	if truncate {
		op = opTruncate
	}
	done, errno := n.gen.enter(op)
	if errno != 0 {
		return errno
	}
	defer done()
	h, _ := f.(*fileHandle)
	p := n.bpath(n.rel())
	if n.isRoot() {
		// The root's backing path is the /proc/self/fd magic link, which
		// chown and utimes without following would change instead.
		p = n.bpath("") + "/."
	}
	if mode, ok := in.GetMode(); ok {
		var err error
		if h != nil {
			err = unix.Fchmod(h.fd, mode)
		} else {
			err = unix.Chmod(p, mode)
		}
		if err != nil {
			return fs.ToErrno(err)
		}
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		if err := unix.Lchown(p, u, g); err != nil {
			return fs.ToErrno(err)
		}
	}
	if truncate {
		if errno := n.truncate(h, int64(size)); errno != 0 {
			return errno
		}
	}
	mtime, mok := in.GetMTime()
	atime, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if aok {
			ts[0] = unix.NsecToTimespec(atime.UnixNano())
		}
		if mok {
			ts[1] = unix.NsecToTimespec(mtime.UnixNano())
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fs.ToErrno(err)
		}
	}
	return n.getattr(f, out)
}

// truncate changes the file's size through h, or through its path when
// the kernel sent no handle, recording what it removes.
func (n *node) truncate(h *fileHandle, size int64) syscall.Errno {
	if h != nil {
		return h.truncate(size)
	}
	fd, err := unix.Open(n.bpath(n.rel()), unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fs.ToErrno(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	ft := n.track().acquire(st.Ino)
	defer n.track().release(ft)
	return n.gen.truncate(ft, fd, size)
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	done, errno := n.gen.enter(opStatfs)
	if errno != 0 {
		return errno
	}
	defer done()
	var s syscall.Statfs_t
	if err := syscall.Statfs(n.bpath(""), &s); err != nil {
		return fs.ToErrno(err)
	}
	out.FromStatfsT(&s)
	if free, full := n.gen.fs.faults.freeBytes(); full && out.Bsize > 0 {
		out.Bfree = uint64(free) / uint64(out.Bsize)
		out.Bavail = out.Bfree
	}
	return 0
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	done, errno := n.gen.enter(opReadlink)
	if errno != 0 {
		return nil, errno
	}
	defer done()
	buf := make([]byte, unix.PathMax)
	k, err := unix.Readlink(n.bpath(n.rel()), buf)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return buf[:k], 0
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	done, errno := n.gen.enter(opReaddir)
	if errno != 0 {
		return nil, errno
	}
	defer done()
	ents, err := readEntries(n.bpath(n.rel()), n.isRoot())
	if err != nil {
		return nil, fs.ToErrno(unwrapErrno(err))
	}
	list := make([]fuse.DirEntry, 0, len(ents)+2)
	list = append(list, fuse.DirEntry{Name: ".", Ino: n.ino(), Mode: syscall.S_IFDIR}, fuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR})
	for _, e := range ents {
		list = append(list, fuse.DirEntry{Name: e.name, Ino: e.ino, Mode: uint32(e.typ) << 12})
	}
	return fs.NewListDirStream(list), 0
}

// unwrapErrno finds the errno inside a wrapped error, EIO if none.
func unwrapErrno(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return syscall.EIO
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	done, errno := n.gen.enter(opOpen)
	if errno != 0 {
		return nil, 0, errno
	}
	defer done()
	fd, errno := openBackingFile(n.bpath(n.rel()), flags, 0, 0)
	if errno != 0 {
		return nil, 0, errno
	}
	h, errno := n.gen.newHandle(fd, n.rel(), flags)
	if errno != 0 {
		return nil, 0, errno
	}
	if flags&syscall.O_TRUNC != 0 {
		if errno := h.truncate(0); errno != 0 {
			h.close()
			return nil, 0, errno
		}
	}
	return h, fuse.FOPEN_DIRECT_IO, 0
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	done, errno := n.gen.enter(opCreate)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	defer done()
	if n.reserved(name) {
		return nil, nil, 0, syscall.EPERM
	}
	rel := n.childRel(name)
	p := n.bpath(rel)
	t := n.track()
	t.mu.Lock()
	if err := t.touchDir(n.ino(), n.rel()); err != nil {
		t.mu.Unlock()
		return nil, nil, 0, fs.ToErrno(unwrapErrno(err))
	}
	if n.gen.fs.faults.full() {
		t.mu.Unlock()
		n.gen.fs.stats.enospc.Add(1)
		return nil, nil, 0, syscall.ENOSPC
	}
	fd, errno := openBackingFile(p, flags, unix.O_CREAT|unix.O_EXCL, mode)
	t.mu.Unlock()
	created := errno == 0
	if errno == syscall.EEXIST && flags&syscall.O_EXCL == 0 {
		// Someone else created it first: open what is there.
		fd, errno = openBackingFile(p, flags, 0, 0)
	}
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if created {
		_ = unix.Fchmod(fd, mode&07777) // undo faultfs's own umask
		chownToCaller(ctx, p)
	}
	h, errno := n.gen.newHandle(fd, rel, flags)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if !created && flags&syscall.O_TRUNC != 0 {
		if errno := h.truncate(0); errno != 0 {
			h.close()
			return nil, nil, 0, errno
		}
	}
	st, gen, err := lstatGen(h.fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		h.close()
		return nil, nil, 0, fs.ToErrno(err)
	}
	return n.newChild(ctx, &st, gen, out), h, fuse.FOPEN_DIRECT_IO, 0
}

// createEntry runs make, which creates the entry name in this directory,
// with the directory snapshotted first and the disk-full fault checked,
// and returns the new entry's inode.
func (n *node) createEntry(ctx context.Context, op opcode, name string, out *fuse.EntryOut, make func(p string) error) (*fs.Inode, syscall.Errno) {
	done, errno := n.gen.enter(op)
	if errno != 0 {
		return nil, errno
	}
	defer done()
	if n.reserved(name) {
		return nil, syscall.EPERM
	}
	p := n.bpath(n.childRel(name))
	t := n.track()
	t.mu.Lock()
	err := t.touchDir(n.ino(), n.rel())
	if err == nil && n.gen.fs.faults.full() {
		n.gen.fs.stats.enospc.Add(1)
		err = syscall.ENOSPC
	}
	if err == nil {
		err = make(p)
	}
	t.mu.Unlock()
	if err != nil {
		return nil, fs.ToErrno(unwrapErrno(err))
	}
	chownToCaller(ctx, p)
	st, gen, err := lstatGen(unix.AT_FDCWD, p, 0)
	if err != nil {
		return nil, fs.ToErrno(err)
	}
	return n.newChild(ctx, &st, gen, out), 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.createEntry(ctx, opMkdir, name, out, func(p string) error {
		if err := unix.Mkdir(p, mode); err != nil {
			return err
		}
		return unix.Chmod(p, mode&07777) // undo faultfs's own umask
	})
}

func (n *node) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.createEntry(ctx, opMknod, name, out, func(p string) error {
		return unix.Mknod(p, mode, int(dev))
	})
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.createEntry(ctx, opSymlink, name, out, func(p string) error {
		return unix.Symlink(target, p)
	})
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	tn, ok := target.(*node)
	if !ok || tn.gen != n.gen {
		return nil, syscall.EXDEV
	}
	return n.createEntry(ctx, opLink, name, out, func(p string) error {
		return unix.Link(n.bpath(tn.rel()), p)
	})
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	done, errno := n.gen.enter(opUnlink)
	if errno != 0 {
		return errno
	}
	defer done()
	if n.reserved(name) {
		return syscall.ENOENT
	}
	rel := n.childRel(name)
	p := n.bpath(rel)
	t := n.track()
	t.mu.Lock()
	defer t.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return fs.ToErrno(err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return syscall.EISDIR
	}
	if err := t.touchDir(n.ino(), n.rel()); err != nil {
		return fs.ToErrno(unwrapErrno(err))
	}
	last := st.Nlink == 1
	kept := false
	if last {
		var err error
		if kept, err = t.keepRemoved(st.Ino, rel, false); err != nil {
			return fs.ToErrno(unwrapErrno(err))
		}
	}
	if err := unix.Unlink(p); err != nil {
		return fs.ToErrno(err)
	}
	if last {
		n.gen.fs.faults.release(st.Size)
		if err := t.removed(st.Ino, false, kept); err != nil {
			return fs.ToErrno(unwrapErrno(err))
		}
	}
	return 0
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	done, errno := n.gen.enter(opRmdir)
	if errno != 0 {
		return errno
	}
	defer done()
	if n.reserved(name) {
		return syscall.ENOENT
	}
	rel := n.childRel(name)
	p := n.bpath(rel)
	t := n.track()
	t.mu.Lock()
	defer t.mu.Unlock()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return fs.ToErrno(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return syscall.ENOTDIR
	}
	if err := t.touchDir(n.ino(), n.rel()); err != nil {
		return fs.ToErrno(unwrapErrno(err))
	}
	if t.refs[st.Ino] > 0 {
		// The graveyard takes it by rename, which does not check that it
		// is empty.
		ents, err := readEntries(p, false)
		if err != nil {
			return fs.ToErrno(unwrapErrno(err))
		}
		if len(ents) > 0 {
			return syscall.ENOTEMPTY
		}
		if _, err := t.keepRemoved(st.Ino, rel, true); err != nil {
			return fs.ToErrno(unwrapErrno(err))
		}
		return 0
	}
	if err := unix.Rmdir(p); err != nil {
		return fs.ToErrno(err)
	}
	return fs.ToErrno(t.removed(st.Ino, true, false))
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	done, errno := n.gen.enter(opRename)
	if errno != 0 {
		return errno
	}
	defer done()
	np, ok := newParent.(*node)
	if !ok || np.gen != n.gen {
		return syscall.EXDEV
	}
	if n.reserved(name) || np.reserved(newName) {
		return syscall.EPERM
	}
	if flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
		return syscall.EINVAL
	}
	srcRel, dstRel := n.childRel(name), np.childRel(newName)
	src, dst := n.bpath(srcRel), np.bpath(dstRel)
	t := n.track()
	t.mu.Lock()
	defer t.mu.Unlock()
	var sst, dst0 unix.Stat_t
	if err := unix.Lstat(src, &sst); err != nil {
		return fs.ToErrno(err)
	}
	replaced := false
	switch err := unix.Lstat(dst, &dst0); {
	case err == nil:
		replaced = flags&unix.RENAME_EXCHANGE == 0 && dst0.Ino != sst.Ino
	case !errors.Is(err, unix.ENOENT):
		return fs.ToErrno(err)
	}
	if err := t.touchDir(n.ino(), n.rel()); err != nil {
		return fs.ToErrno(unwrapErrno(err))
	}
	if err := t.touchDir(np.ino(), np.rel()); err != nil {
		return fs.ToErrno(unwrapErrno(err))
	}
	if !replaced {
		return fs.ToErrno(unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, uint(flags)))
	}
	if flags&unix.RENAME_NOREPLACE != 0 {
		return syscall.EEXIST
	}
	// The replaced inode loses a name. If it was its last and a snapshot
	// still names it, the graveyard keeps it: a directory (empty, or the
	// rename fails anyway) moves there first and comes back if the rename
	// then fails.
	dstDir := dst0.Mode&unix.S_IFMT == unix.S_IFDIR
	srcDir := sst.Mode&unix.S_IFMT == unix.S_IFDIR
	last := dstDir || dst0.Nlink == 1
	kept := false
	if last && t.refs[dst0.Ino] > 0 {
		if dstDir {
			if !srcDir {
				return syscall.EISDIR
			}
			ents, err := readEntries(dst, false)
			if err != nil {
				return fs.ToErrno(unwrapErrno(err))
			}
			if len(ents) > 0 {
				return syscall.ENOTEMPTY
			}
		} else if srcDir {
			return syscall.ENOTDIR
		}
		var err error
		if kept, err = t.keepRemoved(dst0.Ino, dstRel, dstDir); err != nil {
			return fs.ToErrno(unwrapErrno(err))
		}
	}
	if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, 0); err != nil {
		if kept {
			g := t.graves[dst0.Ino]
			if dstDir {
				_ = unix.Rename(n.bpath(g.rel), dst)
			} else {
				_ = unix.Unlink(n.bpath(g.rel))
			}
			delete(t.graves, dst0.Ino)
		}
		return fs.ToErrno(err)
	}
	if last {
		if !dstDir {
			n.gen.fs.faults.release(dst0.Size)
		}
		return fs.ToErrno(unwrapErrnoOrNil(t.removed(dst0.Ino, dstDir, kept)))
	}
	return 0
}

func unwrapErrnoOrNil(err error) error {
	if err == nil {
		return nil
	}
	return unwrapErrno(err)
}

// Fsync serves fsync and fdatasync of files (through their handle) and
// fsync of directories.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := f.(*fileHandle); ok {
		return h.fsync(flags)
	}
	if !n.IsDir() {
		return syscall.EBADF
	}
	done, errno := n.gen.enter(opFsyncDir)
	if errno != 0 {
		return errno
	}
	defer done()
	rel := n.rel()
	g := n.gen
	if g.fs.faults.fsyncFails(rel, true) {
		g.fs.stats.fsyncEIO.Add(1)
		return syscall.EIO
	}
	if !g.fs.opts.SkipBackingSync {
		fd, err := unix.Open(n.bpath(rel), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fs.ToErrno(err)
		}
		err = unix.Fsync(fd)
		unix.Close(fd)
		if err != nil {
			return fs.ToErrno(err)
		}
	}
	t := n.track()
	t.mu.Lock()
	defer t.mu.Unlock()
	return fs.ToErrno(unwrapErrnoOrNil(t.commitDir(n.ino(), rel)))
}
