package api

import (
	"fmt"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// Event ids are substrings of one copy of the body (build item
// 2): a 100-event batch decodes with a fixed handful of allocations, not
// one per id, and ids with escapes still come out decoded.
func TestDecodeSignalsIDsShareOneString(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"events":[`)
	for i := range 100 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"id-%d","entity":%d,"signal":"view","weight":1.5,"ts":1700000000%03d}`, i, i+1, i)
	}
	b.WriteString(`]}`)
	body, schema := []byte(b.String()), ledger.DefaultSchema()
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := DecodeSignals(body, schema, 1000); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3 {
		t.Errorf("a 100-event batch took %v allocations; want at most 3 (events, the body's text, the closure)", allocs)
	}
	events, err := DecodeSignals(body, schema, 1000)
	if err != nil || len(events) != 100 || events[7].ID != "id-7" || events[99].ID != "id-99" {
		t.Fatalf("decoded %d events, err %v", len(events), err)
	}

	escaped := []byte(`{"events":[{"id":"plain","entity":1,"signal":"view"},{"id":"a\"b\u0041","entity":2,"signal":"view"},{"id":"after","entity":3,"signal":"view"}]}`)
	events, err = DecodeSignals(escaped, schema, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{events[0].ID, events[1].ID, events[2].ID}; got[0] != "plain" || got[1] != "a\"bA" || got[2] != "after" {
		t.Fatalf("ids %q", got)
	}
}
