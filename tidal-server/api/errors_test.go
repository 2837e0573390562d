package api

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

// conflictErr is a conflict from a package other than ledger (the
// embedding write ids): it names its field through Conflict().
type conflictErr struct{ field string }

func (c conflictErr) Error() string    { return "write id reused with another vector" }
func (c conflictErr) Conflict() string { return c.field }

func TestBackendErrorsMapToStatus(t *testing.T) {
	cases := []struct {
		err        error
		status     int
		code       string
		field      string
		retryAfter string
	}{
		{replica.ErrNoLeader, 503, CodeUnavailable, "", "1"},
		{replica.ErrOverloaded, 503, CodeUnavailable, "", "1"},
		{fmt.Errorf("proposing: %w", replica.ErrOverloaded), 503, CodeUnavailable, "", "1"},
		{ErrQueueFull, 503, CodeUnavailable, "", "1"},
		{replica.ErrStopped, 503, CodeUnavailable, "", ""},
		{replica.ErrFenced, 503, CodeUnavailable, "", ""},
		{replica.ErrUnknownOutcome, 504, CodeTimeout, "", ""},
		{fmt.Errorf("entry 12: %w", replica.ErrUnknownOutcome), 504, CodeTimeout, "", ""},
		{context.DeadlineExceeded, 504, CodeTimeout, "", ""},
		{&ledger.ConflictError{Index: 2, ID: "e7", Entity: 1, Signal: "view", Weight: 1}, 409, CodeConflict, "events[2].id", ""},
		{fmt.Errorf("apply: %w", &ledger.ConflictError{Index: 0, ID: "e7"}), 409, CodeConflict, "events[0].id", ""},
		{conflictErr{"id"}, 409, CodeConflict, "id", ""},
		{&ledger.EventError{Index: 4, Err: &ledger.FieldError{Field: "weight", Message: "bad"}}, 400, CodeInvalid, "events[4].weight", ""},
		{errBoom, 500, CodeInternal, "", ""},
		{&replica.TransferError{Leader: 1, Transferee: 2, RetryAfter: 500 * time.Millisecond}, 503, CodeUnavailable, "", "1"},
		{fmt.Errorf("write: %w", &replica.TransferError{Leader: 1, Transferee: 2, RetryAfter: 2500 * time.Millisecond}), 503, CodeUnavailable, "", "3"},
		{fmt.Errorf("%w: leadership did not move", replica.ErrTransferAbandoned), 409, CodeConflict, "", ""},
	}
	writes := map[string]func(e *env) *httptest.ResponseRecorder{
		"signals": func(e *env) *httptest.ResponseRecorder {
			return e.post("/v1/signals", `{"events":[`+goodEvents(1)[0]+`]}`)
		},
		"embedding": func(e *env) *httptest.ResponseRecorder {
			return e.do(http.MethodPut, "/v1/entities/9/embedding", "application/json", `{"id":"v1","vector":[1,2,3,4]}`)
		},
	}
	for _, tc := range cases {
		for name, write := range writes {
			t.Run(fmt.Sprintf("%s/%v", name, tc.err), func(t *testing.T) {
				e := newEnv(t, Options{})
				e.fake.onWrite = func(context.Context) error { return tc.err }
				rec := write(e)
				wantError(t, rec, tc.status, tc.code, tc.field)
				if got := rec.Header().Get("Retry-After"); got != tc.retryAfter {
					t.Fatalf("Retry-After %q, want %q", got, tc.retryAfter)
				}
				if tc.status == 504 && !strings.Contains(rec.Body.String(), "same id") {
					t.Fatalf("504 body %s does not tell the client to retry with the same ids", rec.Body)
				}
			})
		}
	}
}

