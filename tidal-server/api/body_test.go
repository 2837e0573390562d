package api

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// answerWait bounds how long a test waits for an answer the server owes.
// It is generous (the machine is shared and loaded); a server without the
// rule under test never answers, so the test fails rather than hangs.
const answerWait = 20 * time.Second

// rawConn is an HTTP/1.1 client that sends a request's head and its body
// in pieces, so tests can play a slow or stalled client.
type rawConn struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
}

func dialRaw(t *testing.T, srv *httptest.Server) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, conn: c, br: bufio.NewReader(c)}
}

// head sends a POST's request line and headers declaring length bytes.
func (c *rawConn) head(path string, length int) {
	c.t.Helper()
	_, err := fmt.Fprintf(c.conn, "POST %s HTTP/1.1\r\nHost: tidal\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, length)
	if err != nil {
		c.t.Fatal(err)
	}
}

func (c *rawConn) send(b []byte) error {
	c.conn.SetWriteDeadline(time.Now().Add(answerWait))
	_, err := c.conn.Write(b)
	return err
}

// answer reads the response, waiting at most wait; nil when none came.
func (c *rawConn) answer(wait time.Duration) (*http.Response, []byte, error) {
	c.conn.SetReadDeadline(time.Now().Add(wait))
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body, err
}

// closed reports whether the server closed the connection (a read ends
// in EOF or reset within answerWait).
func (c *rawConn) closed() bool {
	c.conn.SetReadDeadline(time.Now().Add(answerWait))
	_, err := c.br.ReadByte()
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return err != nil
}

// paddedBatch is a valid one-event batch padded with leading spaces to
// exactly size bytes.
func paddedBatch(id string, size int) []byte {
	core := `{"events":[{"id":"` + id + `","entity":1,"signal":"view"}]}`
	return []byte(strings.Repeat(" ", size-len(core)) + core)
}

// metricValue reads one sample from /metrics; -1 when absent.
func metricValue(t *testing.T, e *env, sample string) float64 {
	t.Helper()
	m := e.get("/metrics").Body.String()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`)
	got := re.FindStringSubmatch(m)
	if got == nil {
		return -1
	}
	v, err := strconv.ParseFloat(got[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func errorCodeOf(t *testing.T, body []byte) (code, field, message string) {
	t.Helper()
	var b errorBody
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return b.Error.Code, b.Error.Field, b.Error.Message
}

// Regression: bodies were read with io.ReadAll whatever
// else was in flight, so 60 connections each trickling a 7 MiB body took
// a node from 166 MB to 909 MB. Now every body is charged to a byte budget
// before it is read; one that does not fit is refused with 503 and
// Retry-After before a byte of it is read, and the bodies held at once
// never exceed the budget.
func TestBytesInFlightBoundHoldsWhateverClientsSend(t *testing.T) {
	const (
		size    = 512 << 10
		budget  = 2 << 20
		clients = 12
	)
	e := newEnv(t, Options{MaxBodyBytes: 1 << 20, MaxInflightBytes: budget, BodyReadTimeout: time.Minute, MinBodyRate: -1})
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close) // registered first, so it runs after dialRaw has closed the conns

	var admitted, shed []*rawConn
	for i := 0; i < clients; i++ {
		c := dialRaw(t, srv)
		before := metricValue(t, e, "tidal_http_inflight_bytes")
		c.head("/v1/signals", size)
		// Each client sends its head only, then waits for one of two
		// things: the server charges its body (it is admitted and reading)
		// or answers without having read it.
		deadline := time.Now().Add(answerWait)
		for {
			if v := metricValue(t, e, "tidal_http_inflight_bytes"); v == before+size {
				admitted = append(admitted, c)
				break
			}
			resp, body, err := c.answer(50 * time.Millisecond)
			if err == nil {
				code, _, msg := errorCodeOf(t, body)
				if resp.StatusCode != http.StatusServiceUnavailable || code != CodeUnavailable || resp.Header.Get("Retry-After") == "" {
					t.Fatalf("client %d: answered %d %s (Retry-After %q), want 503 unavailable with Retry-After", i, resp.StatusCode, body, resp.Header.Get("Retry-After"))
				}
				if !strings.Contains(msg, "--max-inflight-bytes") {
					t.Errorf("client %d: 503 message %q does not name --max-inflight-bytes", i, msg)
				}
				shed = append(shed, c)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("client %d: its %d-byte body was neither charged to the in-flight budget nor refused within %v (%d admitted so far)",
					i, size, answerWait, len(admitted))
			}
		}
	}
	if len(admitted) != budget/size || len(shed) != clients-budget/size {
		t.Fatalf("%d bodies admitted and %d shed, want %d and %d: the budget holds %d bytes of %d-byte bodies",
			len(admitted), len(shed), budget/size, clients-budget/size, budget, size)
	}
	if v := metricValue(t, e, "tidal_http_inflight_bytes"); v > budget {
		t.Fatalf("tidal_http_inflight_bytes %v over the budget %d", v, budget)
	}
	if got := metricValue(t, e, `tidal_http_shed_total{reason="inflight_bytes"}`); got != float64(len(shed)) {
		t.Errorf(`tidal_http_shed_total{reason="inflight_bytes"} = %v, want %d`, got, len(shed))
	}
	// The admitted bodies complete normally and give their bytes back.
	for i, c := range admitted {
		if err := c.send(paddedBatch(fmt.Sprintf("big-%d", i), size)); err != nil {
			t.Fatal(err)
		}
		resp, body, err := c.answer(answerWait)
		if err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("admitted body %d: %v %v %s, want 204", i, err, resp, body)
		}
	}
	if v := metricValue(t, e, "tidal_http_inflight_bytes"); v != 0 {
		t.Fatalf("tidal_http_inflight_bytes %v after every body was answered, want 0", v)
	}
}

// TestUndeclaredLengthIsChargedAsItArrives sends chunked bodies: they are
// charged as they grow, so one larger than the budget's room is refused
// midway (503), and one within it is served.
func TestUndeclaredLengthIsChargedAsItArrives(t *testing.T) {
	e := newEnv(t, Options{MaxBodyBytes: 1 << 20, MaxInflightBytes: 1 << 20})
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close) // registered first, so it runs after dialRaw has closed the conns
	post := func(body []byte) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/signals", io.MultiReader(strings.NewReader(string(body))))
		req.ContentLength = -1 // chunked
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	if resp, b := post(paddedBatch("chunked", 300<<10)); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("a 300 KiB chunked body answered %d %s, want 204", resp.StatusCode, b)
	}
	// Hold 700 KiB of the budget with a declared body that stalls.
	c := dialRaw(t, srv)
	c.head("/v1/signals", 700<<10)
	deadline := time.Now().Add(answerWait)
	for metricValue(t, e, "tidal_http_inflight_bytes") != 700<<10 {
		if time.Now().After(deadline) {
			t.Fatal("the declared body was never charged")
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp, b := post(paddedBatch("chunked-2", 500<<10))
	if code, _, _ := errorCodeOf(t, b); resp.StatusCode != http.StatusServiceUnavailable || code != CodeUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a 500 KiB chunked body with 324 KiB of budget left answered %d %s, want 503 with Retry-After", resp.StatusCode, b)
	}
	c.conn.Close() // gives its 700 KiB back
	deadline = time.Now().Add(answerWait)
	for metricValue(t, e, "tidal_http_inflight_bytes") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a closed connection's body stayed charged")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if resp, b := post(paddedBatch("chunked-3", 1<<20+1)); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a chunked body over --max-body-bytes answered %d %s, want 413", resp.StatusCode, b)
	}
}

// Regression: a body sent slowly was waited for forever.
// Now a body must average MinBodyRate once BodyRateGrace has passed; a
// slower one is cut with 408 and its connection closed.
func TestSlowBodyIsCutByTheMinimumRate(t *testing.T) {
	e := newEnv(t, Options{MinBodyRate: 1000, BodyRateGrace: 300 * time.Millisecond, BodyReadTimeout: 10 * time.Minute})
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close) // registered first, so it runs after dialRaw has closed the conns
	c := dialRaw(t, srv)
	c.head("/v1/signals", 100<<10)
	if err := c.send([]byte("          ")); err != nil {
		t.Fatal(err)
	}
	resp, body, err := c.answer(answerWait)
	if err != nil {
		t.Fatalf("a body stalled after 10 bytes got no answer within %v (the minimum rate is 1000 bytes/s after 300ms): %v", answerWait, err)
	}
	code, field, msg := errorCodeOf(t, body)
	if resp.StatusCode != http.StatusRequestTimeout || code != CodeBodyTimeout || field != "body" || !strings.Contains(msg, "--min-body-rate") {
		t.Fatalf("answered %d %s, want 408 request_timeout on body naming --min-body-rate", resp.StatusCode, body)
	}
	if !c.closed() {
		t.Fatal("the connection stayed open after its body was cut")
	}
	if got := metricValue(t, e, `tidal_http_body_cut_total{reason="rate"}`); got != 1 {
		t.Errorf(`tidal_http_body_cut_total{reason="rate"} = %v, want 1`, got)
	}
	e.wantNothingWritten()
}

// Regression: the minimum rate alone lets a client that
// sent most of its body quickly stall on the rest for as long as its
// credit lasts (7 MiB at 64 KiB/s is nearly two minutes); the overall
// deadline cuts it.
func TestBodyDeadlineCutsAFastStartThatStalls(t *testing.T) {
	e := newEnv(t, Options{MinBodyRate: 1000, BodyRateGrace: time.Second, BodyReadTimeout: 500 * time.Millisecond})
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close) // registered first, so it runs after dialRaw has closed the conns
	c := dialRaw(t, srv)
	c.head("/v1/signals", 1<<20)
	if err := c.send(make([]byte, 512<<10)); err != nil {
		t.Fatal(err)
	}
	resp, body, err := c.answer(answerWait)
	if err != nil {
		t.Fatalf("a body stalled after 512 KiB got no answer within %v (body deadline 500ms): %v", answerWait, err)
	}
	code, field, msg := errorCodeOf(t, body)
	if resp.StatusCode != http.StatusRequestTimeout || code != CodeBodyTimeout || field != "body" || !strings.Contains(msg, "--http-read-timeout") {
		t.Fatalf("answered %d %s, want 408 request_timeout on body naming --http-read-timeout", resp.StatusCode, body)
	}
	if got := metricValue(t, e, `tidal_http_body_cut_total{reason="deadline"}`); got != 1 {
		t.Errorf(`tidal_http_body_cut_total{reason="deadline"} = %v, want 1`, got)
	}
}

// TestBodyThatKeepsPaceIsServed sends a body in pieces well above the
// minimum rate, for longer than the grace period: it is not cut.
func TestBodyThatKeepsPaceIsServed(t *testing.T) {
	e := newEnv(t, Options{MinBodyRate: 8 << 10, BodyRateGrace: 100 * time.Millisecond})
	srv := httptest.NewServer(e.h)
	t.Cleanup(srv.Close) // registered first, so it runs after dialRaw has closed the conns
	c := dialRaw(t, srv)
	body := paddedBatch("paced", 64<<10)
	c.head("/v1/signals", len(body))
	for off := 0; off < len(body); off += 8 << 10 {
		if err := c.send(body[off:min(off+8<<10, len(body))]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond) // pacing the client: 160 KiB/s, 20x the minimum
	}
	resp, b, err := c.answer(answerWait)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("a body sent at 20x the minimum rate: %v %v %s, want 204", err, resp, b)
	}
}

// TestBodyDeadlineEndsWithTheBody: the body's read deadline is on the
// connection (HTTP/1.1) or the stream (HTTP/2), and a failed read of an
// HTTP/1.1 connection cancels the request's context. A deadline that
// outlived the body would cancel a write waiting for commit and turn it
// into an unknown outcome; over both protocols, a write that waits past
// its body's deadline is acknowledged.
func TestBodyDeadlineEndsWithTheBody(t *testing.T) {
	for _, major := range []int{1, 2} {
		t.Run(fmt.Sprintf("HTTP/%d", major), func(t *testing.T) {
			e := newEnv(t, Options{BodyReadTimeout: 200 * time.Millisecond, MinBodyRate: 1 << 20, BodyRateGrace: time.Millisecond})
			srv := httptest.NewUnstartedServer(e.h)
			client := &http.Client{}
			if major == 2 {
				srv.Config.Protocols = new(http.Protocols)
				srv.Config.Protocols.SetUnencryptedHTTP2(true)
				tr := &http.Transport{Protocols: new(http.Protocols), TLSClientConfig: &tls.Config{}}
				tr.Protocols.SetUnencryptedHTTP2(true)
				defer tr.CloseIdleConnections()
				client.Transport = tr
			}
			srv.Start()
			t.Cleanup(srv.Close)
			e.fake.onWrite = func(ctx context.Context) error {
				select { // outlive both body bounds
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(700 * time.Millisecond):
					return nil
				}
			}
			resp, err := client.Post(srv.URL+"/v1/signals", "application/json", strings.NewReader(`{"events":[`+goodEvents(1)[0]+`]}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent || resp.ProtoMajor != major {
				t.Fatalf("a write that waited past its body's deadline answered %s %d %s, want HTTP/%d 204", resp.Proto, resp.StatusCode, b, major)
			}
		})
	}
}

