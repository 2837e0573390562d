package faultfs

import (
	"sync"
	"sync/atomic"
	"time"
)

// opcode is one FUSE operation faultfs serves; each belongs to an Op class
// (what SlowDisk delays) and has its own counter.
type opcode int

const (
	opLookup opcode = iota
	opGetattr
	opSetattr
	opStatfs
	opXattr
	opReaddir
	opReadlink
	opOpen
	opRelease
	opRead
	opWrite
	opFsync
	opFdatasync
	opFsyncDir
	opTruncate
	opFallocate
	opCreate
	opMkdir
	opMknod
	opSymlink
	opLink
	opUnlink
	opRmdir
	opRename
	numOpcodes
)

var opcodes = [numOpcodes]struct {
	name  string
	class Op
}{
	opLookup:    {"lookup", OpMetadata},
	opGetattr:   {"getattr", OpMetadata},
	opSetattr:   {"setattr", OpMetadata},
	opStatfs:    {"statfs", OpMetadata},
	opXattr:     {"xattr", OpMetadata},
	opReaddir:   {"readdir", OpMetadata},
	opReadlink:  {"readlink", OpMetadata},
	opOpen:      {"open", OpOpen},
	opRelease:   {"release", OpOpen},
	opRead:      {"read", OpRead},
	opWrite:     {"write", OpWrite},
	opFsync:     {"fsync", OpFsync},
	opFdatasync: {"fdatasync", OpFsync},
	opFsyncDir:  {"fsyncdir", OpFsync},
	opTruncate:  {"truncate", OpTruncate},
	opFallocate: {"fallocate", OpTruncate},
	opCreate:    {"create", OpCreate},
	opMkdir:     {"mkdir", OpCreate},
	opMknod:     {"mknod", OpCreate},
	opSymlink:   {"symlink", OpCreate},
	opLink:      {"link", OpRename},
	opUnlink:    {"unlink", OpRemove},
	opRmdir:     {"rmdir", OpRemove},
	opRename:    {"rename", OpRename},
}

func (o opcode) String() string { return opcodes[o].name }

// Stats is what a mount has done since Mount, for the run store.
type Stats struct {
	// Ops counts served operations by name (lookup, write, fsync,
	// fdatasync, fsyncdir, rename, ...); operations refused because
	// their mount was cut are not counted.
	Ops          map[string]uint64 `json:"ops"`
	BytesRead    uint64            `json:"bytes_read"`
	BytesWritten uint64            `json:"bytes_written"`
	Faults       FaultStats        `json:"faults"`
	// Unsynced is what a power cut now would lose.
	Unsynced Unsynced `json:"unsynced"`
	// PowerCuts counts power cuts; LastPowerCut reports the latest.
	PowerCuts    uint64          `json:"power_cuts"`
	LastPowerCut *PowerCutReport `json:"last_power_cut,omitempty"`
	// DeadHandleErrors counts operations refused with EIO because they
	// came through a handle or mount from before a power cut.
	DeadHandleErrors uint64 `json:"dead_handle_errors"`
}

// FaultStats counts injected faults.
type FaultStats struct {
	// FsyncEIO counts fsyncs failed by an FsyncError fault;
	// LostWritebackEIO counts later fsyncs through other descriptors that
	// reported that loss once; LostBytes sums the unsynced bytes dropped.
	FsyncEIO         uint64 `json:"fsync_eio"`
	LostWritebackEIO uint64 `json:"lost_writeback_eio"`
	LostBytes        uint64 `json:"lost_bytes"`
	// ENOSPC counts operations failed or cut short by DiskFull.
	ENOSPC uint64 `json:"enospc"`
	// Delayed counts operations a SlowDisk fault delayed or stalled.
	Delayed uint64 `json:"delayed"`
	Stalled uint64 `json:"stalled"`
	// CorruptReads counts reads that returned flipped bits; CorruptBytes
	// the bytes changed.
	CorruptReads uint64 `json:"corrupt_reads"`
	CorruptBytes uint64 `json:"corrupt_bytes"`
}

// Unsynced is the state a power cut would roll back.
type Unsynced struct {
	Files int `json:"files"` // files with unsynced changes
	// Changes counts their undo records; HeldBytes the non-zero bytes
	// those records keep in memory.
	Changes   int   `json:"changes"`
	HeldBytes int64 `json:"held_bytes"`
	Dirs      int   `json:"dirs"` // directories with unsynced entry changes
	// Graveyard counts removed inodes kept because a durable entry names
	// them.
	Graveyard int `json:"graveyard"`
}

// PowerCutReport is what one power cut discarded.
type PowerCutReport struct {
	At time.Time `json:"at"`
	// Files is how many files had unsynced changes undone, fully or in
	// part; Torn how many of them kept a prefix (TornWrites).
	Files int `json:"files"`
	Torn  int `json:"torn"`
	// ChangesUndone counts undone writes, truncates and fallocates;
	// BytesDiscarded sums the bytes they had written or removed.
	ChangesUndone  int   `json:"changes_undone"`
	BytesDiscarded int64 `json:"bytes_discarded"`
	// EntriesRolledBack counts directory entries that differed from the
	// durable ones: created, removed or pointed elsewhere since their
	// directory's last fsync.
	EntriesRolledBack int `json:"entries_rolled_back"`
	// OutOfOrder: the cut kept a seeded subset of the dirty pages
	// (PowerCutOptions.OutOfOrder); PagesKept counts them, PagesDropped
	// the dirty pages that went back to their durable content.
	OutOfOrder   bool `json:"out_of_order,omitempty"`
	PagesKept    int  `json:"pages_kept,omitempty"`
	PagesDropped int  `json:"pages_dropped,omitempty"`
	// Seed is the seed TornWrites or OutOfOrder used.
	Seed int64 `json:"seed,omitempty"`
	// Duration is how long the rollback and remount took.
	Duration time.Duration `json:"duration_ns"`
}

type counters struct {
	ops          [numOpcodes]atomic.Uint64
	bytesRead    atomic.Uint64
	bytesWritten atomic.Uint64
	deadHandle   atomic.Uint64

	fsyncEIO, lostWritebackEIO, lostBytes atomic.Uint64
	enospc, delayed, stalled              atomic.Uint64
	corruptReads, corruptBytes            atomic.Uint64

	mu        sync.Mutex
	powerCuts uint64
	lastCut   *PowerCutReport
}

func (c *counters) snapshot() Stats {
	s := Stats{
		Ops:              make(map[string]uint64, numOpcodes),
		BytesRead:        c.bytesRead.Load(),
		BytesWritten:     c.bytesWritten.Load(),
		DeadHandleErrors: c.deadHandle.Load(),
		Faults: FaultStats{
			FsyncEIO:         c.fsyncEIO.Load(),
			LostWritebackEIO: c.lostWritebackEIO.Load(),
			LostBytes:        c.lostBytes.Load(),
			ENOSPC:           c.enospc.Load(),
			Delayed:          c.delayed.Load(),
			Stalled:          c.stalled.Load(),
			CorruptReads:     c.corruptReads.Load(),
			CorruptBytes:     c.corruptBytes.Load(),
		},
	}
	for i := range c.ops {
		s.Ops[opcode(i).String()] = c.ops[i].Load()
	}
	c.mu.Lock()
	s.PowerCuts = c.powerCuts
	if c.lastCut != nil {
		r := *c.lastCut
		s.LastPowerCut = &r
	}
	c.mu.Unlock()
	return s
}

func (c *counters) powerCut(r PowerCutReport) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.powerCuts++
	c.lastCut = &r
}
