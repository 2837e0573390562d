// Package faultfs is a FUSE filesystem that sits over a directory the way a
// disk sits under a program: it passes every operation through to a backing
// directory, remembers what the program has made durable, and on request
// loses the rest (a power cut), fails fsync the way Linux does, runs out of
// space, slows down, or returns corrupt bytes.
//
// # What durable means
//
// The backing directory is the page cache: it always holds what the program
// sees. Beside it, faultfs keeps only what differs from the durable state:
//
//   - a file's content and size are durable after fsync or fdatasync on it
//     (or a write through an O_SYNC/O_DSYNC descriptor). Until then faultfs
//     holds an undo record for every change (write, truncate, fallocate,
//     hole punch): the bytes and size the change replaced, in order. Other
//     metadata (mode, owner, times, xattrs) is passed through and never
//     rolled back.
//   - a directory entry (create, mkdir, mknod, symlink, link, unlink, rmdir,
//     rename) is durable only after fsync of the directory that holds it.
//     Before a directory's first entry change since its last fsync, faultfs
//     snapshots its entries (name -> inode); fsync of the directory drops
//     the snapshot. This is the strict POSIX/ALICE model: ext4 would also
//     commit the entry of a newly created file on the file's own fsync,
//     faultfs does not. A rename is two entry changes: removing the source
//     name is durable with the source directory's fsync, adding the
//     destination name with the destination directory's. A directory can be
//     durable in only one place, so fsync of a directory that now holds a
//     moved-in subdirectory also drops that subdirectory from any other
//     directory's snapshot.
//   - a file whose name is durable but whose data never was is empty after a
//     power cut; a directory that was never fsynced is empty.
//   - syncfs(2) and sync(2) never reach a FUSE server (the kernel sends
//     FUSE_SYNCFS only to virtiofs), so they make nothing durable here;
//     FS.Sync does what a real syncfs would.
//
// An inode that a durable entry still names but the program has removed
// (unlink, rename over it, rmdir) is kept alive under a hidden state
// directory inside the backing directory (StateDirName), hard-linked for a
// file and moved there for an empty directory, until no durable entry
// names it. This also keeps its inode number from being reused, so inode
// numbers identify files for as long as faultfs tracks them.
//
// # Power cut
//
// FS.PowerCut detaches the mount at once (handles opened before it fail
// with EIO, or ENOTCONN once the kernel drops the old connection), undoes
// every file's unsynced changes newest first, rebuilds the namespace from
// the durable entries (hard links, so surviving files keep their inodes),
// and mounts a fresh connection on the same mountpoint: a reboot, with
// empty kernel caches. With TornWrites each file instead keeps a seeded
// random prefix of its unsynced changes, the last kept write possibly cut
// at a 512-byte sector boundary, as a disk may. The caller kills the
// program first (kill -9): a program that survives the cut sees its
// descriptors fail.
//
// # Faults
//
// See Faults: FsyncError, DiskFull, SlowDisk, CorruptRead. A failed fsync
// follows Linux since 4.13 (errseq): the call that fails returns EIO and
// the file's unsynced changes are dropped, from the durable state and from
// the page cache (reads return the durable bytes at once; Linux may serve
// the lost bytes until the pages are evicted); every other descriptor open
// on the file at the time gets EIO once on its next fsync; later fsyncs
// succeed, and the lost data stays lost. Sticky makes every later fsync on
// a matching file fail too, until the fault is cleared.
//
// Files are opened with FOPEN_DIRECT_IO, so every read and write reaches
// faultfs (the kernel keeps no page cache of its own that a fault could
// miss). A shared mmap works on Linux 6.6 and later (the mount asks for
// FUSE's DIRECT_IO_ALLOW_MMAP): a direct write drops the mapped pages it
// covers, and a mapped page is read through faultfs when first faulted
// in, then from the page cache; older kernels refuse the mmap (ENODEV).
package faultfs
