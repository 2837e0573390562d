package replica

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Each start takes a new epoch; running out of counter moves to the next
// epoch durably before using it, so the next start begins above it.
func TestRequestIDEpochs(t *testing.T) {
	dir := t.TempDir()
	g1, err := openRequestIDs(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := g1.next()
	if a != 1<<requestCounterBits|1 {
		t.Fatalf("first id of a new data dir is %#x, expected epoch 1 counter 1", a)
	}
	// The counter of epoch 1 runs out: the next id is in epoch 2, which
	// must be on disk before it is returned.
	g1.last.Store(2<<requestCounterBits - 1)
	b, err := g1.next()
	if err != nil {
		t.Fatal(err)
	}
	if b>>requestCounterBits != 2 {
		t.Fatalf("id after the counter ran out is %#x, expected epoch 2", b)
	}
	if e, err := readRequestEpoch(filepath.Join(dir, requestEpochFile)); err != nil || e != 2 {
		t.Fatalf("persisted epoch (%d, %v) after moving to epoch 2, expected 2", e, err)
	}
	g2, err := openRequestIDs(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := g2.next()
	if c <= b {
		t.Fatalf("first id after restart %#x is not above the last id before it %#x", c, b)
	}
}

// A damaged epoch file stops the start with the file named, rather than
// guessing an epoch that may already have been used.
func TestRequestIDEpochDamaged(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, requestEpochFile)
	if err := os.WriteFile(path, []byte("1x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := openRequestIDs(dir)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("open over a damaged epoch file: %v, expected an error naming %s", err, path)
	}
}
