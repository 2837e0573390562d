package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWorkspaceAndRemoveWork(t *testing.T) {
	repoDir := t.TempDir()
	repo, outDir, work, err := workspace(repoDir, "bench/results", "tidal-bench-test-")
	if err != nil {
		t.Fatal(err)
	}
	if repo != repoDir || outDir != filepath.Join(repoDir, "bench/results") {
		t.Fatalf("expected repo %s and results under it, found %s and %s", repoDir, repo, outDir)
	}
	if st, err := os.Stat(outDir); err != nil || !st.IsDir() {
		t.Fatalf("expected the results directory made, found %v", err)
	}
	abs := filepath.Join(t.TempDir(), "elsewhere")
	if _, o, w2, err := workspace(repoDir, abs, "tidal-bench-test-"); err != nil || o != abs {
		t.Fatalf("an absolute -out: expected %s as is, found %s (%v)", abs, o, err)
	} else {
		os.RemoveAll(w2)
	}

	var ok error
	removeWork(work, false, &ok)
	if _, err := os.Stat(work); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a run that succeeded: expected its working directory removed, found %v", err)
	}
	_, _, work, _ = workspace(repoDir, "bench/results", "tidal-bench-test-")
	t.Cleanup(func() { os.RemoveAll(work) })
	failed := errors.New("run failed")
	removeWork(work, false, &failed)
	if _, err := os.Stat(work); err != nil {
		t.Fatalf("a run that failed: expected its working directory kept, found %v", err)
	}
	ok = nil
	removeWork(work, true, &ok)
	if _, err := os.Stat(work); err != nil {
		t.Fatalf("-keep: expected the working directory kept, found %v", err)
	}
}
