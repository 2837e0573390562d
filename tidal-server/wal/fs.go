package wal

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// fileSystem is every way the WAL changes the disk. It exists so tests can
// make a write or a sync fail at a chosen moment; production uses osFS.
// Reads go straight to the os package: they cannot leave the log half-done.
type fileSystem interface {
	// CreateExclusive creates a new file for writing; it fails if path
	// exists.
	CreateExclusive(path string) (segmentFile, error)
	// OpenWrite opens an existing file for writing.
	OpenWrite(path string) (segmentFile, error)
	Rename(oldpath, newpath string) error
	Remove(path string) error
	// Mkdir creates one directory; its parent must exist.
	Mkdir(path string) error
	// SyncDir makes creations, renames and removals in dir durable.
	SyncDir(dir string) error
}

type segmentFile interface {
	WriteAt(p []byte, off int64) (int, error)
	// Datasync is fdatasync: the data and the metadata needed to read it
	// back (the size) are durable when it returns nil.
	Datasync() error
	// Preallocate makes the file at least size bytes, reading as zeroes.
	Preallocate(size int64) error
	Truncate(size int64) error
	Close() error
}

type osFS struct{}

func (osFS) CreateExclusive(path string) (segmentFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) OpenWrite(path string) (segmentFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }
func (osFS) Remove(path string) error             { return os.Remove(path) }
func (osFS) Mkdir(path string) error              { return os.Mkdir(path, 0o755) }

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

type osFile struct{ f *os.File }

func (o osFile) WriteAt(p []byte, off int64) (int, error) { return o.f.WriteAt(p, off) }
func (o osFile) Truncate(size int64) error                { return o.f.Truncate(size) }
func (o osFile) Close() error                             { return o.f.Close() }

func (o osFile) Datasync() error {
	for {
		err := unix.Fdatasync(int(o.f.Fd()))
		if err != unix.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: o.f.Name(), Err: err}
			}
			return nil
		}
	}
}

// Preallocate reserves blocks with fallocate so that appends do not have
// to allocate (and the file system cannot run out of space mid-record).
// File systems without fallocate get a sparse extension instead.
func (o osFile) Preallocate(size int64) error {
	st, err := o.f.Stat()
	if err != nil {
		return err
	}
	if st.Size() >= size {
		return nil
	}
	err = unix.Fallocate(int(o.f.Fd()), 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return o.f.Truncate(size)
	}
	if err != nil {
		return &os.PathError{Op: "fallocate", Path: o.f.Name(), Err: err}
	}
	return nil
}
