package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// now is the handler's clock in these tests: 2023-11-14T22:13:20Z.
const now int64 = 1_700_000_000_000

type env struct {
	t    *testing.T
	fake *fakeBackend
	h    http.Handler
	reg  *prometheus.Registry
}

func newEnv(t *testing.T, opts Options) *env {
	t.Helper()
	e := &env{t: t, fake: newFake(testSchema()), reg: prometheus.NewRegistry()}
	opts.Registry = e.reg
	opts.Now = func() time.Time { return time.UnixMilli(now) }
	e.h = New(e.fake, opts)
	return e
}

// do serves one request in-process; ctype "" sends no Content-Type.
func (e *env) do(method, path, ctype, body string) *httptest.ResponseRecorder {
	e.t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return rec
}

func (e *env) post(path, body string) *httptest.ResponseRecorder {
	e.t.Helper()
	return e.do(http.MethodPost, path, "application/json", body)
}

func (e *env) get(path string) *httptest.ResponseRecorder {
	e.t.Helper()
	return e.do(http.MethodGet, path, "", "")
}

// wantError checks that rec is an error response of exactly the shape
// {"error":{"code","message","field"}} with this status, code and field.
func wantError(t *testing.T, rec *httptest.ResponseRecorder, status int, code, field string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var body struct {
		Error struct {
			Code    *string `json:"code"`
			Message *string `json:"message"`
			Field   *string `json:"field"`
		} `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		t.Fatalf("error body %s: %v", rec.Body, err)
	}
	eb := body.Error
	if eb.Code == nil || eb.Message == nil || eb.Field == nil {
		t.Fatalf("error body %s lacks one of code, message, field", rec.Body)
	}
	if *eb.Code != code || *eb.Field != field {
		t.Fatalf("error code %q field %q, want %q %q; body %s", *eb.Code, *eb.Field, code, field, rec.Body)
	}
	if *eb.Message == "" {
		t.Fatalf("error body %s has an empty message", rec.Body)
	}
}

// wantNothingWritten checks that the backend's write methods were never
// called and its state is untouched.
func (e *env) wantNothingWritten() {
	e.t.Helper()
	if n := e.fake.writeCalls.Load(); n != 0 {
		e.t.Fatalf("backend write methods called %d times for rejected input", n)
	}
	if events, index := e.fake.applied(); events != 0 || index != 0 {
		e.t.Fatalf("state changed by rejected input: %d events applied, index %d", events, index)
	}
}

// wantJSON decodes rec's body into a generic value and compares it to
// want, given as JSON text: the whole shape, keys and values.
func wantJSON(t *testing.T, rec *httptest.ResponseRecorder, status int, want string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	var got, exp any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("body %s: %v", rec.Body, err)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatalf("bad expectation %s: %v", want, err)
	}
	if !reflect.DeepEqual(got, exp) {
		t.Fatalf("body\n%s\nwant\n%s", rec.Body, want)
	}
}

func want204(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusNoContent {
		t.Fatalf("status %d, want 204; body %s", rec.Code, rec.Body)
	}
	if rec.Body.Len() != 0 {
		t.Fatalf("204 carries a body: %q", rec.Body)
	}
}

func TestPostSignalsAcknowledgesAndStamps(t *testing.T) {
	e := newEnv(t, Options{})
	body := `{"events":[
		{"id":"e1","entity":42,"signal":"view","weight":2.5,"ts":1699999999000},
		{"id":"e2","entity":42,"signal":"like"}
	]}`
	rec := e.post("/v1/signals", body)
	want204(t, rec)
	for h, v := range map[string]string{"X-Tidal-Seq": "1", "X-Tidal-Term": "1", "X-Tidal-Node": "7", "X-Tidal-Duplicates": "0"} {
		if got := rec.Header().Get(h); got != v {
			t.Errorf("%s = %q, want %q", h, got, v)
		}
	}
	wantBatch := []ledger.Event{
		{ID: "e1", Entity: 42, Signal: "view", Weight: 2.5, TS: 1699999999000},
		{ID: "e2", Entity: 42, Signal: "like", Weight: 1, TS: now}, // weight defaulted, ts stamped
	}
	if len(e.fake.batches) != 1 || !reflect.DeepEqual(e.fake.batches[0], wantBatch) {
		t.Fatalf("backend got %+v, want %+v", e.fake.batches, wantBatch)
	}

	// A retry of the same ids is acknowledged as duplicates.
	rec = e.post("/v1/signals", body)
	want204(t, rec)
	if got := rec.Header().Get("X-Tidal-Duplicates"); got != "2" {
		t.Fatalf("retry X-Tidal-Duplicates = %q, want 2", got)
	}
	if got := rec.Header().Get("X-Tidal-Seq"); got != "2" {
		t.Fatalf("retry X-Tidal-Seq = %q, want 2", got)
	}
}

// goodEvents returns n valid events as JSON object texts.
func goodEvents(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`{"id":"ok-%d","entity":%d,"signal":"view"}`, i, i+1)
	}
	return out
}

// batchWith returns a batch of three good events followed by bad.
func batchWith(bad string) string {
	return `{"events":[` + strings.Join(append(goodEvents(3), bad), ",") + `]}`
}

func TestPostSignalsRejectsBadInputWhole(t *testing.T) {
	one := func(ev string) string { return `{"events":[` + ev + `]}` }
	ok := goodEvents(1)[0]
	long := strings.Repeat("x", ledger.MaxIDLen+1)
	cases := []struct {
		name, body, field string
	}{
		// The bad event is the fourth: the three good ones before it
		// must not be applied either.
		{"weight string", batchWith(`{"id":"b","entity":1,"signal":"view","weight":"heavy"}`), "events[3].weight"},
		{"weight zero", batchWith(`{"id":"b","entity":1,"signal":"view","weight":0}`), "events[3].weight"},
		{"weight negative", batchWith(`{"id":"b","entity":1,"signal":"view","weight":-1}`), "events[3].weight"},
		{"weight above max", batchWith(`{"id":"b","entity":1,"signal":"view","weight":2e9}`), "events[3].weight"},
		{"weight overflow", batchWith(`{"id":"b","entity":1,"signal":"view","weight":1e400}`), "events[3].weight"},
		{"weight NaN literal", batchWith(`{"id":"b","entity":1,"signal":"view","weight":NaN}`), "events[3].weight"},
		{"weight bool", batchWith(`{"id":"b","entity":1,"signal":"view","weight":true}`), "events[3].weight"},
		{"entity negative", one(`{"id":"b","entity":-1,"signal":"view"}`), "events[0].entity"},
		{"entity fraction", one(`{"id":"b","entity":1.5,"signal":"view"}`), "events[0].entity"},
		{"entity string", one(`{"id":"b","entity":"x","signal":"view"}`), "events[0].entity"},
		{"entity numeric string", one(`{"id":"b","entity":"12","signal":"view"}`), "events[0].entity"},
		{"entity exponent", one(`{"id":"b","entity":1e3,"signal":"view"}`), "events[0].entity"},
		{"entity overflow", one(`{"id":"b","entity":18446744073709551616,"signal":"view"}`), "events[0].entity"},
		{"entity null", one(`{"id":"b","entity":null,"signal":"view"}`), "events[0].entity"},
		{"entity missing", one(`{"id":"b","signal":"view"}`), "events[0].entity"},
		{"id missing", one(`{"entity":1,"signal":"view"}`), "events[0].id"},
		{"id empty", one(`{"id":"","entity":1,"signal":"view"}`), "events[0].id"},
		{"id number", one(`{"id":5,"entity":1,"signal":"view"}`), "events[0].id"},
		{"id with space", one(`{"id":"a b","entity":1,"signal":"view"}`), "events[0].id"},
		{"id non-ascii", one(`{"id":"caf\u00e9","entity":1,"signal":"view"}`), "events[0].id"},
		{"id too long", one(`{"id":"` + long + `","entity":1,"signal":"view"}`), "events[0].id"},
		{"id control char", one("{\"id\":\"a\tb\",\"entity\":1,\"signal\":\"view\"}"), "events[0].id"},
		{"id bad escape", one(`{"id":"a\qb","entity":1,"signal":"view"}`), "events[0].id"},
		{"signal missing", one(`{"id":"b","entity":1}`), "events[0].signal"},
		{"signal unknown", one(`{"id":"b","entity":1,"signal":"purchase"}`), "events[0].signal"},
		{"signal number", one(`{"id":"b","entity":1,"signal":7}`), "events[0].signal"},
		{"ts zero", one(`{"id":"b","entity":1,"signal":"view","ts":0}`), "events[0].ts"},
		{"ts seconds", one(`{"id":"b","entity":1,"signal":"view","ts":1700000000}`), "events[0].ts"},
		{"ts microseconds", one(`{"id":"b","entity":1,"signal":"view","ts":1700000000000000}`), "events[0].ts"},
		{"ts negative", one(`{"id":"b","entity":1,"signal":"view","ts":-1700000000000}`), "events[0].ts"},
		{"ts fraction", one(`{"id":"b","entity":1,"signal":"view","ts":1700000000000.5}`), "events[0].ts"},
		{"ts string", one(`{"id":"b","entity":1,"signal":"view","ts":"now"}`), "events[0].ts"},
		{"ts overflow", one(`{"id":"b","entity":1,"signal":"view","ts":9223372036854775808}`), "events[0].ts"},
		{"unknown event field", one(`{"id":"b","entity":1,"signal":"view","color":"red"}`), "events[0].color"},
		{"key in other case", one(`{"ID":"b","entity":1,"signal":"view"}`), "events[0].ID"},
		{"duplicate key", one(`{"id":"b","entity":1,"signal":"view","entity":2}`), "events[0].entity"},
		{"unknown top-level field", `{"events":[` + ok + `],"extra":1}`, "extra"},
		{"duplicate events key", `{"events":[` + ok + `],"events":[` + ok + `]}`, "events"},
		{"empty batch", `{"events":[]}`, "events"},
		{"events missing", `{}`, "events"},
		{"events null", `{"events":null}`, "events"},
		{"events object", `{"events":{}}`, "events"},
		{"events string", `{"events":"x"}`, "events"},
		{"event not an object", `{"events":[1]}`, "events[0]"},
		{"event null", `{"events":[` + ok + `,null]}`, "events[1]"},
		{"malformed event", `{"events":[{"id":"b",}]}`, "events[0]"},
		{"missing comma", `{"events":[` + ok + ` ` + ok + `]}`, "events"},
		{"unterminated", `{"events":[` + ok, "events"},
		{"top-level array", `[` + ok + `]`, "body"},
		{"top-level string", `"events"`, "body"},
		{"empty body", ``, "body"},
		{"whitespace body", " \n\t", "body"},
		{"trailing garbage", `{"events":[` + ok + `]} x`, "body"},
		{"trailing brace", `{"events":[` + ok + `]}}`, "body"},
		{"trailing bracket", `{"events":[` + ok + `]}]`, "body"},
		{"second object", `{"events":[` + ok + `]}{}`, "body"},
		{"not JSON", `events=1`, "body"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{})
			wantError(t, e.post("/v1/signals", tc.body), http.StatusBadRequest, CodeInvalid, tc.field)
			e.wantNothingWritten()
		})
	}
}

func TestPostSignalsLimits(t *testing.T) {
	t.Run("body too large", func(t *testing.T) {
		e := newEnv(t, Options{MaxBodyBytes: 1024})
		body := `{"events":[` + strings.Join(goodEvents(40), ",") + `]}`
		if len(body) <= 1024 {
			t.Fatalf("test body of %d bytes is not over the limit", len(body))
		}
		wantError(t, e.post("/v1/signals", body), http.StatusRequestEntityTooLarge, CodeTooLarge, "body")
		e.wantNothingWritten()
	})
	t.Run("batch too long", func(t *testing.T) {
		e := newEnv(t, Options{MaxBatch: 3})
		want204(t, e.post("/v1/signals", `{"events":[`+strings.Join(goodEvents(3), ",")+`]}`))
		e.fake.writeCalls.Store(0)
		before, index := e.fake.applied()
		wantError(t, e.post("/v1/signals", `{"events":[`+strings.Join(goodEvents(4), ",")+`]}`),
			http.StatusRequestEntityTooLarge, CodeTooLarge, "events")
		if after, idx := e.fake.applied(); after != before || idx != index || e.fake.writeCalls.Load() != 0 {
			t.Fatalf("a refused batch changed state: %d -> %d events, index %d -> %d", before, after, index, idx)
		}
	})
}

func TestWrongContentTypeIs415(t *testing.T) {
	e := newEnv(t, Options{})
	good := map[string]string{
		"/v1/signals":              `{"events":[` + goodEvents(1)[0] + `]}`,
		"/v1/entities/1/embedding": `{"id":"v1","vector":[1,0,0,0]}`,
		"/v1/query/nearest":        `{"vector":[1,0,0,0]}`,
		"/admin/members":           `{"id":2,"peer_addr":"127.0.0.1:7081"}`,
		"/admin/transfer-leader":   `{"to":2}`,
	}
	for path, body := range good {
		method := http.MethodPost
		if strings.HasSuffix(path, "/embedding") {
			method = http.MethodPut
		}
		for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "application/jsonx", "json", "application/json; charset"} {
			wantError(t, e.do(method, path, ct, body), http.StatusUnsupportedMediaType, CodeMediaType, "Content-Type")
		}
	}
	e.wantNothingWritten()
	// Parameters and case do not matter.
	want204(t, e.do(http.MethodPost, "/v1/signals", "Application/JSON; charset=utf-8", good["/v1/signals"]))
}
