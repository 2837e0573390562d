package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

func members(t *testing.T, s string) []replica.Member {
	t.Helper()
	ms, err := ParsePeers(s)
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// Regression (issue 9 item 8): a data dir holding a one-member cluster
// started with a three-member --peers ran as that one-member cluster. The
// rule refuses --peers sharing less than a majority with the stored
// membership, or giving a shared member another address; it accepts the
// address books a restart after membership changes brings.
func TestComparePeers(t *testing.T) {
	for _, tc := range []struct {
		name, stored, peers string
		refused             bool
	}{
		{"same cluster", "1=h:1,2=h:2,3=h:3", "1=h:1,2=h:2,3=h:3", false},
		{"one-member data dir, three-member peers", "1=h:1", "1=h:1,2=h:2,3=h:3", true},
		{"a member replaced while this node was down", "1=h:1,2=h:2,3=h:3", "1=h:1,2=h:2,5=h:3", false},
		{"a member added while this node was down", "1=h:1,2=h:2,3=h:3", "1=h:1,2=h:2,3=h:3,4=h:4", false},
		{"two of five replaced", "1=h:1,2=h:2,3=h:3,4=h:4,5=h:5", "1=h:1,4=h:4,5=h:5,6=h:2,7=h:3", false},
		{"another cluster", "1=h:1,2=h:2,3=h:3", "1=h:1,4=h:4,5=h:5", true},
		{"a shared member at another address", "1=h:1,2=h:2,3=h:3", "1=h:1,2=h:9,3=h:3", true},
		{"a new data dir", "", "1=h:1,2=h:2,3=h:3", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stored []replica.Member
			if tc.stored != "" {
				stored = members(t, tc.stored)
			}
			err := comparePeers("d", stored, 7, members(t, tc.peers))
			if (err != nil) != tc.refused {
				t.Fatalf("stored %s, --peers %s: refused=%v expected, got %v", tc.stored, tc.peers, tc.refused, err)
			}
			if err != nil && !strings.Contains(err.Error(), tc.stored) {
				t.Fatalf("the refusal should name the stored membership %s: %v", tc.stored, err)
			}
		})
	}
}

// Regression (issue 9 item 5): the schema fingerprint is written through
// a temporary file (none is left behind), and an empty fingerprint left by
// an older version is reported as such, with the way out.
func TestSchemaFingerprintWrittenAtomically(t *testing.T) {
	dir := t.TempDir()
	schema := ledger.DefaultSchema()
	if err := checkSchemaMatches(dir, schema); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, schemaFileName))
	if err != nil || strings.TrimSpace(string(got)) != schemaFingerprint(schema) {
		t.Fatalf("fingerprint: expected %q, got %q (%v)", schemaFingerprint(schema), got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, schemaFileName+".tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("expected no temporary file left, stat says %v", err)
	}
	if err := checkSchemaMatches(dir, schema); err != nil {
		t.Fatalf("second start with the same schema: %v", err)
	}

	if err := os.WriteFile(filepath.Join(dir, schemaFileName), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = checkSchemaMatches(dir, schema)
	if err == nil || !strings.Contains(err.Error(), "is empty") || !strings.Contains(err.Error(), "remove the file") {
		t.Fatalf("empty fingerprint: expected an error saying it is empty and how to recover, got %v", err)
	}
}
