package server

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serveHTTP serves h with the client plane's http.Server settings from
// cfg (defaults filled) on a loopback listener capped at cfg.MaxConns.
func serveHTTP(t *testing.T, cfg Config, h http.Handler) string {
	t.Helper()
	if err := httpDefaults(&cfg); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	srv := newHTTPServer(cfg, h, log)
	go srv.Serve(newConnLimit(lis, cfg.MaxConns, prometheus.NewRegistry(), log))
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

// --http-read-timeout bounds reading a request, not the
// work after it: a handler that read its body and works past the read
// deadline (a write waiting for its commit) keeps its context, or a known
// outcome would end as an unknown one. net/http lifts the connection's
// read deadline once the body is read; this pins that the server relies
// on it.
func TestReadTimeoutDoesNotCancelAHandlerThatReadItsBody(t *testing.T) {
	cancelled := make(chan bool, 1)
	addr := serveHTTP(t, Config{HTTPReadHeaderTimeout: 100 * time.Millisecond, HTTPReadTimeout: 200 * time.Millisecond},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			// Work past the read deadline, as a write waiting for its
			// commit does, watching the request's context.
			select {
			case <-r.Context().Done():
				cancelled <- true
			case <-time.After(time.Second):
				cancelled <- false
			}
			w.WriteHeader(http.StatusNoContent)
		}))
	resp, err := http.Post("http://"+addr+"/v1/signals", "application/json", strings.NewReader(`{"events":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if <-cancelled {
		t.Fatal("the request's context was cancelled by the read deadline after its body had been read")
	}
}

// A body that does not arrive within --http-read-timeout
// is cut off.
func TestReadTimeoutCutsASlowBody(t *testing.T) {
	got := make(chan error, 1)
	addr := serveHTTP(t, Config{HTTPReadHeaderTimeout: 100 * time.Millisecond, HTTPReadTimeout: 300 * time.Millisecond},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, err := io.Copy(io.Discard, r.Body)
			got <- err
		}))
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Headers promising 1000 bytes, then a trickle that never finishes.
	io.WriteString(conn, "POST /v1/signals HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	select {
	case err := <-got:
		if err == nil {
			t.Fatal("a body that never arrived was read without error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the slow body was not cut off")
	}
}

// Streaming routes get --http-stream-timeout to write; others are held to
// --http-write-timeout.
func TestStreamRoutesOutliveTheWriteTimeout(t *testing.T) {
	addr := serveHTTP(t, Config{HTTPWriteTimeout: 200 * time.Millisecond, HTTPStreamTimeout: time.Minute},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			time.Sleep(600 * time.Millisecond) // past the write deadline
			io.WriteString(w, "tail\n")
		}))
	for path, wantTail := range map[string]bool{"/v1/audit/events": true, "/admin/backup": true, "/v1/top": false} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := strings.Contains(string(body), "tail"); got != wantTail {
			t.Errorf("%s: expected the write after the write timeout delivered: %v, found %v", path, wantTail, got)
		}
	}
}

// Past --max-conns a connection is answered 503 with Retry-After and
// closed; past twice the cap it is closed at accept. A probe (/healthz,
// /readyz) on a connection past the cap is served, and closes it.
func TestConnectionCap(t *testing.T) {
	addr := serveHTTP(t, Config{MaxConns: 1}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	requestPath := func(c net.Conn, path string) (*http.Response, error) {
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		return http.ReadResponse(bufio.NewReader(c), nil)
	}
	request := func(c net.Conn) (*http.Response, error) { return requestPath(c, "/v1/top?signal=view") }
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	first := dial()
	if resp, err := request(first); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first connection: expected 200, got %v %v", resp, err)
	}
	// The second connection is over the cap; it stays open (idle) while
	// the third comes in past twice the cap.
	second := dial()
	third := dial()
	if _, err := request(third); err == nil {
		t.Fatal("third connection past twice the cap: expected it closed at accept, got an answer")
	}
	resp, err := request(second)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !resp.Close {
		t.Fatalf("second connection past a cap of 1: expected 503 with Retry-After and Connection: close, got %v %v", resp, err)
	}
	// The first connection still works: the cap shed the others only.
	if resp, err := request(first); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("first connection after the shedding: expected 200, got %v %v", resp, err)
	}
}

// A probe on a connection past --max-conns is served, and closes its
// connection; any other request on such a connection is still 503.
func TestConnectionCapServesProbes(t *testing.T) {
	addr := serveHTTP(t, Config{MaxConns: 2}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	request := func(c net.Conn, path string) (*http.Response, error) {
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		return http.ReadResponse(bufio.NewReader(c), nil)
	}
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Two connections hold the cap (each answered, so each was accepted).
	for range 2 {
		if resp, err := request(dial(), "/healthz"); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("a connection within the cap: expected 200, got %v %v", resp, err)
		}
	}
	// Up to two more fit past the cap whatever the closes below race.
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := request(dial(), path)
		if err != nil || resp.StatusCode != http.StatusOK || !resp.Close {
			t.Fatalf("%s on a connection past the cap: expected 200 with Connection: close, got %v %v", path, resp, err)
		}
	}
}

// http.Server's error log: the first line of a kind, then at most one per
// period with the count suppressed.
func TestQuietErrors(t *testing.T) {
	var out logBuffer
	q := newQuietErrors(slog.New(slog.NewTextHandler(&out, nil)), 10*time.Second)
	now := time.Unix(1000, 0)
	q.now = func() time.Time { return now }
	l := slog.NewLogLogger(q.handler(), slog.LevelWarn)
	for i := 0; i < 5; i++ {
		l.Printf("http: TLS handshake error from 127.0.0.1:%d: remote error: tls: bad certificate", 40000+i)
	}
	l.Printf("http: Accept error: too many open files; retrying in 5ms")
	now = now.Add(11 * time.Second)
	l.Printf("http: TLS handshake error from 127.0.0.1:1: EOF")
	got := out.String()
	if n := strings.Count(got, "TLS handshake error"); n != 2 {
		t.Fatalf("expected 2 handshake lines (first, then one after the period), found %d:\n%s", n, got)
	}
	if !strings.Contains(got, "suppressed_since_last=4") || !strings.Contains(got, "Accept error") {
		t.Fatalf("expected the suppressed count and the other kind logged:\n%s", got)
	}
	if kindOf("http2: server: error reading preface from client 1.2.3.4:5: EOF") != "http2: server: error reading preface" {
		t.Fatalf("kindOf: %q", kindOf("http2: server: error reading preface from client 1.2.3.4:5: EOF"))
	}
}
