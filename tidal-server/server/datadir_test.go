package server

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
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

// storedConfig is a data dir's configuration: every member of all a voter,
// except the ids in learners.
func storedConfig(t *testing.T, all string, learners ...uint64) replica.StoredConfig {
	t.Helper()
	cfg := replica.StoredConfig{Index: 7}
	if all == "" {
		return cfg
	}
	cfg.Members = members(t, all)
	for _, m := range cfg.Members {
		if !slices.Contains(learners, m.ID) {
			cfg.Voters = append(cfg.Voters, m.ID)
		}
	}
	return cfg
}

// A data dir holding a one-member cluster started with a three-member
// --peers ran as that one-member cluster. The rule refuses --peers sharing
// less than a majority of voters with the stored configuration, or giving
// a shared member another address; it accepts the address books a restart
// after membership changes brings. Learners count on neither side.
func TestComparePeers(t *testing.T) {
	for _, tc := range []struct {
		name, stored, peers string
		learners            []uint64
		refused             bool
	}{
		{"same cluster", "1=h:1,2=h:2,3=h:3", "1=h:1,2=h:2,3=h:3", nil, false},
		{"one-member data dir, three-member peers", "1=h:1", "1=h:1,2=h:2,3=h:3", nil, true},
		{"a member replaced while this node was down", "1=h:1,2=h:2,3=h:3", "1=h:1,2=h:2,5=h:3", nil, false},
		{"a member added while this node was down", "1=h:1,2=h:2,3=h:3", "1=h:1,2=h:2,3=h:3,4=h:4", nil, false},
		{"two of five replaced", "1=h:1,2=h:2,3=h:3,4=h:4,5=h:5", "1=h:1,4=h:4,5=h:5,6=h:2,7=h:3", nil, false},
		{"another cluster", "1=h:1,2=h:2,3=h:3", "1=h:1,4=h:4,5=h:5", nil, true},
		{"a shared member at another address", "1=h:1,2=h:2,3=h:3", "1=h:1,2=h:9,3=h:3", nil, true},
		{"a shared learner at another address", "1=h:1,2=h:2,3=h:3,4=h:4", "1=h:1,2=h:2,3=h:3,4=h:9", []uint64{4}, true},
		{"a new data dir", "", "1=h:1,2=h:2,3=h:3", nil, false},
		{"Regression: learners do not count in the peers check",
			"1=h:1,2=h:2,3=h:3,401=h:401,402=h:402,403=h:403,404=h:404", "1=h:1,2=h:2,3=h:3", []uint64{401, 402, 403, 404}, false},
		{"--peers listing the learners too",
			"1=h:1,2=h:2,3=h:3,401=h:401,402=h:402,403=h:403,404=h:404", "1=h:1,2=h:2,3=h:3,401=h:401,402=h:402,403=h:403,404=h:404", []uint64{401, 402, 403, 404}, false},
		{"--peers sharing the learners but one voter",
			"1=h:1,2=h:2,3=h:3,4=h:4,5=h:5,6=h:6,7=h:7", "1=h:1,4=h:4,5=h:5,6=h:6,7=h:7", []uint64{4, 5, 6, 7}, true},
		{"a learner promoted while this node was down",
			"1=h:1,2=h:2,3=h:3,4=h:4", "1=h:1,2=h:2,3=h:3,4=h:4", []uint64{4}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := comparePeers("d", storedConfig(t, tc.stored, tc.learners...), members(t, tc.peers))
			if (err != nil) != tc.refused {
				t.Fatalf("stored %s (learners %v), --peers %s: refused=%v expected, got %v", tc.stored, tc.learners, tc.peers, tc.refused, err)
			}
			if err != nil && !strings.Contains(err.Error(), tc.stored) {
				t.Fatalf("the refusal should name the stored membership %s: %v", tc.stored, err)
			}
		})
	}
}

// The refusal names the voters it expected and those it found.
func TestComparePeersNamesVoters(t *testing.T) {
	stored := storedConfig(t, "1=h:1,2=h:2,3=h:3,4=h:4,5=h:5", 4, 5)
	err := comparePeers("d", stored, members(t, "1=h:1,8=h:8,9=h:9"))
	if err == nil {
		t.Fatal("--peers sharing one voter of three: expected a refusal")
	}
	for _, want := range []string{"voters [1 2 3]", "found voters [1 8 9]", "share 1 voter(s) [1]", "learners [4 5]"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("the refusal should say %q: %v", want, err)
		}
	}
}

// Regression: the schema fingerprint is written through
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
