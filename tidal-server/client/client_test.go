package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// serve starts a real HTTP server on 127.0.0.1 and a client for it with
// short backoffs, both closed when the test ends.
func serve(t *testing.T, h http.Handler, opts ...Option) (*httptest.Server, *Client) {
	t.Helper()
	srv := httptest.NewServer(h)
	c := New(srv.Listener.Addr().String(), append([]Option{WithBackoff(time.Millisecond, 5*time.Millisecond)}, opts...)...)
	t.Cleanup(func() {
		c.CloseIdleConnections()
		srv.Close()
	})
	return srv, c
}

func writeError(w http.ResponseWriter, status int, code, field, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%q,"message":%q,"field":%q}}`, code, msg, field)
}

// recorder remembers every request body it sees and answers with the
// next scripted status (the last one repeats).
type recorder struct {
	mu      sync.Mutex
	bodies  [][]byte
	script  []func(w http.ResponseWriter)
	arrived []time.Time
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	n := len(rc.bodies)
	rc.bodies = append(rc.bodies, body)
	rc.arrived = append(rc.arrived, time.Now())
	step := rc.script[min(n, len(rc.script)-1)]
	rc.mu.Unlock()
	step(w)
}

func (rc *recorder) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.bodies)
}

func status(code int, hdr ...string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		switch {
		case code == http.StatusNoContent:
			w.WriteHeader(code)
		case code >= 400:
			writeError(w, code, codeForStatus(code), "", http.StatusText(code))
		default:
			w.WriteHeader(code)
		}
	}
}

func TestNewNormalisesAddress(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7070":         "http://127.0.0.1:7070",
		"http://127.0.0.1:7070/": "http://127.0.0.1:7070",
		"https://tidal.example":  "https://tidal.example",
	} {
		if got := New(in).Addr(); got != want {
			t.Errorf("New(%q).Addr() = %q, expected %q", in, got, want)
		}
	}
}

func TestWriteSignals(t *testing.T) {
	var got struct {
		Events []map[string]any `json:"events"`
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/signals", func(w http.ResponseWriter, r *http.Request) {
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			writeError(w, 415, CodeUnsupportedMediaType, "", "expected application/json, found "+ct)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&got); err != nil {
			writeError(w, 400, CodeInvalidArgument, "", err.Error())
			return
		}
		w.Header().Set("X-Tidal-Seq", "17")
		w.Header().Set("X-Tidal-Term", "3")
		w.Header().Set("X-Tidal-Node", "2")
		w.Header().Set("X-Tidal-Duplicates", "1")
		w.WriteHeader(http.StatusNoContent)
	})
	_, c := serve(t, mux)
	ack, err := c.WriteSignals(context.Background(), []Event{
		{ID: "e1", Entity: 42, Signal: "view", Weight: 1.5, TS: 1767225600000},
		{ID: "e2", Entity: 1<<64 - 1, Signal: "like"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ack != (Ack{Seq: 17, Term: 3, Node: 2, Duplicates: 1, Attempts: 1}) {
		t.Fatalf("unexpected ack %+v", ack)
	}
	if len(got.Events) != 2 {
		t.Fatalf("expected 2 events on the wire, found %d", len(got.Events))
	}
	e1, e2 := got.Events[0], got.Events[1]
	if e1["id"] != "e1" || e1["signal"] != "view" || e1["weight"] != 1.5 || e1["ts"] != 1767225600000.0 {
		t.Fatalf("first event on the wire: %v", e1)
	}
	if _, ok := e2["weight"]; ok {
		t.Fatalf("an unset weight must be omitted so the server applies its default: %v", e2)
	}
	if _, ok := e2["ts"]; ok {
		t.Fatalf("an unset ts must be omitted so the server stamps it: %v", e2)
	}
}

func TestPutEmbedding(t *testing.T) {
	vec := []float32{0.1, -2.5e-8, 3.4028235e38, 1.0000001}
	var got struct {
		ID     string    `json:"id"`
		Vector []float32 `json:"vector"`
	}
	var path string
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/entities/{entity}/embedding", func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		_ = json.NewDecoder(r.Body).Decode(&got)
		w.Header().Set("X-Tidal-Seq", "5")
		w.WriteHeader(http.StatusNoContent)
	})
	_, c := serve(t, mux)
	ack, err := c.PutEmbedding(context.Background(), 42, "w-1", vec)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Seq != 5 || path != "/v1/entities/42/embedding" || got.ID != "w-1" {
		t.Fatalf("ack %+v, path %q, id %q", ack, path, got.ID)
	}
	if !slices.Equal(got.Vector, vec) {
		t.Fatalf("vector did not survive the wire bit for bit: sent %v, server read %v", vec, got.Vector)
	}
}

func TestReadsDecode(t *testing.T) {
	var queries []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/entities/{entity}", func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RawQuery)
		fmt.Fprintf(w, `{"entity":%s,"applied_index":17,"at":1767225600000,
			"signals":{"view":{"count":3,"weight_sum":3.5,"score":2.9,"windows":{"1h":2,"24h":3,"all":3}}},
			"embedding":[0.5,-1]}`, r.PathValue("entity"))
	})
	mux.HandleFunc("POST /v1/query/nearest", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Vector []float32 `json:"vector"`
			K      int       `json:"k"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		fmt.Fprintf(w, `{"results":[{"entity":1,"score":0.98},{"entity":%d,"score":%d}]}`, len(req.Vector), req.K)
	})
	mux.HandleFunc("GET /v1/top", func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.RawQuery)
		fmt.Fprint(w, `{"signal":"view","window":"24h","results":[{"entity":1,"value":5},{"entity":2,"value":4.5}]}`)
	})
	mux.HandleFunc("GET /v1/events/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "a/b c" {
			writeError(w, 404, CodeNotFound, "id", "no event "+r.PathValue("id"))
			return
		}
		fmt.Fprint(w, `{"id":"a/b c","index":12,"term":2,"entity":42,"signal":"view"}`)
	})
	mux.HandleFunc("GET /v1/audit/digest", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"applied_index":123,"digest":"ab12"}`)
	})
	mux.HandleFunc("GET /cluster/status", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"node":1,"leader":1,"term":2,"commit":120,"applied":119,"members":[
			{"id":1,"peer_addr":"127.0.0.1:7101","client_addr":"127.0.0.1:7071","role":"leader","match":120,"lag":0,"reachable":true},
			{"id":2,"peer_addr":"127.0.0.1:7102","client_addr":"127.0.0.1:7072","role":"follower","match":100,"lag":20,"reachable":false}]}`)
	})
	_, c := serve(t, mux)
	ctx := context.Background()

	e, err := c.Entity(ctx, 42)
	if err != nil {
		t.Fatal(err)
	}
	view := e.Signals["view"]
	if e.Entity != 42 || e.AppliedIndex != 17 || e.At != 1767225600000 || view.Count != 3 || view.WeightSum != 3.5 ||
		view.Score != 2.9 || view.Windows["24h"] != 3 || view.Windows["1h"] != 2 || !slices.Equal(e.Embedding, []float32{0.5, -1}) {
		t.Fatalf("entity decoded wrong: %+v", e)
	}
	if _, err := c.Entity(ctx, 7, Local(), At(1767225600000)); err != nil {
		t.Fatal(err)
	}

	m, err := c.Nearest(ctx, []float32{1, 2, 3}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m, []Match{{1, 0.98}, {3, 10}}) {
		t.Fatalf("nearest: %+v", m)
	}

	top, err := c.Top(ctx, "view", "24h", 10)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(top, []Ranked{{1, 5}, {2, 4.5}}) {
		t.Fatalf("top: %+v", top)
	}
	if _, err := c.Top(ctx, "like", "", 3); err != nil {
		t.Fatal(err)
	}
	wantQueries := []string{
		"consistency=linearizable",
		"at=1767225600000&consistency=local",
		"k=10&signal=view&window=24h",
		"k=3&signal=like",
	}
	if !slices.Equal(queries, wantQueries) {
		t.Fatalf("query strings:\n got %q\nwant %q", queries, wantQueries)
	}

	loc, err := c.EventLocation(ctx, "a/b c")
	if err != nil {
		t.Fatal(err)
	}
	if *loc != (Location{ID: "a/b c", Index: 12, Term: 2, Entity: 42, Signal: "view"}) {
		t.Fatalf("location: %+v", loc)
	}
	_, err = c.EventLocation(ctx, "missing")
	if !IsNotFound(err) || IsIndefinite(err) {
		t.Fatalf("unknown id: expected a definite not-found error, found %v", err)
	}

	d, err := c.Digest(ctx)
	if err != nil || d != (Digest{AppliedIndex: 123, Digest: "ab12"}) {
		t.Fatalf("digest: %+v, %v", d, err)
	}

	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Leader != 1 || st.Applied != 119 || len(st.Members) != 2 ||
		st.Members[1] != (MemberStatus{ID: 2, PeerAddr: "127.0.0.1:7102", ClientAddr: "127.0.0.1:7072", Role: "follower", Match: 100, Lag: 20}) {
		t.Fatalf("status: %+v", st)
	}
}

