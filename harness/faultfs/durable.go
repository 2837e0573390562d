package faultfs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// StateDirName is the hidden directory faultfs keeps inside the backing
// directory's root for removed inodes that durable entries still name and
// for power-cut staging. The mount never shows it; Mount clears one left by
// a faultfs that died, and Unmount removes it.
const StateDirName = ".faultfs-state"

// backing is the backing directory, reached through a descriptor opened
// before mounting: paths go through /proc/self/fd/N, so the mountpoint may
// be the backing directory itself (a mount over the data in place).
type backing struct {
	dir    string // as given, for messages
	fd     int
	prefix string
}

func openBacking(dir string) (*backing, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("faultfs: open backing directory %s: %w", dir, err)
	}
	return &backing{dir: dir, fd: fd, prefix: "/proc/self/fd/" + strconv.Itoa(fd)}, nil
}

// path is the backing path of rel, a slash-separated path in the mount.
func (b *backing) path(rel string) string {
	if rel == "" {
		return b.prefix
	}
	return b.prefix + "/" + rel
}

func (b *backing) close() error { return unix.Close(b.fd) }

// dirent is a directory entry as a durable snapshot holds it.
type dirent struct {
	ino uint64
	dir bool
}

type namedEntry struct {
	name string
	typ  uint8 // DT_* from getdents
	dirent
}

// readEntries lists the directory at path (backing, absolute) with inode
// numbers, skipping "." and ".." and, when root, the state directory.
func readEntries(path string, root bool) ([]namedEntry, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []namedEntry
	buf := make([]byte, 16<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, fmt.Errorf("getdents %s: %w", path, err)
		}
		if n <= 0 {
			break
		}
		// struct linux_dirent64 { u64 d_ino; s64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			if reclen < 19 || reclen > len(b) {
				return nil, fmt.Errorf("getdents %s: record length %d out of range", path, reclen)
			}
			ino, typ := binary.NativeEndian.Uint64(b[0:8]), b[18]
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			b = b[reclen:]
			s := string(name)
			if s == "." || s == ".." || (root && s == StateDirName) {
				continue
			}
			if typ == unix.DT_UNKNOWN {
				var st unix.Stat_t
				if err := unix.Fstatat(fd, s, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					return nil, fmt.Errorf("stat %s/%s: %w", path, s, err)
				}
				typ = uint8(st.Mode & unix.S_IFMT >> 12)
			}
			e := namedEntry{name: s, typ: typ, dirent: dirent{ino: ino, dir: typ == unix.DT_DIR}}
			out = append(out, e)
		}
	}
	return out, nil
}

// tracker holds the durable state wherever it differs from the backing
// directory: undo records of files with unsynced changes, entry snapshots
// of directories with unsynced entry changes, and removed inodes that a
// snapshot still names (the graveyard). Inodes are backing inode numbers;
// the graveyard keeps them from being reused while they matter.
//
// Namespace operations hold mu across their backing syscalls (they are
// rare), so a snapshot and the change it precedes are one step. File data
// goes through fileTrack.mu only. Lock order: tracker.mu, then fileTrack.mu.
type tracker struct {
	b  *backing
	mu sync.Mutex
	// files: regular files that are open or have unsynced changes.
	files map[uint64]*fileTrack
	// dirs: directories whose entries changed since their last fsync,
	// with the entries they had then.
	dirs map[uint64]*dirTrack
	// refs counts, per inode, the entries of dirs' snapshots naming it.
	refs map[uint64]int
	// graves: removed inodes some snapshot still names, by inode, with
	// their path in the backing directory (under the state directory).
	graves map[uint64]grave
}

type grave struct {
	rel string
	dir bool
}

type dirTrack struct {
	durable map[string]dirent
}

func newTracker(b *backing) *tracker {
	return &tracker{
		b:      b,
		files:  make(map[uint64]*fileTrack),
		dirs:   make(map[uint64]*dirTrack),
		refs:   make(map[uint64]int),
		graves: make(map[uint64]grave),
	}
}

// touchDir records the entries of directory ino (at rel) as its durable
// ones, unless it already has a snapshot: call it before changing any
// entry of the directory. mu held.
func (t *tracker) touchDir(ino uint64, rel string) error {
	if _, ok := t.dirs[ino]; ok {
		return nil
	}
	ents, err := readEntries(t.b.path(rel), rel == "")
	if err != nil {
		return err
	}
	d := &dirTrack{durable: make(map[string]dirent, len(ents))}
	for _, e := range ents {
		d.durable[e.name] = e.dirent
		t.refs[e.ino]++
	}
	t.dirs[ino] = d
	return nil
}

// commitDir makes directory ino's current entries durable. mu held.
func (t *tracker) commitDir(ino uint64, rel string) error {
	d, ok := t.dirs[ino]
	if !ok {
		return nil
	}
	var unneeded []uint64
	if len(t.dirs) > 1 {
		live, err := readEntries(t.b.path(rel), rel == "")
		if err != nil {
			return err
		}
		// A directory is durable in one place: the subdirectories this
		// directory now holds leave every other snapshot.
		for _, e := range live {
			if !e.dir {
				continue
			}
			for other, od := range t.dirs {
				if other == ino {
					continue
				}
				for name, de := range od.durable {
					if de.ino == e.ino && de.dir {
						delete(od.durable, name)
						unneeded = t.unref(de.ino, unneeded)
					}
				}
			}
		}
	}
	delete(t.dirs, ino)
	for _, de := range d.durable {
		unneeded = t.unref(de.ino, unneeded)
	}
	return t.bury(unneeded)
}

