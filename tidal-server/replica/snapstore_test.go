package replica

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Regression (issue 9 item 5): the temporary file of a snapshot write a
// crash interrupted survived every restart. Opening the store removes it,
// with a log line naming it, and keeps the snapshots themselves.
func TestSnapStoreRemovesLeftoverTemporaries(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "snap")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, snapName(2, 40)+".tmp")
	kept := filepath.Join(dir, snapName(2, 30))
	for _, f := range []string{tmp, kept} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logged bytes.Buffer
	if _, err := newSnapStore(dir, slog.New(slog.NewTextHandler(&logged, nil))); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("expected %s removed, stat says %v", filepath.Base(tmp), err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("expected the snapshot %s kept: %v", filepath.Base(kept), err)
	}
	if !strings.Contains(logged.String(), filepath.Base(tmp)) {
		t.Fatalf("expected a log line naming %s, log was:\n%s", filepath.Base(tmp), logged.String())
	}
}
