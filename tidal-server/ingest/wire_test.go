package ingest

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/ledger"
)

func newDecoder(t testing.TB) *api.Ingest {
	_, in := api.NewWithIngest(&fakeBackend{}, api.Options{MaxBatch: 100})
	return in
}

// request encodes a request by hand, independently of the client's
// encoder, so that the layout is pinned from both sides.
func request(req uint64, events ...[]byte) []byte {
	b := []byte{wireVersion}
	b = binary.LittleEndian.AppendUint64(b, req)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(events)))
	for _, e := range events {
		b = append(b, e...)
	}
	return b
}

func event(flags byte, entity uint64, id, signal string, extra ...uint64) []byte {
	b := []byte{flags}
	b = binary.LittleEndian.AppendUint64(b, entity)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(id)))
	b = append(b, id...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(signal)))
	b = append(b, signal...)
	for _, x := range extra {
		b = binary.LittleEndian.AppendUint64(b, x)
	}
	return b
}

// lyingCount is a request header that declares n events and holds none.
func lyingCount(n uint32) []byte {
	b := request(1)
	binary.LittleEndian.PutUint32(b[9:], n)
	return b
}

func TestDecodeRequest(t *testing.T) {
	in := newDecoder(t)
	msg := request(7, event(0, 1, "a", "view"), event(flagWeight|flagTS, 2, "b", "like", math.Float64bits(2.5), uint64(ledger.MinTS+5)))
	if id, err := requestID(msg); err != nil || id != 7 {
		t.Fatalf("request id: %d, %v", id, err)
	}
	evs, err := decodeEvents(msg, in)
	if err != nil {
		t.Fatal(err)
	}
	want := []ledger.Event{{ID: "a", Entity: 1, Signal: "view", Weight: 1}, {ID: "b", Entity: 2, Signal: "like", Weight: 2.5, TS: ledger.MinTS + 5}}
	if len(evs) != 2 || evs[0] != want[0] || evs[1] != want[1] {
		t.Fatalf("decoded %+v, expected %+v", evs, want)
	}

	for name, tc := range map[string]struct {
		msg   []byte
		field string
	}{
		"truncated event":      {request(1, event(0, 1, "a", "view")[:12]), "events"},
		"count beyond the msg": {lyingCount(5), "events"},
		"no events":            {request(1), "events"},
		"trailing bytes":       {append(request(1, event(0, 1, "a", "view")), 9), "events"},
		"unknown flags":        {request(1, event(8, 1, "a", "view")), "events[0]"},
		"weight missing":       {request(1, event(flagWeight, 1, "a", "view")), "events[0].weight"},
		"zero weight":          {request(1, event(flagWeight, 1, "a", "view", 0)), "events[0].weight"},
		"ts given as 0":        {request(1, event(flagTS, 1, "a", "view", 0)), "events[0].ts"},
		"empty id":             {request(1, event(0, 1, "", "view")), "events[0].id"},
	} {
		_, err := decodeEvents(tc.msg, in)
		ae, ok := err.(*api.Error)
		if !ok || ae.Status != 400 || !strings.HasPrefix(ae.Field, tc.field) {
			t.Errorf("%s: expected 400 naming %s, found %v", name, tc.field, err)
		}
	}
	// A count the message could hold is bounded by --max-batch: 413.
	var many [][]byte
	for range 101 {
		many = append(many, event(0, 1, "a", "view"))
	}
	if _, err := decodeEvents(request(1, many...), in); err == nil || err.(*api.Error).Status != 413 {
		t.Errorf("101 events with --max-batch 100: expected 413, found %v", err)
	}
	if _, err := requestID([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0}); err == nil {
		t.Error("expected version 2 refused")
	}
}

// Nothing a client sends makes the decoder panic or accept an event the
// HTTP API would refuse.
func FuzzDecodeRequest(f *testing.F) {
	f.Add(request(1, event(0, 1, "a", "view")))
	f.Add(request(2, event(flagWeight|flagTS, 2, "b", "like", math.Float64bits(2.5), uint64(ledger.MinTS+5))))
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 255, 255})
	in := newDecoder(f)
	schema := ledger.DefaultSchema()
	f.Fuzz(func(t *testing.T, msg []byte) {
		if _, err := requestID(msg); err != nil {
			return
		}
		evs, err := decodeEvents(msg, in)
		if err != nil {
			return
		}
		for i, e := range evs {
			if e.TS == 0 {
				e.TS = ledger.MinTS
			}
			if fe := schema.ValidateEvent(e); fe != nil {
				t.Fatalf("events[%d] %+v accepted but invalid: %v", i, e, fe)
			}
		}
	})
}

// TestDecodeEventsAllocatesTwice pins that a request's ids are substrings
// of one copy of its events, as the HTTP API's are: a
// 100-event request allocates the events slice and that one string, where
// it allocated a string per id before (102 allocations).
func TestDecodeEventsAllocatesTwice(t *testing.T) {
	in := newDecoder(t)
	var evs [][]byte
	for i := range 100 {
		evs = append(evs, event(0, uint64(i), "req-7-event-"+strings.Repeat("x", i%5), "view"))
	}
	msg := request(1, evs...)
	allocs := testing.AllocsPerRun(50, func() {
		if _, err := decodeEvents(msg, in); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Fatalf("decoding 100 events took %.0f allocations, expected 2 (the events and one string for every id)", allocs)
	}
	got, err := decodeEvents(msg, in)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range got {
		if want := "req-7-event-" + strings.Repeat("x", i%5); e.ID != want || e.Entity != uint64(i) || e.Signal != "view" {
			t.Fatalf("event %d: %+v, expected id %q entity %d", i, e, want, i)
		}
	}
}
