package checker

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/tidaldb/tidal/harness/history"
)

// SearchKeys decides each key alone: a legal key ok, an illegal one
// illegal with its visualization written, in the order given.
func TestSearchKeys(t *testing.T) {
	add := func(client int, call, ret int64, delta int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: counterInput{delta: delta}, Call: call, Return: ret}
	}
	read := func(client int, call, ret int64, v int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: counterInput{read: true}, Output: v, Call: call, Return: ret}
	}
	legal := []porcupine.Operation{add(0, 0, 10, 2), read(1, 20, 30, 2)}
	illegal := []porcupine.Operation{add(0, 0, 10, 2), read(1, 20, 30, 5)}
	dir := t.TempDir()
	var visualized []int
	got := SearchKeys(counterModel, [][]porcupine.Operation{legal, illegal}, 0,
		func(i int, info porcupine.LinearizationInfo) (string, error) {
			visualized = append(visualized, i)
			path := filepath.Join(dir, "key.html")
			return path, VisualizeWithFaults(counterModel, info, nil, path)
		},
		func(int) string { return "2 ops" })
	if len(got) != 2 || got[0].Result != "ok" || got[1].Result != "illegal" {
		t.Fatalf("expected ok then illegal, found %+v", got)
	}
	if len(visualized) != 1 || visualized[0] != 1 || got[1].Visualization == "" {
		t.Fatalf("expected the illegal key alone visualized, found %v and %+v", visualized, got[1])
	}
	if _, err := os.Stat(got[1].Visualization); err != nil {
		t.Fatalf("expected the visualization written: %v", err)
	}
}

func TestTally(t *testing.T) {
	il, un := Tally([]KeySearch{{Result: "ok"}, {Result: "illegal"}, {Result: "unknown"}, {Result: "unknown"}})
	if il != 1 || un != 2 {
		t.Fatalf("expected 1 illegal and 2 unknown, found %d and %d", il, un)
	}
}

func TestOkCounterRead(t *testing.T) {
	pair := func(completion string) history.Pair {
		return history.Pair{Completion: history.Op{Type: history.OK, F: history.FRead, Value: json.RawMessage(completion)}}
	}
	if k, v, err := okCounterRead(pair(`{"key":7,"value":3}`)); err != nil || k != 7 || v != 3 {
		t.Fatalf("expected key 7 value 3, found %d %d %v", k, v, err)
	}
	if _, _, err := okCounterRead(pair(`{"key":7,"value":null}`)); err == nil {
		t.Fatal("an ok read without a value: expected an error")
	}
}
