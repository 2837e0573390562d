package main

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// TestEventsAreUniqueAndTheSameForBothSystems: ids never repeat across
// workers, sequence numbers and batch positions (a repeat would be folded
// as a retry by tidal and be cheaper), and etcd stores exactly the JSON
// of the event tidal receives, under the entity's key.
func TestEventsAreUniqueAndTheSameForBothSystems(t *testing.T) {
	ev := newEvents(42, 1000, "view")
	seen := map[string]bool{}
	for w := range 3 {
		r := ev.rng(w)
		for seq := range uint64(20) {
			for i := range 3 {
				e := ev.event(w, seq, i, ev.entity(r))
				if seen[e.ID] {
					t.Fatalf("id %q repeated", e.ID)
				}
				seen[e.ID] = true
				if e.Entity < 1 || e.Entity > 1000 || e.Signal != "view" {
					t.Fatalf("expected entity in 1..1000 and signal view, found %+v", e)
				}
			}
		}
	}
	e := ev.event(1, 2, 0, 77)
	key, value := etcdPut(e)
	if key != "/tidal-bench/signals/77" {
		t.Errorf("expected the entity's key, found %q", key)
	}
	var back client.Event
	if err := json.Unmarshal(value, &back); err != nil || back != e {
		t.Errorf("expected etcd's value to be the event's JSON, found %s (%v)", value, err)
	}
	if other := newEvents(43, 1000, "view").event(1, 2, 0, 77); other.ID == e.ID || !strings.HasSuffix(e.ID, "-1-2-0") {
		t.Errorf("expected runs with different seeds to use different ids, found %q and %q", e.ID, other.ID)
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	for name, o := range map[string]options{
		"no endpoints":               {system: "tidal", batch: 1, clients: 1},
		"bad system":                 {system: "redis", endpoints: []string{"127.0.0.1:1"}, batch: 1, clients: 1},
		"etcd batch":                 {system: "etcd", endpoints: []string{"127.0.0.1:1"}, batch: 100, clients: 1},
		"zero batch":                 {system: "tidal", endpoints: []string{"127.0.0.1:1"}, batch: 0, clients: 1},
		"bad protocol":               {system: "tidal", endpoints: []string{"127.0.0.1:1"}, batch: 1, clients: 1, protocol: "quic"},
		"grpc without its endpoints": {system: "tidal", endpoints: []string{"127.0.0.1:1"}, batch: 1, clients: 1, protocol: "grpc"},
	} {
		if err := run(t.Context(), o); err == nil {
			t.Errorf("%s: expected an error", name)
		}
	}
}

// TestTidalCredentials: plaintext has no options; -http1 without
// -certs-dir is refused; -certs-dir presents the client certificate over
// TLS, on HTTP/2 by default (one shared connection) and with -http1 on
// HTTP/1.1 only (one connection per worker), which the record's
// connection count says.
func TestTidalCredentials(t *testing.T) {
	if opts, err := tidalCredentials(options{}); err != nil || len(opts) != 0 {
		t.Fatalf("plaintext: expected no options and no error, found %d, %v", len(opts), err)
	}
	if _, err := tidalCredentials(options{http1: true}); err == nil || !strings.Contains(err.Error(), "-certs-dir") {
		t.Fatalf("-http1 alone: expected an error naming -certs-dir, found %v", err)
	}
	if _, err := tidalCredentials(options{certsDir: t.TempDir(), certName: "writer"}); err == nil || !strings.Contains(err.Error(), "-certs-dir") {
		t.Fatalf("an empty certs dir: expected an error naming -certs-dir, found %v", err)
	}
	dir := t.TempDir()
	if _, err := certs.CreateCA(certs.CreateOptions{CertsDir: dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateClient(certs.CreateOptions{CertsDir: dir}, "writer", auth.Writer); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		http1       bool
		options     int
		connections int
	}{{false, 1, 1}, {true, 2, 64}} {
		opts, err := tidalCredentials(options{certsDir: dir, certName: "writer", http1: tc.http1})
		if err != nil || len(opts) != tc.options {
			t.Fatalf("http1=%v: expected %d options, found %d, %v", tc.http1, tc.options, len(opts), err)
		}
		tt := &tidalTarget{opts: opts, http1: tc.http1, workers: 64}
		if got := tt.connections(); got != tc.connections {
			t.Errorf("http1=%v: expected %d connections recorded for 64 workers, found %d", tc.http1, tc.connections, got)
		}
		if c := client.New("127.0.0.1:1", opts...); !strings.HasPrefix(c.Addr(), "https://") {
			t.Errorf("http1=%v: expected an https:// base, found %s", tc.http1, c.Addr())
		}
	}
}

// writerCerts makes a CA and a writer's client certificate in a new
// directory: what -certs-dir points at.
func writerCerts(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if _, err := certs.CreateCA(certs.CreateOptions{CertsDir: dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateClient(certs.CreateOptions{CertsDir: dir}, "writer", auth.Writer); err != nil {
		t.Fatal(err)
	}
	return dir
}

// -http1 is about HTTPS; the ingest stream is gRPC, HTTP/2 only, so the
// two together are refused with an error naming both flags rather than
// -http1 silently doing nothing.
func TestHTTP1WithTheStreamIsRefused(t *testing.T) {
	o := options{system: "tidal", endpoints: []string{"127.0.0.1:1"}, grpcEndpoints: []string{"127.0.0.1:2"},
		batch: 1, clients: 1, protocol: "grpc", certsDir: writerCerts(t), certName: "writer", http1: true}
	err := run(t.Context(), o)
	if err == nil || !strings.Contains(err.Error(), "-http1") || !strings.Contains(err.Error(), "-protocol grpc") {
		t.Fatalf("expected an error naming -http1 and -protocol grpc, found %v", err)
	}
}

// TestStreamSpeaksTLSWithCertsDir: with -certs-dir the ingest stream's
// connection opens with a TLS handshake (record type 0x16); without it,
// with HTTP/2's plaintext preface ("PRI * HTTP/2.0"). A listener reads the
// first byte each stream sends.
func TestStreamSpeaksTLSWithCertsDir(t *testing.T) {
	dir := writerCerts(t)
	for _, tc := range []struct {
		name      string
		certsDir  string
		firstByte byte
	}{{"tls", dir, 0x16}, {"plaintext", "", 'P'}} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			opts, err := tidalCredentials(options{certsDir: tc.certsDir, certName: "writer"})
			if err != nil {
				t.Fatal(err)
			}
			tt := &tidalTarget{endpoints: []string{"leader"}, grpcEndpoints: []string{ln.Addr().String()}, grpcStreams: 1,
				timeout: time.Minute, batch: 1, events: newEvents(1, 10, "view"), opts: opts}
			defer tt.close()
			newOp, err := tt.connect(t.Context(), "leader", 1)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			done := make(chan error, 1)
			go func() { _, err := newOp(0)(ctx, 0); done <- err }()
			conn, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			first := make([]byte, 1)
			if _, err := conn.Read(first); err != nil {
				t.Fatal(err)
			}
			if first[0] != tc.firstByte {
				t.Errorf("expected the stream's first byte %#x, found %#x", tc.firstByte, first[0])
			}
			if got := tt.connections(); got != 1 {
				t.Errorf("expected 1 connection recorded for one stream, found %d", got)
			}
			cancel()
			conn.Close()
			<-done
		})
	}
}