func TestAdmin(t *testing.T) {
	var log []string
	mux := http.NewServeMux()
	mux.HandleFunc("POST /admin/members", func(w http.ResponseWriter, r *http.Request) {
		var m Member
		_ = json.NewDecoder(r.Body).Decode(&m)
		log = append(log, fmt.Sprintf("add %d %s %s", m.ID, m.PeerAddr, m.ClientAddr))
		_ = json.NewEncoder(w).Encode(m)
	})
	mux.HandleFunc("DELETE /admin/members/{id}", func(w http.ResponseWriter, r *http.Request) {
		log = append(log, "remove "+r.PathValue("id"))
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /admin/transfer-leader", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		log = append(log, "transfer "+string(body))
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /admin/snapshot", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"index":99,"term":4}`)
	})
	backup := bytes.Repeat([]byte{0, 1, 2, 0xff}, 300_000)
	mux.HandleFunc("GET /admin/backup", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(backup)
	})
	_, c := serve(t, mux)
	ctx := context.Background()

	m, err := c.AddMember(ctx, Member{ID: 4, PeerAddr: "127.0.0.1:7104", ClientAddr: "127.0.0.1:7074"})
	if err != nil || *m != (Member{ID: 4, PeerAddr: "127.0.0.1:7104", ClientAddr: "127.0.0.1:7074"}) {
		t.Fatalf("add member: %+v, %v", m, err)
	}
	if err := c.RemoveMember(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if err := c.TransferLeader(ctx, 2); err != nil {
		t.Fatal(err)
	}
	idx, term, err := c.Snapshot(ctx)
	if err != nil || idx != 99 || term != 4 {
		t.Fatalf("snapshot: %d %d %v", idx, term, err)
	}
	var buf bytes.Buffer
	n, err := c.Backup(ctx, &buf)
	if err != nil || n != int64(len(backup)) || !bytes.Equal(buf.Bytes(), backup) {
		t.Fatalf("backup: %d bytes of %d, equal=%v, %v", n, len(backup), bytes.Equal(buf.Bytes(), backup), err)
	}
	want := []string{"add 4 127.0.0.1:7104 127.0.0.1:7074", "remove 4", `transfer {"to":2}`}
	if !slices.Equal(log, want) {
		t.Fatalf("server saw %q, expected %q", log, want)
	}
}