// A real id conflict is found by the pre-check against the ledger and
// never reaches WriteSignals.
func TestIDReuseWithAnotherPayloadIs409(t *testing.T) {
	e := newEnv(t, Options{})
	want204(t, e.post("/v1/signals", `{"events":[{"id":"a","entity":1,"signal":"view"}]}`))
	calls := e.fake.writeCalls.Load()
	rec := e.post("/v1/signals", `{"events":[{"id":"b","entity":1,"signal":"view"},{"id":"a","entity":2,"signal":"view"}]}`)
	wantError(t, rec, http.StatusConflict, CodeConflict, "events[1].id")
	if e.fake.writeCalls.Load() != calls {
		t.Fatal("a batch refused by the pre-check reached WriteSignals")
	}
	if n, _ := e.fake.applied(); n != 1 {
		t.Fatalf("%d events applied, want 1", n)
	}
}

// TestInflightBoundSheds fills the in-flight bound with writes the
// backend holds, and checks that the next write is shed with 503 and
// Retry-After, without reaching the backend, and that the bound frees up.
func TestInflightBoundSheds(t *testing.T) {
	const bound = 3
	e := newEnv(t, Options{MaxInflightWrites: bound})
	entered := make(chan struct{}, bound)
	release := make(chan struct{})
	e.fake.onWrite = func(ctx context.Context) error {
		entered <- struct{}{}
		<-release
		return nil
	}
	var wg sync.WaitGroup
	codes := make([]int, bound)
	for i := 0; i < bound; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := httptest.NewRequest(http.MethodPost, "/v1/signals",
				strings.NewReader(fmt.Sprintf(`{"events":[{"id":"held-%d","entity":1,"signal":"view"}]}`, i)))
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			e.h.ServeHTTP(rec, req)
			codes[i] = rec.Code
		}()
	}
	for i := 0; i < bound; i++ {
		<-entered
	}
	if m := e.get("/metrics").Body.String(); !strings.Contains(m, fmt.Sprintf("tidal_http_writes_inflight %d", bound)) {
		t.Errorf("/metrics does not show %d writes in flight:\n%s", bound, grepLines(m, "inflight"))
	}
	calls := e.fake.writeCalls.Load()
	for _, rec := range []*httptest.ResponseRecorder{
		e.post("/v1/signals", `{"events":[{"id":"shed","entity":1,"signal":"view"}]}`),
		e.do(http.MethodPut, "/v1/entities/1/embedding", "application/json", `{"id":"shed","vector":[1,0,0,0]}`),
	} {
		wantError(t, rec, http.StatusServiceUnavailable, CodeUnavailable, "")
		if rec.Header().Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
	}
	if e.fake.writeCalls.Load() != calls {
		t.Fatal("a shed write reached the backend")
	}
	close(release)
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusNoContent {
			t.Fatalf("held write %d answered %d, want 204", i, c)
		}
	}
	e.fake.onWrite = nil
	want204(t, e.post("/v1/signals", `{"events":[{"id":"after","entity":1,"signal":"view"}]}`))
	if m := e.get("/metrics").Body.String(); !strings.Contains(m, `tidal_http_rejected_total{code="unavailable"} 2`) {
		t.Errorf("/metrics does not count the 2 shed writes:\n%s", grepLines(m, "rejected"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestPanicIs500AndServingGoesOn runs a real server: a panicking backend
// answers 500 and the next request on the same server succeeds.
func TestPanicIs500AndServingGoesOn(t *testing.T) {
	e := newEnv(t, Options{})
	srv := httptest.NewServer(e.h)
	defer srv.Close()
	e.fake.onWrite = func(context.Context) error { panic("backend bug") }
	post := func(id string) *http.Response {
		t.Helper()
		resp, err := srv.Client().Post(srv.URL+"/v1/signals", "application/json",
			strings.NewReader(`{"events":[{"id":"`+id+`","entity":1,"signal":"view"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := post("p1")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || !strings.Contains(string(body), `"code":"internal"`) {
		t.Fatalf("panic answered %d %s, want 500 internal", resp.StatusCode, body)
	}
	e.fake.onWrite = nil
	resp = post("p2")
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("after a panic the server answered %d, want 204", resp.StatusCode)
	}
	m := e.get("/metrics").Body.String()
	if !strings.Contains(m, `tidal_http_request_duration_seconds_count{code="500",route="POST /v1/signals"} 1`) {
		t.Fatalf("/metrics lacks the 500:\n%s", grepLines(m, "duration_seconds_count"))
	}
}

// TestNoContentOverHTTP2 sends every 204 route through HTTP/2, over TLS
// and over cleartext (h2c): a 204 with a body is a stream error there, so
// a clean 204 with an empty body proves the handler writes none.
func TestNoContentOverHTTP2(t *testing.T) {
	requests := []struct{ method, path, body string }{
		{http.MethodPost, "/v1/signals", `{"events":[{"id":"h2-%d","entity":1,"signal":"view"}]}`},
		{http.MethodPut, "/v1/entities/3/embedding", `{"id":"h2-%d","vector":[1,0,0,0]}`},
		{http.MethodDelete, "/admin/members/2", ``},
		{http.MethodPost, "/admin/transfer-leader", `{"to":2}`},
	}
	run := func(t *testing.T, srv *httptest.Server, client *http.Client) {
		for round := 0; round < 3; round++ {
			for _, r := range requests {
				body := r.body
				if strings.Contains(body, "%d") {
					body = fmt.Sprintf(body, round)
				}
				req, err := http.NewRequest(r.method, srv.URL+r.path, strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s %s: %v", r.method, r.path, err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatalf("%s %s: reading the body: %v", r.method, r.path, err)
				}
				if resp.ProtoMajor != 2 {
					t.Fatalf("%s %s went over %s, want HTTP/2", r.method, r.path, resp.Proto)
				}
				if resp.StatusCode != http.StatusNoContent || len(got) != 0 {
					t.Fatalf("%s %s: %d with %d body bytes, want a clean 204", r.method, r.path, resp.StatusCode, len(got))
				}
			}
		}
	}
	t.Run("tls", func(t *testing.T) {
		e := newEnv(t, Options{})
		srv := httptest.NewUnstartedServer(e.h)
		srv.EnableHTTP2 = true
		srv.StartTLS()
		defer srv.Close()
		run(t, srv, srv.Client())
	})
	t.Run("h2c", func(t *testing.T) {
		e := newEnv(t, Options{})
		srv := httptest.NewUnstartedServer(e.h)
		srv.Config.Protocols = new(http.Protocols)
		srv.Config.Protocols.SetUnencryptedHTTP2(true)
		srv.Start()
		defer srv.Close()
		tr := &http.Transport{Protocols: new(http.Protocols), TLSClientConfig: &tls.Config{}}
		tr.Protocols.SetUnencryptedHTTP2(true)
		defer tr.CloseIdleConnections()
		run(t, srv, &http.Client{Transport: tr})
	})
}

func TestMetricsByRouteAndCode(t *testing.T) {
	e := newEnv(t, Options{})
	want204(t, e.post("/v1/signals", `{"events":[`+goodEvents(1)[0]+`]}`))
	e.post("/v1/signals", `{"events":[]}`)
	e.post("/v1/signals", `{"events":[]}`)
	e.get("/v1/entities/1")
	e.get("/nowhere")
	m := e.get("/metrics").Body.String()
	for _, line := range []string{
		`tidal_http_request_duration_seconds_count{code="204",route="POST /v1/signals"} 1`,
		`tidal_http_request_duration_seconds_count{code="400",route="POST /v1/signals"} 2`,
		`tidal_http_request_duration_seconds_count{code="200",route="GET /v1/entities/{entity}"} 1`,
		`tidal_http_request_duration_seconds_count{code="404",route="/"} 1`,
		`tidal_http_request_duration_seconds_bucket{code="204",route="POST /v1/signals",le="+Inf"} 1`,
	} {
		if !strings.Contains(m, line) {
			t.Errorf("/metrics lacks %s; has:\n%s", line, grepLines(m, "duration_seconds_count"))
		}
	}
}

// TestStreamFailingMidwayIsNotPassedOffAsWhole checks that a response
// whose status is already out is aborted, not completed, when the
// backend fails or panics: a client must not take a cut backup for a
// whole one.
func TestStreamFailingMidwayIsNotPassedOffAsWhole(t *testing.T) {
	for name, fail := range map[string]func(f *fakeBackend){
		"error": func(f *fakeBackend) { f.backupErr = errBoom },
		"panic": func(f *fakeBackend) { f.backupErr = nil; f.onBackup = func() { panic("backend bug") } },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, Options{})
			e.fake.backup = strings.Repeat("b", 256<<10) // past every buffer: the 200 is sent
			fail(e.fake)
			srv := httptest.NewServer(e.h)
			defer srv.Close()
			resp, err := srv.Client().Get(srv.URL + "/admin/backup")
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				t.Fatalf("a backup cut by a backend %s read as a whole %d-byte %d response", name, len(body), resp.StatusCode)
			}
			// The server keeps serving.
			e.fake.backupErr, e.fake.onBackup = nil, nil
			resp, err = srv.Client().Get(srv.URL + "/admin/backup")
			if err != nil {
				t.Fatal(err)
			}
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || len(body) != len(e.fake.backup) {
				t.Fatalf("after the failure: %d bytes, %v", len(body), err)
			}
		})
	}
}

// TestWriteDeadlineIs504 holds a write past the handler's WriteTimeout: a
// backend that gives up with the context's error may still commit the
// entry, so the answer is 504 (retry with the same ids), never 500.
func TestWriteDeadlineIs504(t *testing.T) {
	e := newEnv(t, Options{WriteTimeout: 20 * time.Millisecond})
	var deadline time.Time
	e.fake.onWrite = func(ctx context.Context) error {
		deadline, _ = ctx.Deadline()
		<-ctx.Done()
		return ctx.Err()
	}
	start := time.Now()
	rec := e.post("/v1/signals", `{"events":[`+goodEvents(1)[0]+`]}`)
	wantError(t, rec, http.StatusGatewayTimeout, CodeTimeout, "")
	if deadline.IsZero() || deadline.Sub(start) > time.Second {
		t.Fatalf("backend saw deadline %v for a 20ms write timeout started at %v", deadline, start)
	}
}

// TestSkipEarlyCheckLeavesConflictsToApply: with SkipEarlyCheck the
// pre-check is not called, and a reused id with another payload is still
// refused with 409 naming the event (by the write path's apply, which
// stays authoritative), nothing of the batch applied.
func TestSkipEarlyCheckLeavesConflictsToApply(t *testing.T) {
	e := newEnv(t, Options{SkipEarlyCheck: true})
	want204(t, e.post("/v1/signals", `{"events":[{"id":"a","entity":1,"signal":"view"}]}`))
	rec := e.post("/v1/signals", `{"events":[{"id":"b","entity":1,"signal":"view"},{"id":"a","entity":2,"signal":"view"}]}`)
	wantError(t, rec, http.StatusConflict, CodeConflict, "events[1].id")
	if n := e.fake.checkCalls.Load(); n != 0 {
		t.Fatalf("the pre-check ran %d times with SkipEarlyCheck", n)
	}
	if n, _ := e.fake.applied(); n != 1 {
		t.Fatalf("%d events applied, want 1", n)
	}
	// The default still checks first.
	d := newEnv(t, Options{})
	want204(t, d.post("/v1/signals", `{"events":[{"id":"a","entity":1,"signal":"view"}]}`))
	if n := d.fake.checkCalls.Load(); n != 1 {
		t.Fatalf("the pre-check ran %d times by default, want 1", n)
	}
}
