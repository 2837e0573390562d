package checker

import (
	"encoding/json"
	"math"
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

// KeyedOps gives each key's processes dense client ids of their own, puts
// a pending operation's return at the end of time, and Search reports
// every key in key order: here key 2 (a read of 5 after an add of 2) is
// illegal and key 1 legal only because its pending add may have applied.
func TestKeyedOps(t *testing.T) {
	pair := func(process history.Process, call, ret int64) history.Pair {
		return history.Pair{
			Invoke:     history.Op{Process: process, Type: history.Invoke, Time: call},
			Completion: history.Op{Process: process, Type: history.OK, Time: ret},
		}
	}
	h := NewKeyedOps[uint64]()
	h.Add(2, pair(5, 0, 10), counterInput{delta: 2}, int64(0), false)
	h.Add(2, pair(9, 20, 30), counterInput{read: true}, int64(5), false)
	h.Add(1, pair(9, 0, 10), counterInput{delta: 3}, int64(0), true)
	h.Add(1, pair(7, 20, 30), counterInput{read: true}, int64(3), false)
	if got := h.ops[1][0]; got.ClientId != 0 || got.Return != math.MaxInt64 || h.pending[1] != 1 {
		t.Fatalf("key 1's pending add: client %d return %d pending %d; expected client 0, return MaxInt64, 1 pending", got.ClientId, got.Return, h.pending[1])
	}
	if got := h.ops[2][1].ClientId; got != 1 {
		t.Fatalf("key 2's second process: client id %d, expected 1 (dense per key)", got)
	}
	out, illegal, unknown := h.Search(counterModel, 0, "adds", nil)
	if len(out) != 2 || out[0].Key != 1 || out[1].Key != 2 {
		t.Fatalf("expected keys 1 and 2 in order, found %+v", out)
	}
	if out[0].Result != "ok" || out[1].Result != "illegal" || illegal != 1 || unknown != 0 {
		t.Fatalf("expected key 1 ok and key 2 illegal, found %+v (illegal %d, unknown %d)", out, illegal, unknown)
	}
	if out[0].Ops != 2 || out[0].Pending != 1 {
		t.Fatalf("key 1: %d ops %d pending, expected 2 and 1", out[0].Ops, out[0].Pending)
	}
}
