package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// encodingJSONEvent is the wire event as encoding/json sees it; the
// decoder's output must match it for every body the decoder accepts.
type encodingJSONEvent struct {
	ID     *string  `json:"id"`
	Entity *uint64  `json:"entity"`
	Signal *string  `json:"signal"`
	Weight *float64 `json:"weight"`
	TS     *int64   `json:"ts"`
}

// FuzzDecodeSignals checks, for any body and batch limit: no panic; a
// refusal is an *Error, 400 or 413, naming a field; an accepted batch is
// non-empty, within the limit, valid under the schema once stamped, and
// is exactly what encoding/json reads from the same body (so the hand
// decoder accepts only JSON, and reads it the standard way).
func FuzzDecodeSignals(f *testing.F) {
	for _, seed := range []string{
		`{"events":[{"id":"e1","entity":42,"signal":"view"}]}`,
		`{"events":[{"id":"e1","entity":42,"signal":"view","weight":2.5,"ts":1700000000000},{"id":"e2","entity":0,"signal":"like","weight":null,"ts":null}]}`,
		` { "events" : [ { "ts" : 1700000000000 , "signal" : "share" , "entity" : 18446744073709551615 , "id" : "\u0041\/b" } ] } `,
		`{"events":[{"id":"e1","entity":-1,"signal":"view"}]}`,
		`{"events":[{"id":"e1","entity":1,"signal":"view","weight":1e400}]}`,
		`{"events":[]}`,
		`{"events":[{"id":"e1","entity":1,"signal":"view"}]}}`,
	} {
		f.Add([]byte(seed), 3)
	}
	schema := ledger.DefaultSchema()
	f.Fuzz(func(t *testing.T, body []byte, maxBatch int) {
		if maxBatch < 1 || maxBatch > 1000 {
			maxBatch = 1 + (maxBatch%1000+1000)%1000
		}
		events, err := DecodeSignals(body, schema, maxBatch)
		if err != nil {
			var ae *Error
			if !errors.As(err, &ae) {
				t.Fatalf("error %T %v is not an *Error", err, err)
			}
			if ae.Status != http.StatusBadRequest && ae.Status != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d for %v", ae.Status, ae)
			}
			if ae.Field == "" || ae.Message == "" || ae.Code == "" {
				t.Fatalf("error without field, message or code: %+v", ae)
			}
			if events != nil {
				t.Fatal("events returned with an error")
			}
			return
		}
		if len(events) == 0 || len(events) > maxBatch {
			t.Fatalf("accepted %d events with limit %d", len(events), maxBatch)
		}
		for i, e := range events {
			if e.TS == 0 {
				e.TS = ledger.MinTS
			}
			if fe := schema.ValidateEvent(e); fe != nil {
				t.Fatalf("accepted events[%d] %+v is invalid: %v", i, e, fe)
			}
		}
		var std struct {
			Events []encodingJSONEvent `json:"events"`
		}
		if err := json.Unmarshal(body, &std); err != nil {
			t.Fatalf("accepted a body encoding/json refuses: %v\n%q", err, body)
		}
		if len(std.Events) != len(events) {
			t.Fatalf("decoded %d events, encoding/json %d", len(events), len(std.Events))
		}
		for i, se := range std.Events {
			want := ledger.Event{ID: *se.ID, Entity: *se.Entity, Signal: *se.Signal, Weight: 1}
			if se.Weight != nil {
				want.Weight = *se.Weight
			}
			if se.TS != nil {
				want.TS = *se.TS
			}
			if !reflect.DeepEqual(events[i], want) {
				t.Fatalf("events[%d] = %+v, encoding/json reads %+v", i, events[i], want)
			}
		}
	})
}

// FuzzHandler posts arbitrary bodies to the two write routes through the
// real handler over a fake backend holding a real ledger and vector
// store. Whatever arrives: no panic, no 5xx, a 204 has no body, every
// other answer is a well-formed JSON error, and a refused request changes
// nothing.
func FuzzHandler(f *testing.F) {
	f.Add(false, "1", []byte(`{"events":[{"id":"e1","entity":42,"signal":"view"}]}`))
	f.Add(false, "1", []byte(`{"events":[{"id":"e1","entity":42,"signal":"view"},{"id":"e1","entity":43,"signal":"view"}]}`))
	f.Add(false, "1", []byte(`{"events":[{"id":"seed","entity":1,"signal":"view","weight":2}]}`)) // conflicts with the pre-seeded event
	f.Add(true, "7", []byte(`{"id":"v1","vector":[1,2,3,4]}`))
	f.Add(true, "7", []byte(`{"id":"v1","vector":[1,null,3,4]}`))
	f.Add(true, "x", []byte(`{"id":"v1","vector":[1,2,3,4]}`))
	f.Fuzz(func(t *testing.T, embedding bool, entity string, body []byte) {
		e := &env{t: t, fake: newFake(testSchema())}
		e.h = New(e.fake, Options{MaxBatch: 16, MaxBodyBytes: 4 << 10})
		want204(t, e.post("/v1/signals", `{"events":[{"id":"seed","entity":1,"signal":"view"}]}`))
		e.fake.writeCalls.Store(0)
		beforeEvents, beforeIndex := e.fake.applied()

		method, path := http.MethodPost, "/v1/signals"
		if embedding {
			method, path = http.MethodPut, "/v1/entities/"+url.PathEscape(entity)+"/embedding"
		}
		req, err := http.NewRequest(method, path, bytes.NewReader(body))
		if err != nil {
			t.Skipf("not an HTTP request net/http can build (entity %q): %v", entity, err)
		}
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)

		switch {
		case rec.Code >= 500:
			t.Fatalf("%s %s answered %d: %s\nbody %q", method, path, rec.Code, rec.Body, body)
		case rec.Code == http.StatusNoContent:
			want204(t, rec)
			return
		}
		if rec.Code < 400 {
			// ServeMux redirects unclean paths (an empty entity makes
			// "//") before any route runs: nothing may be written.
			if rec.Code != http.StatusTemporaryRedirect && rec.Code != http.StatusMovedPermanently {
				t.Fatalf("%s %s answered %d", method, path, rec.Code)
			}
			if e.fake.writeCalls.Load() != 0 {
				t.Fatalf("redirected %s %s reached the backend", method, path)
			}
			return
		}
		var eb struct {
			Error *struct {
				Code    *string `json:"code"`
				Message *string `json:"message"`
				Field   *string `json:"field"`
			} `json:"error"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Error == nil ||
			eb.Error.Code == nil || eb.Error.Message == nil || eb.Error.Field == nil {
			t.Fatalf("%d with a malformed error body %s (%v)", rec.Code, rec.Body, err)
		}
		if rec.Code == http.StatusBadRequest && *eb.Error.Field == "" {
			t.Fatalf("400 naming no field: %s", rec.Body)
		}
		if n := e.fake.writeCalls.Load(); n != 0 {
			t.Fatalf("refused request (%d) reached the backend's writes %d times", rec.Code, n)
		}
		if ev, idx := e.fake.applied(); ev != beforeEvents || idx != beforeIndex {
			t.Fatalf("refused request (%d) changed state", rec.Code)
		}
	})
}
