package wal

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// asNewerRelease runs fn as a build one format version ahead would (what
// SetTestNewerFormat does in a tidalbugs build), restoring this build's
// versions after.
func asNewerRelease(t *testing.T, fn func()) {
	t.Helper()
	defer func() { writeVersion, readVersion = FormatVersion, FormatVersion }()
	writeVersion, readVersion = FormatVersion+1, FormatVersion+1
	fn()
}

// A log written by a newer release is refused with the
// file, the version found and the versions this build reads — before this,
// its segment header failed a version check that reported "corruption",
// and a newest segment so damaged sat one classification away from being
// cut as a torn tail. Nothing on disk may change.
func TestOpenRefusesNewerFormat(t *testing.T) {
	dir := t.TempDir()
	asNewerRelease(t, func() {
		w, _ := mustOpen(t, dir, testOptions())
		mustSave(t, w, Batch{Entries: entries(1, 20, 1), HardState: &HardState{Term: 1, Commit: 20}})
		mustClose(t, w)
	})
	before, err := os.ReadFile(segPath(dir, 0))
	if err != nil {
		t.Fatal(err)
	}

	check := func(what string, err error) {
		t.Helper()
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Fatalf("%s: expected a *FormatError, found %T: %v", what, err, err)
		}
		if fe.File != segPath(dir, 0) || fe.Found != FormatVersion+1 || fe.Supported != FormatVersion {
			t.Fatalf("%s: expected file %s, found %d, supported %d; got %+v", what, segPath(dir, 0), FormatVersion+1, FormatVersion, fe)
		}
		for _, want := range []string{segPath(dir, 0), fmt.Sprintf("format version %d", FormatVersion+1), "newer", fmt.Sprintf("versions %d to %d", MinFormatVersion, FormatVersion)} {
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("%s: message %q does not say %q", what, err, want)
			}
		}
	}
	_, _, err = Open(dir, testOptions())
	check("Open", err)
	_, err = Read(dir)
	check("Read", err)
	_, err = Verify(dir)
	check("Verify", err)
	_, err = Repair(dir, RepairOptions{AllowCommittedLoss: true})
	check("Repair", err)

	after, err := os.ReadFile(segPath(dir, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatal("refusing a newer log changed its segment")
	}
}

// A release that reads the newer version opens a log whose older segments
// are in this build's version: logs mix versions segment by segment.
func TestNewerReleaseReadsOlderSegments(t *testing.T) {
	dir := t.TempDir()
	opts := testOptions()
	w, _ := mustOpen(t, dir, opts)
	for i := uint64(0); i < 40; i++ {
		mustSave(t, w, Batch{Entries: entries(i*20+1, i*20+20, 1)})
	}
	mustClose(t, w)
	asNewerRelease(t, func() {
		rec := reopen(t, dir, opts)
		equalEntries(t, "newer release reading this build's log", rec.Entries, entries(1, 800, 1))
	})
}

func TestFormatErrorSaysOlder(t *testing.T) {
	err := &FormatError{File: "f", What: "WAL segment", Found: 1, MinSupported: 2, Supported: 3}
	if !strings.Contains(err.Error(), "older than this build reads (versions 2 to 3)") {
		t.Fatalf("message %q", err)
	}
}

// CheckFormat reads only headers, and says what Open would refuse.
func TestCheckFormat(t *testing.T) {
	if err := CheckFormat(t.TempDir() + "/missing"); err != nil {
		t.Fatalf("a missing log: %v", err)
	}
	dir := t.TempDir()
	w, _ := mustOpen(t, dir, testOptions())
	mustSave(t, w, Batch{Entries: entries(1, 5, 1)})
	mustClose(t, w)
	if err := CheckFormat(dir); err != nil {
		t.Fatalf("this build's log: %v", err)
	}
	newer := t.TempDir()
	asNewerRelease(t, func() {
		w, _ := mustOpen(t, newer, testOptions())
		mustClose(t, w)
	})
	var fe *FormatError
	if err := CheckFormat(newer); !errors.As(err, &fe) || fe.File != segPath(newer, 0) || fe.Found != FormatVersion+1 {
		t.Fatalf("a newer log: expected a *FormatError naming %s, got %v", segPath(newer, 0), err)
	}
}
