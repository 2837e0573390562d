package faultfs

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// model is the reference for faultfs's durability semantics: a pure,
// in-memory filesystem that updates its durable state eagerly, at the
// fsync that makes something durable, where faultfs works lazily (undo
// records, snapshots before the first change). The crash tests run the
// same scripts through both and compare what survives a power cut.
//
// The rules, as the package comment states them: file content and size are
// durable at fsync/fdatasync of the file; a directory's entries at fsync of
// the directory, which also takes every subdirectory it now holds out of
// every other directory's durable entries; after a cut the tree is rebuilt
// from the root's durable entries in name order, a directory appearing only
// at its first place; a file shows its durable content.
type model struct {
	inodes []*mInode
}

type mInode struct {
	dir bool
	// files
	data, durable []byte
	pending       []mChange // changes since the last fsync, oldest first
	// directories
	entries, durableEntries map[string]int
}

// mChange is one unsynced change: a write of data at off, or a truncate
// to size.
type mChange struct {
	truncate bool
	off      int64
	data     []byte
	size     int64
}

func newModel() *model {
	m := &model{}
	m.newInode(true)
	return m
}

func (m *model) newInode(dir bool) int {
	in := &mInode{dir: dir}
	if dir {
		in.entries, in.durableEntries = map[string]int{}, map[string]int{}
	}
	m.inodes = append(m.inodes, in)
	return len(m.inodes) - 1
}

// resolve returns the directory holding path's last element and the name.
func (m *model) resolve(path string) (*mInode, string, error) {
	parts := strings.Split(path, "/")
	dir := m.inodes[0]
	for _, p := range parts[:len(parts)-1] {
		ino, ok := dir.entries[p]
		if !ok || !m.inodes[ino].dir {
			return nil, "", fmt.Errorf("model: %s: no directory %s", path, p)
		}
		dir = m.inodes[ino]
	}
	return dir, parts[len(parts)-1], nil
}

func (m *model) lookup(path string) (*mInode, error) {
	if path == "" {
		return m.inodes[0], nil
	}
	dir, name, err := m.resolve(path)
	if err != nil {
		return nil, err
	}
	ino, ok := dir.entries[name]
	if !ok {
		return nil, fmt.Errorf("model: %s: no such entry", path)
	}
	return m.inodes[ino], nil
}

func (m *model) exists(path string) bool {
	_, err := m.lookup(path)
	return err == nil
}

func (m *model) isDir(path string) bool {
	in, err := m.lookup(path)
	return err == nil && in.dir
}

func (m *model) create(path string, dir bool) error {
	parent, name, err := m.resolve(path)
	if err != nil {
		return err
	}
	if _, ok := parent.entries[name]; ok {
		return fmt.Errorf("model: %s exists", path)
	}
	parent.entries[name] = m.newInode(dir)
	return nil
}

func (m *model) file(path string) (*mInode, error) {
	in, err := m.lookup(path)
	if err != nil {
		return nil, err
	}
	if in.dir {
		return nil, fmt.Errorf("model: %s is a directory", path)
	}
	return in, nil
}

func (m *model) write(path string, off int64, data []byte) error {
	in, err := m.file(path)
	if err != nil {
		return err
	}
	in.data = applyChange(in.data, mChange{off: off, data: data})
	in.pending = append(in.pending, mChange{off: off, data: slices.Clone(data)})
	return nil
}

func (m *model) truncate(path string, size int64) error {
	in, err := m.file(path)
	if err != nil {
		return err
	}
	if int64(len(in.data)) == size {
		return nil // no change, nothing to lose
	}
	c := mChange{truncate: true, size: size}
	in.data = applyChange(in.data, c)
	in.pending = append(in.pending, c)
	return nil
}

func applyChange(data []byte, c mChange) []byte {
	if c.truncate {
		if int64(len(data)) >= c.size {
			return slices.Clone(data[:c.size])
		}
		return append(slices.Clone(data), make([]byte, c.size-int64(len(data)))...)
	}
	out := slices.Clone(data)
	if end := c.off + int64(len(c.data)); int64(len(out)) < end {
		out = append(out, make([]byte, end-int64(len(out)))...)
	}
	copy(out[c.off:], c.data)
	return out
}

// fsync makes a file's content durable (fsync and fdatasync alike) or a
// directory's entries.
func (m *model) fsync(path string) error {
	in, err := m.lookup(path)
	if err != nil {
		return err
	}
	if !in.dir {
		in.durable, in.pending = slices.Clone(in.data), nil
		return nil
	}
	in.durableEntries = maps.Clone(in.entries)
	for _, child := range in.entries {
		if !m.inodes[child].dir {
			continue
		}
		for _, other := range m.inodes {
			if other == in || !other.dir {
				continue
			}
			for name, ino := range other.durableEntries {
				if ino == child {
					delete(other.durableEntries, name)
				}
			}
		}
	}
	return nil
}

