package server

import (
	"fmt"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// Regression (found by profiling): decoding a signals command on the
// apply path allocates one string for the whole command, not one per
// field name per event (what+" length" was built for every id and signal).
func TestDecodeSignalsIntoAllocatesOnce(t *testing.T) {
	events := make([]ledger.Event, 100)
	for i := range events {
		events[i] = ledger.Event{ID: fmt.Sprintf("id-%d", i), Entity: uint64(i + 1), Signal: "view", Weight: 1.5, TS: 1700000000000 + int64(i)}
	}
	cmd := encodeSignals(events)
	names := []string{"view", "like", "share", "skip"}
	dst := make([]ledger.Event, 0, len(events))
	allocs := testing.AllocsPerRun(50, func() {
		out, err := decodeSignalsInto(dst[:0], cmd, names)
		if err != nil || len(out) != len(events) {
			t.Fatalf("decoded %d events, err %v", len(out), err)
		}
	})
	if allocs > 1 {
		t.Errorf("a 100-event command took %v allocations to decode; want 1 (the command's string)", allocs)
	}
	got, err := decodeSignalsInto(nil, cmd, names)
	if err != nil {
		t.Fatal(err)
	}
	for i := range events {
		if got[i] != events[i] {
			t.Fatalf("event %d: decoded %+v, encoded %+v", i, got[i], events[i])
		}
	}
}