// unref drops one snapshot reference to ino and appends it to unneeded
// when none is left. mu held.
func (t *tracker) unref(ino uint64, unneeded []uint64) []uint64 {
	t.refs[ino]--
	if t.refs[ino] <= 0 {
		delete(t.refs, ino)
		unneeded = append(unneeded, ino)
	}
	return unneeded
}

// bury removes the graves no snapshot needs any more, and what they alone
// kept needed, transitively. mu held.
func (t *tracker) bury(unneeded []uint64) error {
	var firstErr error
	for len(unneeded) > 0 {
		ino := unneeded[len(unneeded)-1]
		unneeded = unneeded[:len(unneeded)-1]
		g, ok := t.graves[ino]
		if !ok || t.refs[ino] > 0 {
			continue
		}
		delete(t.graves, ino)
		var err error
		if g.dir {
			err = unix.Rmdir(t.b.path(g.rel))
			if d, ok := t.dirs[ino]; ok {
				delete(t.dirs, ino)
				for _, de := range d.durable {
					unneeded = t.unref(de.ino, unneeded)
				}
			}
		} else {
			err = unix.Unlink(t.b.path(g.rel))
			t.forgetFile(ino)
		}
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("faultfs: remove %s from the graveyard: %w", g.rel, err)
		}
	}
	return firstErr
}

// keepRemoved is called before the last name of inode ino (at rel) goes
// away: if a snapshot names it, it moves to (directory) or gains a name in
// (file) the graveyard. It reports whether it did. mu held.
func (t *tracker) keepRemoved(ino uint64, rel string, dir bool) (bool, error) {
	if t.refs[ino] <= 0 {
		return false, nil
	}
	if _, ok := t.graves[ino]; ok {
		return true, nil
	}
	g := grave{rel: StateDirName + "/graves/" + strconv.FormatUint(ino, 10), dir: dir}
	var err error
	if dir {
		err = unix.Rename(t.b.path(rel), t.b.path(g.rel))
	} else {
		err = unix.Link(t.b.path(rel), t.b.path(g.rel))
	}
	if err != nil {
		return false, fmt.Errorf("faultfs: keep %s in the graveyard: %w", rel, err)
	}
	t.graves[ino] = g
	return true, nil
}

// removed records that inode ino lost its last live name and, unless
// kept, is gone. mu held.
func (t *tracker) removed(ino uint64, dir, kept bool) error {
	if kept {
		return nil
	}
	if !dir {
		t.forgetFile(ino)
		return nil
	}
	d, ok := t.dirs[ino]
	if !ok {
		return nil
	}
	delete(t.dirs, ino)
	var unneeded []uint64
	for _, de := range d.durable {
		unneeded = t.unref(de.ino, unneeded)
	}
	return t.bury(unneeded)
}

// forgetFile drops the track of a file nothing names any more, at once or
// when its last handle closes: its inode number may be reused after that.
// mu held.
func (t *tracker) forgetFile(ino uint64) {
	ft, ok := t.files[ino]
	if !ok {
		return
	}
	if ft.handles > 0 {
		ft.orphan = true
		return
	}
	delete(t.files, ino)
}

// acquire returns the track of file ino for a handle or a one-off change;
// release it when done.
func (t *tracker) acquire(ino uint64) *fileTrack {
	t.mu.Lock()
	defer t.mu.Unlock()
	ft, ok := t.files[ino]
	if !ok {
		ft = &fileTrack{ino: ino}
		t.files[ino] = ft
	}
	ft.handles++
	return ft
}

func (t *tracker) release(ft *fileTrack) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ft.handles--
	if ft.handles > 0 || t.files[ft.ino] != ft {
		return
	}
	ft.mu.Lock()
	clean := len(ft.undo) == 0
	ft.mu.Unlock()
	if clean || ft.orphan {
		delete(t.files, ft.ino)
	}
}

// syncAll makes everything durable, as syncfs would: undo records and
// snapshots are dropped and the graveyard emptied.
func (t *tracker) syncAll() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for ino, ft := range t.files {
		ft.mu.Lock()
		ft.commit()
		ft.mu.Unlock()
		if ft.handles == 0 {
			delete(t.files, ino)
		}
	}
	clear(t.dirs)
	clear(t.refs)
	var firstErr error
	for ino, g := range t.graves {
		delete(t.graves, ino)
		if ft, ok := t.files[ino]; ok {
			ft.orphan = true
		}
		if err := os.RemoveAll(t.b.path(g.rel)); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return firstErr
}

func (t *tracker) unsynced() Unsynced {
	t.mu.Lock()
	defer t.mu.Unlock()
	u := Unsynced{Dirs: len(t.dirs), Graveyard: len(t.graves)}
	for _, ft := range t.files {
		ft.mu.Lock()
		if len(ft.undo) > 0 {
			u.Files++
			u.Changes += len(ft.undo)
			u.HeldBytes += ft.held
		}
		ft.mu.Unlock()
	}
	return u
}

// stateDirPath is the state directory's backing path.
func (b *backing) stateDirPath(sub ...string) string {
	return filepath.Join(append([]string{b.prefix, StateDirName}, sub...)...)
}