// failFsync is a failed fsync of a file: its unsynced changes are lost,
// from the page cache too.
func (m *model) failFsync(path string) error {
	in, err := m.file(path)
	if err != nil {
		return err
	}
	in.data, in.pending = slices.Clone(in.durable), nil
	return nil
}

func (m *model) rename(from, to string) error {
	fp, fname, err := m.resolve(from)
	if err != nil {
		return err
	}
	tp, tname, err := m.resolve(to)
	if err != nil {
		return err
	}
	ino, ok := fp.entries[fname]
	if !ok {
		return fmt.Errorf("model: rename %s: no such entry", from)
	}
	if old, ok := tp.entries[tname]; ok && old == ino {
		return nil // two names of one inode: rename does nothing
	}
	delete(fp.entries, fname)
	tp.entries[tname] = ino
	return nil
}

func (m *model) link(from, to string) error {
	in, err := m.file(from)
	if err != nil {
		return err
	}
	tp, tname, err := m.resolve(to)
	if err != nil {
		return err
	}
	if _, ok := tp.entries[tname]; ok {
		return fmt.Errorf("model: link %s: exists", to)
	}
	tp.entries[tname] = slices.Index(m.inodes, in)
	return nil
}

func (m *model) remove(path string) error {
	parent, name, err := m.resolve(path)
	if err != nil {
		return err
	}
	if _, ok := parent.entries[name]; !ok {
		return fmt.Errorf("model: remove %s: no such entry", path)
	}
	delete(parent.entries, name)
	return nil
}

// syncAll makes everything durable, as FS.Sync.
func (m *model) syncAll() {
	for _, in := range m.inodes {
		if in.dir {
			in.durableEntries = maps.Clone(in.entries)
		} else {
			in.durable, in.pending = slices.Clone(in.data), nil
		}
	}
}

// mEntry is what a tree walk finds at one path.
type mEntry struct {
	dir  bool
	data string
	ino  int // model inode, for torn-write checks
}

// survivors is the tree after a power cut, without torn writes: every
// durable name and the durable content of every file.
func (m *model) survivors() map[string]mEntry {
	out := map[string]mEntry{}
	visited := map[int]bool{0: true}
	var walk func(dir *mInode, prefix string)
	walk = func(dir *mInode, prefix string) {
		for _, name := range slices.Sorted(maps.Keys(dir.durableEntries)) {
			ino := dir.durableEntries[name]
			in := m.inodes[ino]
			p := joinRel(prefix, name)
			if !in.dir {
				out[p] = mEntry{data: string(in.durable), ino: ino}
				continue
			}
			if visited[ino] {
				continue
			}
			visited[ino] = true
			out[p] = mEntry{dir: true, ino: ino}
			walk(in, p)
		}
	}
	walk(m.inodes[0], "")
	return out
}

// tornContents lists what file ino may hold after a power cut with torn
// writes: its durable content with a prefix of its unsynced changes
// applied, the last applied write possibly cut at a 512-byte sector
// boundary.
func (m *model) tornContents(ino int) map[string]bool {
	in := m.inodes[ino]
	out := map[string]bool{}
	state := slices.Clone(in.durable)
	for _, c := range in.pending {
		out[string(state)] = true
		if !c.truncate {
			for b := (c.off/512 + 1) * 512; b < c.off+int64(len(c.data)); b += 512 {
				partial := mChange{off: c.off, data: c.data[:b-c.off]}
				out[string(applyChange(state, partial))] = true
			}
		}
		state = applyChange(state, c)
	}
	out[string(state)] = true
	return out
}

// reboot is the model after a power cut left tree (survivors, with the
// contents actually found): everything in it is durable, and names of one
// model inode stay one inode (hard links survive).
func reboot(tree map[string]mEntry) *model {
	n := newModel()
	ids := map[int]int{0: 0}
	// Sorted paths put every directory before its entries.
	for _, p := range slices.Sorted(maps.Keys(tree)) {
		e := tree[p]
		parent, name, err := n.resolve(p)
		if err != nil {
			panic(err)
		}
		id, ok := ids[e.ino]
		if !ok {
			id = n.newInode(e.dir)
			ids[e.ino] = id
			n.inodes[id].data, n.inodes[id].durable = []byte(e.data), []byte(e.data)
		}
		parent.entries[name], parent.durableEntries[name] = id, id
	}
	return n
}
