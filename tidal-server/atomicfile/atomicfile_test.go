package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesWithModeAndLeavesNoTemporary(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "node.key")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "new" {
		t.Fatalf("expected %q, found %q (%v)", "new", b, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("expected mode 0600, found %v", st.Mode().Perm())
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("expected only %s in the directory, found %d entries", path, len(ents))
	}
}

// A write that fails part way leaves the old content and no temporary.
func TestFailedWriteKeepsTheOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := WriteFunc(path, 0o600, func(w io.Writer) error {
		w.Write([]byte("half"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("expected the writer's error, found %v", err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != "old" {
		t.Fatalf("expected the old content, found %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("expected the temporary removed, found %d entries", len(ents))
	}
}

func TestWriteNamesThePathItCouldNotCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "ca.crt")
	err := Write(path, nil, 0o644)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("expected a not-exist error, found %v", err)
	}
}
