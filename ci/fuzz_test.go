// Package ci holds the scripts CI systems call; this test drives the
// decisions those scripts make against sample outputs.
package ci

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// Regression: ci/fuzz retried any failed run whose
// output contained "context deadline exceeded" anywhere, so a real
// failure of a seed corpus entry that mentions a deadline was retried and
// hidden by a passing second run. Only the fuzz engine's own deadline —
// the target's FAIL line followed by that sentence alone, no sub-test
// failing, no failing input written — is retried now.
func TestFuzzRetriesOnlyTheEnginesDeadline(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("ci/fuzz is a bash script; no bash here")
	}
	for _, tc := range []struct {
		name     string
		output   string
		newFiles int
		retry    bool
	}{
		{
			name: "engine deadline, nothing found",
			output: `fuzz: elapsed: 0s, gathering baseline coverage: 0/12 completed
fuzz: elapsed: 3s, execs: 20341 (6779/sec), new interesting: 2 (total: 14)
fuzz: elapsed: 10s, execs: 60022 (5671/sec), new interesting: 3 (total: 15)
--- FAIL: FuzzDecode (10.04s)
    context deadline exceeded
FAIL
exit status 1
FAIL	github.com/tidaldb/tidal/tidal-server/wal	10.113s
`,
			retry: true,
		},
		{
			name: "seed corpus entry fails with a deadline in its message",
			output: `--- FAIL: FuzzDecode (0.01s)
    --- FAIL: FuzzDecode/seed#3 (0.00s)
        decode_test.go:41: read record: context deadline exceeded
FAIL
exit status 1
FAIL	github.com/tidaldb/tidal/tidal-server/wal	0.113s
`,
		},
		{
			name: "seed corpus entry whose message is the bare sentence",
			output: `--- FAIL: FuzzDecode (0.01s)
    --- FAIL: FuzzDecode/5f3a9c (0.00s)
        context deadline exceeded
FAIL
`,
		},
		{
			name: "the target's own failure quotes a deadline inside a longer line",
			output: `--- FAIL: FuzzDecode (2.31s)
    client call failed: context deadline exceeded
FAIL
`,
		},
		{
			name: "a deadline logged elsewhere, the failure is something else",
			output: `fuzz: elapsed: 3s, execs: 1 (0/sec)
2026/12/01 10:00:00 retrying: context deadline exceeded
--- FAIL: FuzzDecode (4.02s)
    fuzzing process hung or terminated unexpectedly: exit status 2
FAIL
`,
		},
		{
			name: "fuzzing found an input",
			output: `--- FAIL: FuzzDecode (3.20s)
    --- FAIL: FuzzDecode (0.00s)
        decode_test.go:41: context deadline exceeded
    Failing input written to testdata/fuzz/FuzzDecode/771e938e4458e983
    To re-run:
    go test -run=FuzzDecode/771e938e4458e983
FAIL
`,
		},
		{
			name: "engine deadline text, but a new corpus file appeared",
			output: `--- FAIL: FuzzDecode (10.04s)
    context deadline exceeded
FAIL
`,
			newFiles: 1,
		},
		{
			name: "another target's deadline",
			output: `--- FAIL: FuzzEncode (10.04s)
    context deadline exceeded
FAIL
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			if err := os.WriteFile(out, []byte(tc.output), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("bash", "fuzz", "--should-retry", out, "FuzzDecode", strconv.Itoa(tc.newFiles))
			msg, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			switch {
			case err == nil:
				if !tc.retry {
					t.Errorf("expected no retry (a real failure), found the script would retry it; output:\n%s", tc.output)
				}
			case errors.As(err, &exit) && exit.ExitCode() == 1:
				if tc.retry {
					t.Errorf("expected a retry of the engine's own deadline, found the script would fail; output:\n%s", tc.output)
				}
			default:
				t.Fatalf("ci/fuzz --should-retry: %v\n%s", err, msg)
			}
		})
	}
}
