//go:build tidalbugs

package bugs

import "testing"

func TestParseNamesEveryDefectAndRefusesUnknownOnes(t *testing.T) {
	got, err := parse(" ack-before-commit,local-linearizable-reads ,")
	if err != nil {
		t.Fatal(err)
	}
	if !got[AckBeforeCommit] || !got[LocalLinearizableReads] || got[DropDedupOnRestart] || len(got) != 2 {
		t.Fatalf("parse: expected exactly ack-before-commit and local-linearizable-reads, found %v", got)
	}
	if len(names) != int(lastDefect) {
		t.Fatalf("names: expected one name per defect (%d), found %d", lastDefect, len(names))
	}
	seen := map[Defect]bool{}
	for name, d := range names {
		if d < 1 || d > lastDefect || seen[d] {
			t.Fatalf("names[%q] = %d: expected a distinct defect in 1..%d", name, d, lastDefect)
		}
		seen[d] = true
	}
	// The checkers' own defects.
	got, err = parse("drop-vectors-in-snapshot,window-off-by-one-bucket,decay-wrong-half-life,ignore-embedding-overwrite")
	if err != nil {
		t.Fatal(err)
	}
	if !got[DropVectorsInSnapshot] || !got[WindowOffByOneBucket] || !got[DecayWrongHalfLife] || !got[IgnoreEmbeddingOverwrite] || len(got) != 4 {
		t.Fatalf("parse: expected exactly drop-vectors-in-snapshot, window-off-by-one-bucket, decay-wrong-half-life and ignore-embedding-overwrite, found %v", got)
	}
	if _, err := parse("ack-before-comit"); err == nil {
		t.Fatal("parse: expected an error for a misspelt defect, found none")
	}
	if got, err := parse(""); err != nil || len(got) != 0 {
		t.Fatalf("parse(\"\"): expected no defects, found %v, %v", got, err)
	}
}

func TestEnableSwitchesOnAndRestores(t *testing.T) {
	if Active(IgnoreFsyncError) {
		t.Skip("TIDAL_BUGS switched ignore-fsync-error on for the whole test process")
	}
	restore := Enable(IgnoreFsyncError, SkipDirFsync)
	if !Active(IgnoreFsyncError) || !Active(SkipDirFsync) {
		t.Fatal("Enable: expected ignore-fsync-error and skip-dir-fsync active")
	}
	restore()
	if Active(IgnoreFsyncError) || Active(SkipDirFsync) {
		t.Fatal("restore: expected both inactive again")
	}
}
