package faultfs

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// treeIndex locates every inode faultfs may need during a power cut.
type treeIndex struct {
	root uint64
	// paths: a backing path per inode, the first in name order in the
	// tree, else its grave.
	paths map[uint64]string
	// dirs: the live entries of every directory in the tree.
	dirs map[uint64][]namedEntry
}

func indexTree(b *backing, t *tracker) (*treeIndex, error) {
	var st unix.Stat_t
	if err := unix.Fstat(b.fd, &st); err != nil {
		return nil, err
	}
	idx := &treeIndex{root: st.Ino, paths: map[uint64]string{st.Ino: ""}, dirs: map[uint64][]namedEntry{}}
	var walk func(ino uint64, rel string) error
	walk = func(ino uint64, rel string) error {
		ents, err := readEntries(b.path(rel), rel == "")
		if err != nil {
			return err
		}
		slices.SortFunc(ents, func(a, b namedEntry) int { return cmp.Compare(a.name, b.name) })
		idx.dirs[ino] = ents
		for _, e := range ents {
			if _, seen := idx.paths[e.ino]; seen {
				continue
			}
			child := joinRel(rel, e.name)
			idx.paths[e.ino] = child
			if e.dir {
				if err := walk(e.ino, child); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(st.Ino, ""); err != nil {
		return nil, err
	}
	for ino, g := range t.graves {
		if _, ok := idx.paths[ino]; !ok {
			idx.paths[ino] = g.rel
		}
	}
	return idx, nil
}

func joinRel(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// rollback makes the backing directory its durable state: every file's
// unsynced changes undone (or, torn, all but a prefix), then, if any
// directory has unsynced entry changes, the whole namespace rebuilt from
// the durable entries. Operations are stopped (fs.mu held).
func rollback(b *backing, t *tracker, o PowerCutOptions) (PowerCutReport, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var rep PowerCutReport
	if o.TornWrites || o.OutOfOrder {
		rep.Seed = o.Seed
	}
	rep.OutOfOrder = o.OutOfOrder
	idx, err := indexTree(b, t)
	if err != nil {
		return rep, err
	}

	type dirtyFile struct {
		rel string
		ft  *fileTrack
	}
	var dirty []dirtyFile
	for ino, ft := range t.files {
		ft.mu.Lock()
		changed := len(ft.undo) > 0
		ft.mu.Unlock()
		if rel, named := idx.paths[ino]; changed && named {
			dirty = append(dirty, dirtyFile{rel, ft})
		}
	}
	// Name order, so a seed means the same tears for the same script.
	slices.SortFunc(dirty, func(a, b dirtyFile) int { return cmp.Compare(a.rel, b.rel) })
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 0x746f726e))
	for _, d := range dirty {
		roll := rollbackFile
		if o.OutOfOrder {
			roll = rollbackFileOutOfOrder
		}
		if err := roll(b, d.rel, d.ft, o.TornWrites, rng, &rep); err != nil {
			return rep, err
		}
	}

	if len(t.dirs) == 0 {
		return rep, nil // no entry changed since its directory's fsync
	}
	rep.EntriesRolledBack = entriesRolledBack(t, idx)
	return rep, rebuild(b, t, idx)
}

func rollbackFile(b *backing, rel string, ft *fileTrack, torn bool, rng *rand.Rand, rep *PowerCutReport) error {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	keep, keepBytes := 0, int64(0)
	if torn {
		keep = rng.IntN(len(ft.undo) + 1)
		if keep < len(ft.undo) {
			points := ft.undo[keep].tornPoints()
			keepBytes = points[rng.IntN(len(points))]
		}
		if keep > 0 || keepBytes > 0 {
			rep.Torn++
		}
	}
	fd, err := unix.Open(b.path(rel), unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s to undo its unsynced changes: %w", rel, err)
	}
	defer unix.Close(fd)
	undone, discarded, err := ft.rollback(fd, keep, keepBytes)
	if err != nil {
		return fmt.Errorf("undo unsynced changes of %s: %w", rel, err)
	}
	if undone > 0 {
		rep.Files++
	}
	rep.ChangesUndone += undone
	rep.BytesDiscarded += discarded
	return nil
}

// rollbackFileOutOfOrder undoes every unsynced change of the file, then
// writes back the newest content of a seeded half of the 4 KiB pages its
// unsynced writes touched: the pages a disk happened to write back before
// the power went, in no particular order.
func rollbackFileOutOfOrder(b *backing, rel string, ft *fileTrack, _ bool, rng *rand.Rand, rep *PowerCutReport) error {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	fd, err := unix.Open(b.path(rel), unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s to undo its unsynced changes: %w", rel, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", rel, err)
	}
	// The newest content of every dirty page, before anything is undone.
	type page struct {
		off  int64
		data []byte
	}
	var pages []page
	for _, off := range ft.dirtyPages() {
		if off >= st.Size {
			continue // past the end now: a later truncate removed it
		}
		buf := make([]byte, min(undoBlock, st.Size-off))
		n, err := unix.Pread(fd, buf, off)
		if err != nil {
			return fmt.Errorf("read %s's page at %d: %w", rel, off, err)
		}
		pages = append(pages, page{off, buf[:n]})
	}
	undone, discarded, err := ft.rollback(fd, 0, 0)
	if err != nil {
		return fmt.Errorf("undo unsynced changes of %s: %w", rel, err)
	}
	if undone > 0 {
		rep.Files++
	}
	rep.ChangesUndone += undone
	for _, p := range pages {
		if rng.IntN(2) == 0 {
			rep.PagesDropped++
			continue
		}
		if _, err := unix.Pwrite(fd, p.data, p.off); err != nil {
			return fmt.Errorf("write back %s's page at %d: %w", rel, p.off, err)
		}
		rep.PagesKept++
		discarded -= int64(len(p.data))
	}
	rep.BytesDiscarded += max(discarded, 0)
	return nil
}

// durableEntries lists directory ino's durable entries in name order: its
// snapshot if its entries changed since its last fsync, else its live ones
// (none for a directory outside the tree: a clean graveyard one is empty).
func durableEntries(t *tracker, idx *treeIndex, ino uint64) []namedEntry {
	d, ok := t.dirs[ino]
	if !ok {
		return idx.dirs[ino]
	}
	out := make([]namedEntry, 0, len(d.durable))
	for name, de := range d.durable {
		out = append(out, namedEntry{name: name, dirent: de})
	}
	slices.SortFunc(out, func(a, b namedEntry) int { return cmp.Compare(a.name, b.name) })
	return out
}

func entriesRolledBack(t *tracker, idx *treeIndex) int {
	n := 0
	for ino, d := range t.dirs {
		live := make(map[string]uint64, len(idx.dirs[ino]))
		for _, e := range idx.dirs[ino] {
			live[e.name] = e.ino
		}
		for name, de := range d.durable {
			if l, ok := live[name]; !ok || l != de.ino {
				n++
			}
		}
		for name := range live {
			if _, ok := d.durable[name]; !ok {
				n++
			}
		}
	}
	return n
}

// rebuild builds the durable tree under the state directory from hard
// links to the surviving inodes and new directories, then swaps it in for
// the root's entries.
func rebuild(b *backing, t *tracker, idx *treeIndex) error {
	const staging, old = StateDirName + "/cut", StateDirName + "/old"
	for _, dir := range []string{staging, old} {
		if err := os.RemoveAll(b.path(dir)); err != nil {
			return err
		}
		if err := unix.Mkdir(b.path(dir), 0o700); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	visited := map[uint64]bool{idx.root: true}
	var build func(ino uint64, rel, durableRel string) error
	build = func(ino uint64, rel, durableRel string) error {
		for _, e := range durableEntries(t, idx, ino) {
			name := joinRel(durableRel, e.name)
			src, ok := idx.paths[e.ino]
			if !ok {
				return fmt.Errorf("durable entry %s names inode %d, found neither in the tree nor in the graveyard", name, e.ino)
			}
			dst := rel + "/" + e.name
			if !e.dir {
				if err := unix.Link(b.path(src), b.path(dst)); err != nil {
					return fmt.Errorf("restore %s: %w", name, err)
				}
				continue
			}
			if visited[e.ino] {
				// Snapshots from different moments can name a directory
				// twice (or in a cycle): it is durable in the first place
				// found, in name order.
				continue
			}
			visited[e.ino] = true
			var st unix.Stat_t
			if err := unix.Lstat(b.path(src), &st); err != nil {
				return fmt.Errorf("restore directory %s: %w", name, err)
			}
			if err := unix.Mkdir(b.path(dst), 0o700); err != nil {
				return fmt.Errorf("restore directory %s: %w", name, err)
			}
			_ = unix.Chmod(b.path(dst), st.Mode&07777)
			_ = unix.Lchown(b.path(dst), int(st.Uid), int(st.Gid))
			if err := build(e.ino, dst, name); err != nil {
				return err
			}
		}
		return nil
	}
	if err := build(idx.root, staging, ""); err != nil {
		return err
	}
	var moved []string
	for _, e := range idx.dirs[idx.root] {
		if err := unix.Rename(b.path(e.name), b.path(old+"/"+e.name)); err != nil {
			for _, m := range moved {
				_ = unix.Rename(b.path(old+"/"+m), b.path(m))
			}
			return fmt.Errorf("set aside %s: %w", e.name, err)
		}
		moved = append(moved, e.name)
	}
	staged, err := readEntries(b.path(staging), false)
	if err != nil {
		return err
	}
	for _, e := range staged {
		if err := unix.Rename(b.path(staging+"/"+e.name), b.path(e.name)); err != nil {
			return fmt.Errorf("put back %s (the pre-cut tree is in %s/%s): %w", e.name, b.dir, old, err)
		}
	}
	return nil
}