func TestErrorDecoding(t *testing.T) {
	cases := []struct {
		status            int
		body              string
		code, field, msg  string
		is                func(error) bool
		retryAfterSeconds string
	}{
		{400, `{"error":{"code":"invalid_argument","message":"expected a finite number, found NaN","field":"events[3].weight"}}`,
			CodeInvalidArgument, "events[3].weight", "expected a finite number, found NaN", IsInvalid, ""},
		{409, `{"error":{"code":"conflict","message":"id e1 was used with another payload","field":"events[0].id"}}`,
			CodeConflict, "events[0].id", "id e1 was used with another payload", IsConflict, ""},
		{413, `{"error":{"code":"too_large","message":"body over 1 MiB"}}`, CodeTooLarge, "", "body over 1 MiB", nil, ""},
		{415, `{"error":{"code":"unsupported_media_type","message":"expected application/json"}}`,
			CodeUnsupportedMediaType, "", "expected application/json", nil, ""},
		// Not the server's JSON: a proxy's page still reads well.
		{502, "<html>bad gateway</html>", CodeInternal, "", "<html>bad gateway</html>", nil, ""},
		{404, "", CodeNotFound, "", "Not Found", IsNotFound, ""},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			rc := &recorder{script: []func(http.ResponseWriter){func(w http.ResponseWriter) {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}}}
			_, c := serve(t, rc)
			ack, err := c.WriteSignals(context.Background(), []Event{{ID: "e1", Entity: 1, Signal: "view"}})
			var ae *APIError
			if !errors.As(err, &ae) {
				t.Fatalf("expected an *APIError, found %T %v", err, err)
			}
			if ae.Status != tc.status || ae.Code != tc.code || ae.Field != tc.field || ae.Message != tc.msg {
				t.Fatalf("decoded %+v", ae)
			}
			if tc.is != nil && !tc.is(err) {
				t.Fatalf("helper does not recognise %v", err)
			}
			if rc.count() != 1 || ack.Attempts != 1 {
				t.Fatalf("a %d must not be retried: %d requests, %d attempts", tc.status, rc.count(), ack.Attempts)
			}
			msg := err.Error()
			for _, part := range []string{"POST /v1/signals", fmt.Sprint(tc.status), tc.code, tc.field, tc.msg} {
				if !strings.Contains(msg, part) {
					t.Fatalf("error %q does not mention %q", msg, part)
				}
			}
			// 5xx other than 503 may have been applied; 4xx certainly not.
			if IsIndefinite(err) != (tc.status >= 500) {
				t.Fatalf("status %d: IsIndefinite = %v", tc.status, IsIndefinite(err))
			}
		})
	}
}

