package faultfs

import (
	"fmt"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// fileTrack is one regular file's unsynced changes: an undo record per
// change since its last fsync, oldest first. Undoing them newest first
// gives back the durable content; undoing only the newest few gives the
// content after a prefix of the changes (torn writes).
type fileTrack struct {
	ino uint64
	// handles and orphan are guarded by tracker.mu.
	handles int
	orphan  bool

	mu   sync.Mutex
	undo []undoRecord
	held int64 // bytes the undo records keep
	// errSeq counts lost write-backs (failed fsyncs); a handle that has
	// not seen the latest gets EIO once, as Linux's errseq does.
	errSeq uint64
}

type changeKind uint8

const (
	changeWrite changeKind = iota
	changeTruncate
	changeAllocate
)

// undoRecord is what one change replaced: the file's size before it and
// the non-zero 4 KiB blocks of [off, off+length) that existed before it
// (bytes past oldSize did not exist). A missing block was zeros.
type undoRecord struct {
	kind        changeKind
	off, length int64
	oldSize     int64
	blocks      []savedBlock
}

type savedBlock struct {
	off  int64
	data []byte
}

const undoBlock = 4096

var (
	zeroBlock   [undoBlock]byte
	zeroFill    = make([]byte, 64<<10)
	captureBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}
)

// record captures what a change of kind over [off, off+length) is about to
// replace in the file open at fd, whose size is size. mu held.
func (ft *fileTrack) record(fd int, kind changeKind, off, length, size int64) error {
	r := undoRecord{kind: kind, off: off, length: length, oldSize: size}
	end := min(off+length, size)
	bp := captureBufs.Get().(*[]byte)
	defer captureBufs.Put(bp)
	buf := *bp
	for pos := off; pos < end; {
		chunk := buf[:min(int64(len(buf)), end-pos)]
		n, err := unix.Pread(fd, chunk, pos)
		if err != nil {
			return fmt.Errorf("read the bytes a change replaces at %d: %w", pos, err)
		}
		if n == 0 {
			break // the file shrank underneath: nothing more existed
		}
		chunk = chunk[:n]
		for i := 0; i < len(chunk); i += undoBlock {
			blk := chunk[i:min(i+undoBlock, len(chunk))]
			if string(blk) == string(zeroBlock[:len(blk)]) {
				continue
			}
			r.blocks = append(r.blocks, savedBlock{off: pos + int64(i), data: append([]byte(nil), blk...)})
			ft.held += int64(len(blk))
		}
		pos += int64(n)
	}
	ft.undo = append(ft.undo, r)
	return nil
}

// dirtyPages lists, in offset order, the 4 KiB pages the unsynced writes
// touched. mu held.
func (ft *fileTrack) dirtyPages() []int64 {
	seen := map[int64]bool{}
	var out []int64
	for _, r := range ft.undo {
		if r.kind != changeWrite || r.length <= 0 {
			continue
		}
		for p := r.off / undoBlock * undoBlock; p < r.off+r.length; p += undoBlock {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// commit makes the current content durable. mu held.
func (ft *fileTrack) commit() {
	ft.undo, ft.held = nil, 0
}

// rollback undoes the changes after the first keep ones, newest first, on
// the file open read-write at fd; the change at index keep is undone only
// past its first keepBytes bytes (a torn write). It returns how many
// changes it undid, wholly or partly, and the bytes they had written or
// removed. mu held.
func (ft *fileTrack) rollback(fd int, keep int, keepBytes int64) (undone int, discarded int64, err error) {
	for i := len(ft.undo) - 1; i >= keep; i-- {
		r := ft.undo[i]
		var partial int64
		if i == keep {
			partial = keepBytes
		}
		if err := r.restore(fd, partial); err != nil {
			return undone, discarded, err
		}
		undone++
		discarded += r.length - partial
	}
	ft.undo = ft.undo[:keep]
	ft.held = 0
	for _, r := range ft.undo {
		for _, b := range r.blocks {
			ft.held += int64(len(b.data))
		}
	}
	return undone, discarded, nil
}

// restore undoes r on fd except for the first keep bytes of its range.
func (r undoRecord) restore(fd int, keep int64) error {
	size := r.oldSize
	if keep > 0 {
		size = max(size, r.off+keep)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		return fmt.Errorf("truncate back to %d: %w", size, err)
	}
	start, end := r.off+keep, min(r.off+r.length, r.oldSize)
	if start >= end {
		return nil
	}
	for pos := start; pos < end; {
		n := min(int64(len(zeroFill)), end-pos)
		if _, err := unix.Pwrite(fd, zeroFill[:n], pos); err != nil {
			return fmt.Errorf("restore zeros at %d: %w", pos, err)
		}
		pos += n
	}
	for _, b := range r.blocks {
		lo, hi := max(b.off, start), min(b.off+int64(len(b.data)), end)
		if lo >= hi {
			continue
		}
		if _, err := unix.Pwrite(fd, b.data[lo-b.off:hi-b.off], lo); err != nil {
			return fmt.Errorf("restore bytes at %d: %w", lo, err)
		}
	}
	return nil
}

// tornPoints lists the byte counts a torn copy of r may keep: every
// 512-byte sector boundary strictly inside its range, for a write, and 0.
func (r undoRecord) tornPoints() []int64 {
	points := []int64{0}
	if r.kind != changeWrite {
		return points
	}
	for b := (r.off/512 + 1) * 512; b < r.off+r.length; b += 512 {
		points = append(points, b-r.off)
	}
	return points
}
