package wal

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// The WAL owns the node's durable-write primitives: segments, snapshot
// files (package replica) and the data dir's metadata files (package
// server) are all made durable the same way, and a crash anywhere leaves
// either the old file or the new one, never a mix, an empty file or a
// missing directory entry.

// WriteFileAtomic replaces path with data durably: data is written to
// path+".tmp", fdatasynced, renamed over path, and path's directory is
// fsynced. After a crash path holds its old content or data, nothing else;
// a leftover ".tmp" is debris for RemoveTemporaries.
func WriteFileAtomic(path string, data []byte) error {
	return writeFileAtomic(osFS{}, path, data)
}

// WriteFileAtomicPieces is WriteFileAtomic for the concatenation of
// pieces, without joining them in memory, and with an fdatasync after
// every syncEvery bytes written (0: only at the end). Syncing in pieces
// bounds the dirty data a large file leaves for the final sync: on one
// file system a single fdatasync of 131 MB made the WAL's own fdatasyncs
// (and with them every acknowledgement) wait behind it for seconds
// (snapshots of the vector store).
func WriteFileAtomicPieces(path string, pieces [][]byte, syncEvery int) error {
	return writeFileAtomicPieces(osFS{}, path, pieces, syncEvery)
}

func writeFileAtomic(fsys fileSystem, path string, data []byte) (err error) {
	return writeFileAtomicPieces(fsys, path, [][]byte{data}, 0)
}

func writeFileAtomicPieces(fsys fileSystem, path string, pieces [][]byte, syncEvery int) (err error) {
	tmp := path + tmpSuffix
	// A leftover from an interrupted earlier attempt would make the
	// exclusive create fail.
	if err := fsys.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove leftover %s: %w", tmp, err)
	}
	f, err := fsys.CreateExclusive(tmp)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			fsys.Remove(tmp)
		}
	}()
	var off int64
	unsynced := 0
	for _, data := range pieces {
		for len(data) > 0 {
			n := len(data)
			if syncEvery > 0 {
				n = min(n, syncEvery-unsynced)
			}
			if _, err := f.WriteAt(data[:n], off); err != nil {
				f.Close()
				return fmt.Errorf("write %s: %w", tmp, err)
			}
			off += int64(n)
			data = data[n:]
			unsynced += n
			if syncEvery > 0 && unsynced >= syncEvery {
				if err := f.Datasync(); err != nil {
					f.Close()
					return fmt.Errorf("fdatasync %s: %w", tmp, err)
				}
				unsynced = 0
			}
		}
	}
	if err := f.Datasync(); err != nil {
		f.Close()
		return fmt.Errorf("fdatasync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := fsys.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, path, err)
	}
	if err := fsys.SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("fsync directory of %s: %w", path, err)
	}
	return nil
}

// MkdirAllDurable creates dir and any missing parents, and makes dir's
// entry durable: the parent of every directory it creates is fsynced, and
// so is dir's parent when dir already existed (an earlier run may have
// created it and crashed before anything synced the parent, and a WAL
// whose directory entry is lost is a lost WAL).
func MkdirAllDurable(dir string) error {
	return mkdirAllDurable(osFS{}, dir)
}

func mkdirAllDurable(fsys fileSystem, dir string) error {
	dir = filepath.Clean(dir)
	parent := filepath.Dir(dir)
	st, err := os.Stat(dir)
	switch {
	case err == nil && !st.IsDir():
		return fmt.Errorf("%s: expected a directory, found a file", dir)
	case errors.Is(err, fs.ErrNotExist):
		if parent != dir {
			if err := mkdirAllDurable(fsys, parent); err != nil {
				return err
			}
		}
		if err := fsys.Mkdir(dir); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("create directory %s: %w", dir, err)
		}
	case err != nil:
		return err
	}
	if parent == dir {
		return nil
	}
	if err := fsys.SyncDir(parent); err != nil {
		return fmt.Errorf("fsync directory %s after creating %s: %w", parent, filepath.Base(dir), err)
	}
	return nil
}

// RemoveTemporaries deletes every "*.tmp" file in dir — what an
// interrupted WriteFileAtomic, snapshot or segment creation leaves behind;
// none was ever renamed into place, so nothing in them was acknowledged —
// logs each one, and fsyncs dir if it removed any. It returns the names
// removed.
func RemoveTemporaries(dir string, log *slog.Logger) ([]string, error) {
	return removeTemporaries(osFS{}, dir, log)
}

func removeTemporaries(fsys fileSystem, dir string, log *slog.Logger) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var removed []string
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), tmpSuffix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if err := fsys.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return removed, fmt.Errorf("remove leftover %s: %w", path, err)
		}
		if log != nil {
			log.Info("removed a temporary file left by an interrupted write", "file", path)
		}
		removed = append(removed, e.Name())
	}
	if len(removed) > 0 {
		if err := fsys.SyncDir(dir); err != nil {
			return removed, fmt.Errorf("fsync %s after removing leftovers: %w", dir, err)
		}
	}
	return removed, nil
}