func TestRetriesResendSameBody(t *testing.T) {
	rc := &recorder{script: []func(http.ResponseWriter){
		status(503),
		status(504),
		status(204, "X-Tidal-Seq", "9", "X-Tidal-Duplicates", "2"),
	}}
	_, c := serve(t, rc)
	events := []Event{{ID: "e1", Entity: 1, Signal: "view"}, {ID: "e2", Entity: 2, Signal: "like", Weight: 2}}
	ack, err := c.WriteSignals(context.Background(), events)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Attempts != 3 || ack.Seq != 9 || ack.Duplicates != 2 {
		t.Fatalf("ack %+v", ack)
	}
	if len(rc.bodies) != 3 {
		t.Fatalf("expected 3 requests, server saw %d", len(rc.bodies))
	}
	for i, b := range rc.bodies[1:] {
		if !bytes.Equal(b, rc.bodies[0]) {
			t.Fatalf("attempt %d sent a different body:\n%s\n%s", i+2, rc.bodies[0], b)
		}
	}
	if !bytes.Contains(rc.bodies[0], []byte(`"id":"e2"`)) {
		t.Fatalf("body lacks the event ids: %s", rc.bodies[0])
	}
}

func TestRetriesExhausted(t *testing.T) {
	t.Run("503 only is definite", func(t *testing.T) {
		rc := &recorder{script: []func(http.ResponseWriter){status(503)}}
		_, c := serve(t, rc)
		ack, err := c.WriteSignals(context.Background(), []Event{{ID: "e", Entity: 1, Signal: "view"}})
		var re *RequestError
		if !errors.As(err, &re) || re.Attempts != 3 || ack.Attempts != 3 || rc.count() != 3 {
			t.Fatalf("expected 3 attempts (default), found %v, ack %+v, %d requests", err, ack, rc.count())
		}
		if !IsUnavailable(err) || IsIndefinite(err) {
			t.Fatalf("refusals only: expected a definite unavailable error, found %v", err)
		}
		if !strings.Contains(err.Error(), "after 3 attempts") {
			t.Fatalf("error does not say how hard we tried: %v", err)
		}
	})
	t.Run("504 then 503 stays indefinite", func(t *testing.T) {
		rc := &recorder{script: []func(http.ResponseWriter){status(504), status(503)}}
		_, c := serve(t, rc, WithRetries(4))
		_, err := c.WriteSignals(context.Background(), []Event{{ID: "e", Entity: 1, Signal: "view"}})
		if rc.count() != 5 || !IsUnavailable(err) || !IsIndefinite(err) || !strings.Contains(err.Error(), "outcome unknown") {
			t.Fatalf("expected 5 attempts ending indefinite, found %d: %v", rc.count(), err)
		}
	})
	t.Run("WithRetries(0) sends once", func(t *testing.T) {
		rc := &recorder{script: []func(http.ResponseWriter){status(504)}}
		_, c := serve(t, rc, WithRetries(0))
		_, err := c.WriteSignals(context.Background(), []Event{{ID: "e", Entity: 1, Signal: "view"}})
		if rc.count() != 1 || !IsTimeout(err) || !IsIndefinite(err) {
			t.Fatalf("expected one indefinite timeout, found %d requests: %v", rc.count(), err)
		}
	})
}

