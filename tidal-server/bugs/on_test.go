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
	if len(names) != int(DropDedupOnRestart) {
		t.Fatalf("names: expected one name per defect (%d), found %d", DropDedupOnRestart, len(names))
	}
	if _, err := parse("ack-before-comit"); err == nil {
		t.Fatal("parse: expected an error for a misspelt defect, found none")
	}
	if got, err := parse(""); err != nil || len(got) != 0 {
		t.Fatalf("parse(\"\"): expected no defects, found %v, %v", got, err)
	}
}
