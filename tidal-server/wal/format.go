package wal

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// Format versions. A segment header carries the version of the record
// format the segment was written in. This build writes versions 1 and
// FormatVersion and reads every version from MinFormatVersion to
// FormatVersion; a segment of a newer version was written by a newer
// tidal-server, and Open, Read and Verify refuse it with a *FormatError
// before replaying anything: reading it as this build's format would be
// reading garbage, and cutting it as a torn tail would destroy the newer
// build's log.
//
// Version 1 segments hold untagged records, all of DefaultGroup; version 2
// segments hold group-tagged records only. A log that never held a record
// of another group is written in version 1 exactly as by releases before
// tagging, so a single-group data dir stays readable by them; the first
// record of another group starts a new segment in version 2, and every
// segment after it is version 2 too (see the package documentation).
//
// The rule for a change to the record format: bump FormatVersion, keep
// decoding every version down to MinFormatVersion, and write the new
// version only in segments created after the change (a log mixes versions
// segment by segment). Raising MinFormatVersion drops the ability to open
// logs of older releases and is a breaking change of its own.
const (
	FormatVersion    = 2
	MinFormatVersion = 1

	// untaggedVersion is the version of segments of a single-group log.
	untaggedVersion = 1
)

// writeVersion is the version written into the headers of new tagged
// segments and readVersion the newest one Open accepts. They differ from
// FormatVersion only under SetTestNewerFormat, which only a tidalbugs
// build has (hooks_tidalbugs.go), or in this package's tests.
var (
	writeVersion uint32 = FormatVersion
	readVersion  uint32 = FormatVersion
)

// taggedVersion reports whether segments of version v hold tagged records.
func taggedVersion(v uint32) bool { return v > untaggedVersion }

// FormatError is a file in a format this build cannot read: written by a
// newer tidal-server (Found above Supported), or by one too old for this
// build to read (Found below MinSupported). Nothing was changed.
type FormatError struct {
	File         string
	What         string // "WAL segment", "snapshot", ...
	Found        uint32
	MinSupported uint32
	Supported    uint32
}

func (e *FormatError) Error() string {
	if e.Found < e.MinSupported {
		return fmt.Sprintf("%s: %s format version %d is older than this build reads (versions %d to %d); "+
			"start a release that reads it, take a backup there, and restore it with this one", e.File, e.What, e.Found, e.MinSupported, e.Supported)
	}
	return fmt.Sprintf("%s: %s format version %d is newer than this build reads (versions %d to %d): "+
		"a newer tidal-server wrote this data dir. Run that release (or a newer one) on it; to go back to this one, "+
		"replace the node (remove the member, wipe, add it under a new id) or restore a backup", e.File, e.What, e.Found, e.MinSupported, e.Supported)
}

// CheckFormat reads only the header of every segment in dir and returns a
// *FormatError for the first written in a version this build does not
// read; nil for a missing or empty dir, and for damage (Open reports that,
// with file and offset). A node checks this before it writes anything
// into a data dir, so a refused start changes nothing.
func CheckFormat(dir string) error {
	seqs, err := listSegments(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("wal: list segments in %s: %w", dir, err)
	}
	for _, seq := range seqs {
		path := filepath.Join(dir, segmentName(seq))
		head, err := readHead(path, segmentHeaderBytes)
		if err != nil {
			return fmt.Errorf("wal: %w", err)
		}
		rec, _, err := decodeRecord(head)
		if err != nil || rec.typ != recSegmentHeader {
			continue
		}
		var fe *FormatError
		if _, err := checkSegmentHeader(rec.payload, seq); errors.As(err, &fe) {
			fe.File = path
			return fe
		}
	}
	return nil
}

// readHead reads up to n bytes from the start of path.
func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	got, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:got], nil
}