func TestRetryAfterHonoured(t *testing.T) {
	rc := &recorder{script: []func(http.ResponseWriter){status(503, "Retry-After", "1"), status(204)}}
	_, c := serve(t, rc)
	ack, err := c.WriteSignals(context.Background(), []Event{{ID: "e", Entity: 1, Signal: "view"}})
	if err != nil || ack.Attempts != 2 {
		t.Fatalf("ack %+v, %v", ack, err)
	}
	// The backoff alone is at most 5ms here; only Retry-After explains a
	// second's gap. (Lower bound only: a slow machine can only add.)
	if gap := rc.arrived[1].Sub(rc.arrived[0]); gap < 950*time.Millisecond {
		t.Fatalf("retried after %v, before the server's Retry-After of 1s", gap)
	}
}

func TestNoRetryOnClientErrors(t *testing.T) {
	for _, code := range []int{400, 404, 409, 413, 415, 500} {
		rc := &recorder{script: []func(http.ResponseWriter){status(code), status(204)}}
		_, c := serve(t, rc)
		if _, err := c.WriteSignals(context.Background(), []Event{{ID: "e", Entity: 1, Signal: "view"}}); err == nil {
			t.Fatalf("%d: expected an error", code)
		}
		if rc.count() != 1 {
			t.Fatalf("%d was retried: %d requests", code, rc.count())
		}
	}
}

func TestContextDeadlineRespected(t *testing.T) {
	t.Run("no sleep past the deadline", func(t *testing.T) {
		rc := &recorder{script: []func(http.ResponseWriter){status(503, "Retry-After", "30")}}
		_, c := serve(t, rc)
		// The deadline is long enough that a client sleeping until it is
		// told apart from one returning at once on any machine, however
		// busy: waiting the 30s Retry-After would overrun it, so the client
		// must give up at once, with the 503, not sleep until the deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := c.WriteSignals(ctx, []Event{{ID: "e", Entity: 1, Signal: "view"}})
		if !IsUnavailable(err) {
			t.Fatalf("expected the 503 back, found %v", err)
		}
		if ctx.Err() != nil || rc.count() != 1 {
			t.Fatalf("expected one request and a return before the deadline, found %d requests, context %v", rc.count(), ctx.Err())
		}
	})
	t.Run("deadline cuts a hanging attempt", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		srv, c := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// The server notices a closed connection only once the body
			// has been read.
			_, _ = io.ReadAll(r.Body)
			select {
			case <-r.Context().Done():
			case <-release:
			}
		}), WithTimeout(time.Minute))
		_ = srv
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		ack, err := c.WriteSignals(ctx, []Event{{ID: "e", Entity: 1, Signal: "view"}})
		if !errors.Is(err, context.DeadlineExceeded) || !IsIndefinite(err) || ack.Attempts != 1 {
			t.Fatalf("expected one indefinite deadline error, found %v (attempts %d)", err, ack.Attempts)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("returned after %v, long past the 200ms deadline", took)
		}
	})
	t.Run("per-attempt timeout retries", func(t *testing.T) {
		var n atomic.Int32
		_, c := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) < 3 {
				_, _ = io.ReadAll(r.Body)
				<-r.Context().Done() // hang until the client gives up
				return
			}
			w.WriteHeader(http.StatusNoContent)
		}), WithTimeout(100*time.Millisecond))
		ack, err := c.WriteSignals(context.Background(), []Event{{ID: "e", Entity: 1, Signal: "view"}})
		if err != nil || ack.Attempts != 3 {
			t.Fatalf("expected success on the third attempt, found %+v, %v", ack, err)
		}
	})
	t.Run("per-attempt timeouts exhausted", func(t *testing.T) {
		_, c := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body)
			<-r.Context().Done()
		}), WithTimeout(50*time.Millisecond), WithRetries(1))
		ack, err := c.WriteSignals(context.Background(), []Event{{ID: "e", Entity: 1, Signal: "view"}})
		if !IsTimeout(err) || !IsIndefinite(err) || ack.Attempts != 2 {
			t.Fatalf("expected an indefinite timeout after 2 attempts, found %v (attempts %d)", err, ack.Attempts)
		}
	})
	t.Run("already cancelled", func(t *testing.T) {
		rc := &recorder{script: []func(http.ResponseWriter){status(204)}}
		_, c := serve(t, rc)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := c.WriteSignals(ctx, []Event{{ID: "e", Entity: 1, Signal: "view"}})
		if !errors.Is(err, context.Canceled) || IsIndefinite(err) || rc.count() != 0 {
			t.Fatalf("expected a definite cancellation and no request, found %v, %d requests", err, rc.count())
		}
	})
}

