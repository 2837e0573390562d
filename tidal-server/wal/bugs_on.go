//go:build tidalbugs

package wal

import (
	"fmt"
	"log/slog"

	"github.com/tidaldb/tidal/tidal-server/bugs"
)

// plantedDropLastEntry is the drop-last-record-on-recovery defect: before
// Open replays the log, it cuts the newest segment at its last entry
// record, as a recovery that takes a good final record for a torn write
// would. It logs the cut exactly like a genuine torn tail, so the node's
// log does not give the defect away; the records dropped were written
// and fdatasynced whole.
func plantedDropLastEntry(fsys fileSystem, dir string, log *slog.Logger) error {
	if !bugs.Active(bugs.DropLastRecordOnRecovery) {
		return nil
	}
	seqs, err := listSegments(dir)
	if err != nil || len(seqs) == 0 {
		return nil // Open reports a listing error itself
	}
	scan, err := readSegment(dir, seqs[len(seqs)-1])
	if err != nil {
		return nil
	}
	cut := int64(-1)
	for _, r := range scan.records {
		if r.typ == recEntry {
			cut = r.offset
		}
	}
	if cut < 0 {
		return nil
	}
	f, err := fsys.OpenWrite(scan.path)
	if err != nil {
		return fmt.Errorf("wal: open newest segment: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(cut); err != nil {
		return fmt.Errorf("wal: truncate torn tail of %s at %d: %w", scan.path, cut, err)
	}
	if err := f.Datasync(); err != nil {
		return fmt.Errorf("wal: sync %s: %w", scan.path, err)
	}
	log.Warn("wal: truncated torn tail of the newest segment", "file", scan.path, "offset", cut, "bytes", scan.end-cut)
	return nil
}