// TestSlowBodyIsCutOverHTTP2 checks the rate bound on an HTTP/2 stream
// (the deadline is the stream's, not the connection's).
func TestSlowBodyIsCutOverHTTP2(t *testing.T) {
	e := newEnv(t, Options{MinBodyRate: 1000, BodyRateGrace: 300 * time.Millisecond})
	srv := httptest.NewUnstartedServer(e.h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	tr := &http.Transport{Protocols: new(http.Protocols), TLSClientConfig: &tls.Config{}}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()

	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte("          ")) // ten bytes, then nothing
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/signals", pr)
	req.ContentLength = 100 << 10
	req.Header.Set("Content-Type", "application/json")
	ctx, cancel := context.WithTimeout(context.Background(), answerWait)
	defer cancel()
	resp, err := (&http.Client{Transport: tr}).Do(req.WithContext(ctx))
	if err != nil {
		if ctx.Err() != nil {
			t.Fatalf("a stalled HTTP/2 body got no answer within %v", answerWait)
		}
		// The stream was reset: cut, as it should be.
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("a stalled HTTP/2 body answered %s %d %s, want HTTP/2 408", resp.Proto, resp.StatusCode, b)
		}
	}
	if got := metricValue(t, e, `tidal_http_body_cut_total{reason="rate"}`); got != 1 {
		t.Errorf(`tidal_http_body_cut_total{reason="rate"} = %v, want 1`, got)
	}
}