func TestConnectionRefusedIsRetriedAndDefinite(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := New(addr, WithBackoff(time.Millisecond, time.Millisecond))
	ack, err := c.WriteSignals(context.Background(), []Event{{ID: "e", Entity: 1, Signal: "view"}})
	if err == nil || ack.Attempts != 3 {
		t.Fatalf("expected 3 failed attempts, found %+v, %v", ack, err)
	}
	if IsIndefinite(err) {
		t.Fatalf("a refused connection never carried the write, yet reported indefinite: %v", err)
	}
	if !strings.Contains(err.Error(), "POST /v1/signals") {
		t.Fatalf("transport error does not name the call: %v", err)
	}
}

func TestConnectionDroppedMidRequestIsRetried(t *testing.T) {
	var n atomic.Int32
	rc := &recorder{script: []func(http.ResponseWriter){status(204, "X-Tidal-Seq", "3")}}
	_, c := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			_, _ = io.ReadAll(r.Body) // the server got the write, then died
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
			rc.mu.Lock()
			rc.bodies = append(rc.bodies, nil)
			rc.mu.Unlock()
			return
		}
		rc.ServeHTTP(w, r)
	}))
	ack, err := c.WriteSignals(context.Background(), []Event{{ID: "e9", Entity: 1, Signal: "view"}})
	if err != nil || ack.Seq != 3 || ack.Attempts < 2 {
		t.Fatalf("expected success after a dropped connection, found %+v, %v", ack, err)
	}
	if !bytes.Contains(rc.bodies[len(rc.bodies)-1], []byte(`"id":"e9"`)) {
		t.Fatalf("the retry did not carry the original id: %s", rc.bodies[len(rc.bodies)-1])
	}
}

func TestMalformedAckHeaderIsIndefinite(t *testing.T) {
	rc := &recorder{script: []func(http.ResponseWriter){status(204, "X-Tidal-Seq", "seven")}}
	_, c := serve(t, rc)
	_, err := c.WriteSignals(context.Background(), []Event{{ID: "e", Entity: 1, Signal: "view"}})
	if err == nil || !strings.Contains(err.Error(), `X-Tidal-Seq: expected an unsigned integer, found "seven"`) {
		t.Fatalf("expected a header error, found %v", err)
	}
	// The server said 204: the write happened even if the ack is unreadable.
	if !IsIndefinite(err) || rc.count() != 1 {
		t.Fatalf("expected one attempt and an indefinite outcome, found %d, %v", rc.count(), err)
	}
}

