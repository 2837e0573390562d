// Package atomicfile replaces whole files so that a crash leaves either the
// old file or the new one, never a torn one, and the replacement itself is
// durable once the call returns: write a temporary file in the same
// directory, fsync it, rename it over the target, fsync the directory.
//
// It serves small files written rarely (certificates, token files, run
// records). The WAL keeps its own version (wal.WriteFileAtomic) because its
// tests inject faults through the WAL's file-system seam.
package atomicfile

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, with file mode mode.
func Write(path string, data []byte, mode fs.FileMode) error {
	return WriteFunc(path, mode, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteFunc replaces path with what write writes, with file mode mode. On
// any error the temporary file is removed and path is untouched.
func WriteFunc(path string, mode fs.FileMode, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create a temporary file for %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// The mode is set before any byte is written: a key file must never
	// exist, even briefly, readable by others.
	if err = tmp.Chmod(mode); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	bw := bufio.NewWriterSize(tmp, 64<<10)
	if err = write(bw); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp.Name(), path, err)
	}
	return SyncDir(dir)
}

// SyncDir makes the creates, renames and removals in dir durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