func TestAuditEventsStreams(t *testing.T) {
	const total = 5000
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/audit/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := range total {
			fmt.Fprintf(w, `{"id":"e%d","index":%d,"term":2,"entity":%d,"signal":"view"}`+"\n", i, i+1, i%7)
			if i%1000 == 0 {
				w.(http.Flusher).Flush()
			}
		}
	})
	mux.HandleFunc("GET /broken/v1/audit/events", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `{"id":"e0","index":1,"term":2,"entity":1,"signal":"view"}`)
		fmt.Fprint(w, `{"id":"e1","ind`)
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // cut the stream mid-line
	})
	srv, c := serve(t, mux)
	ctx := context.Background()

	var got []Location
	if err := c.AuditEvents(ctx, func(l Location) error { got = append(got, l); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != total {
		t.Fatalf("expected %d events, found %d", total, len(got))
	}
	for i, l := range got {
		if l != (Location{ID: fmt.Sprintf("e%d", i), Index: uint64(i + 1), Term: 2, Entity: uint64(i % 7), Signal: "view"}) {
			t.Fatalf("event %d decoded as %+v", i, l)
		}
	}

	stop := errors.New("seen enough")
	seen := 0
	err := c.AuditEvents(ctx, func(Location) error {
		if seen++; seen == 10 {
			return stop
		}
		return nil
	})
	if err != stop || seen != 10 {
		t.Fatalf("expected the callback's error after 10 events, found %v after %d", err, seen)
	}

	broken := New(srv.URL+"/broken", WithBackoff(time.Millisecond, time.Millisecond))
	defer broken.CloseIdleConnections()
	seen = 0
	err = broken.AuditEvents(ctx, func(Location) error { seen++; return nil })
	if err == nil || seen != 1 {
		t.Fatalf("a stream cut mid-line must fail after the complete line, found %v after %d events", err, seen)
	}
}

func TestStreamOutlivesAttemptTimeout(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/backup", func(w http.ResponseWriter, r *http.Request) {
		for i := range 6 {
			fmt.Fprintf(w, "chunk%d;", i)
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
	})
	_, c := serve(t, mux, WithTimeout(100*time.Millisecond))
	var buf bytes.Buffer
	n, err := c.Backup(context.Background(), &buf)
	if err != nil || buf.String() != "chunk0;chunk1;chunk2;chunk3;chunk4;chunk5;" || n != int64(buf.Len()) {
		t.Fatalf("a 300ms stream under a 100ms attempt timeout: %d bytes %q, %v", n, buf.String(), err)
	}
}

func TestProbes(t *testing.T) {
	var ready atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ready.Add(1)
		w.Header().Set("Retry-After", "1")
		writeError(w, 503, CodeUnavailable, "", "no leader")
	})
	_, c := serve(t, mux)
	if err := c.Healthy(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := c.Ready(context.Background())
	if !IsUnavailable(err) || !strings.Contains(err.Error(), "no leader") {
		t.Fatalf("expected unavailable with the reason, found %v", err)
	}
	// A probe answers at once: one request, no retry after Retry-After
	// (a count, not a time: the machine may be slow).
	if ready.Load() != 1 {
		t.Fatalf("a probe must answer at once: expected 1 request, found %d", ready.Load())
	}
}

func TestKeepAliveReuse(t *testing.T) {
	base := runtime.NumGoroutine()
	var conns atomic.Int32
	rc := &recorder{script: []func(http.ResponseWriter){status(204, "X-Tidal-Seq", "1")}}
	srv := httptest.NewUnstartedServer(rc)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	c := New(srv.Listener.Addr().String())
	ctx := context.Background()
	for i := range 50 {
		if _, err := c.WriteSignals(ctx, []Event{{ID: fmt.Sprint(i), Entity: 1, Signal: "view"}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("50 sequential requests opened %d connections, expected 1", n)
	}
	const workers = 16
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				if _, err := c.WriteSignals(ctx, []Event{{ID: fmt.Sprint(w, "-", i), Entity: 1, Signal: "view"}}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// 400 requests: reuse means a handful of connections per worker at
	// most, not one per request. net/http may dial a spare connection
	// while another is on its way back to the pool, more so on a loaded
	// machine, so the bound leaves room for that race.
	if n := conns.Load(); n > 2*workers {
		t.Fatalf("%d concurrent workers opened %d connections; idle ones are not being reused", workers, n)
	}

	c.CloseIdleConnections()
	srv.Close()
	// Every goroutine the client and server started must be gone.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines leaked: %d > %d\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WithBinaryVectors sends the vector as raw
// little-endian float32s with the id (or k) in the query.
func TestBinaryVectors(t *testing.T) {
	vec := []float32{0.1, -2.5e-8, 3.4028235e38, 1.0000001}
	decode := func(r *http.Request) []float32 {
		b, _ := io.ReadAll(r.Body)
		out := make([]float32, len(b)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out
	}
	var put, query []float32
	var id, k, putType, queryType string
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/entities/{entity}/embedding", func(w http.ResponseWriter, r *http.Request) {
		put, id, putType = decode(r), r.URL.Query().Get("id"), r.Header.Get("Content-Type")
		w.Header().Set("X-Tidal-Seq", "5")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/query/nearest", func(w http.ResponseWriter, r *http.Request) {
		query, k, queryType = decode(r), r.URL.Query().Get("k"), r.Header.Get("Content-Type")
		fmt.Fprint(w, `{"results":[{"entity":42,"score":1}]}`)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := New(srv.Listener.Addr().String(), WithBinaryVectors())
	t.Cleanup(c.CloseIdleConnections)
	if _, err := c.PutEmbedding(context.Background(), 42, "w 1", vec); err != nil {
		t.Fatal(err)
	}
	ms, err := c.Nearest(context.Background(), vec, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(put, vec) || !slices.Equal(query, vec) || id != "w 1" || k != "3" || len(ms) != 1 {
		t.Fatalf("put %v id %q, query %v k %q, matches %v; want %v, id \"w 1\", k 3", put, id, query, k, ms, vec)
	}
	if putType != "application/octet-stream" || queryType != "application/octet-stream" {
		t.Fatalf("content types %q and %q, want application/octet-stream", putType, queryType)
	}
}

// A membership change refused while the leader transfers leadership (503
// naming the transfer, with Retry-After) is retried after the Retry-After,
// the same request resent; a transfer the leader abandoned (409) is not
// retried, since asking again would refuse writes for another election
// timeout.
func TestAdminRetriesTransferRefusals(t *testing.T) {
	transferring := func(w http.ResponseWriter) {
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, CodeUnavailable, "", "replica: leader transfer in progress from 1 to 2; the proposal was dropped by raft and not applied; retry after 1s")
	}
	rc := &recorder{script: []func(http.ResponseWriter){transferring, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":4,"peer_addr":"127.0.0.1:7104"}`)
	}}}
	_, c := serve(t, rc)
	if _, err := c.AddMember(context.Background(), Member{ID: 4, PeerAddr: "127.0.0.1:7104"}); err != nil {
		t.Fatalf("add member after a transfer refusal: %v", err)
	}
	if rc.count() != 2 || !bytes.Equal(rc.bodies[0], rc.bodies[1]) {
		t.Fatalf("expected the same request twice, server saw %q", rc.bodies)
	}
	if gap := rc.arrived[1].Sub(rc.arrived[0]); gap < 950*time.Millisecond {
		t.Fatalf("retried after %v, before the server's Retry-After of 1s", gap)
	}

	rc = &recorder{script: []func(http.ResponseWriter){transferring}}
	_, c = serve(t, rc, WithRetries(0))
	_, err := c.AddMember(context.Background(), Member{ID: 4, PeerAddr: "127.0.0.1:7104"})
	if !IsUnavailable(err) || IsIndefinite(err) || !strings.Contains(err.Error(), "leader transfer in progress") || !strings.Contains(err.Error(), "retry after 1s") {
		t.Fatalf("expected a definite 503 naming the transfer and its Retry-After, got %v", err)
	}

	rc = &recorder{script: []func(http.ResponseWriter){status(http.StatusConflict), status(http.StatusNoContent)}}
	_, c = serve(t, rc)
	if err := c.TransferLeader(context.Background(), 2); !IsConflict(err) || rc.count() != 1 {
		t.Fatalf("abandoned transfer: expected one 409, got %d requests: %v", rc.count(), err)
	}
}
