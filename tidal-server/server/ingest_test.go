package server

import (
	"context"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// With --grpc-addr and --certs-dir the node serves the ingest
// stream over TLS with the client plane's roles; a write on it is applied
// (readable over HTTP) and acknowledged with its log position.
func TestNodeServesTheIngestStreamSecured(t *testing.T) {
	dir := makeCerts(t, 1)
	srv, logs := startNode(t, Config{CertsDir: dir, GRPCAddr: "127.0.0.1:0"})
	if srv.GRPCAddr() == "" {
		t.Fatalf("expected a gRPC ingest address; log:\n%s", logs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream := func(name string) *client.IngestStream {
		cfg, err := certs.ClientTLS(dir, name)
		if err != nil {
			t.Fatal(err)
		}
		s, err := client.NewIngestStream(srv.GRPCAddr(), client.WithTLS(cfg), client.WithRetries(5), client.WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	ev := []client.Event{{ID: "g1", Entity: 9, Signal: "view"}, {ID: "g2", Entity: 9, Signal: "like"}}
	if _, err := stream("reader").WriteSignals(ctx, ev); !client.IsPermissionDenied(err) {
		t.Fatalf("reader: expected 403, found %v", err)
	}
	w := stream("writer")
	ack, err := w.WriteSignals(ctx, ev)
	if err != nil {
		t.Fatal(err)
	}
	if ack.Seq == 0 || ack.Node != 1 || ack.Duplicates != 0 {
		t.Fatalf("ack %+v: expected a log index, node 1, no duplicates", ack)
	}
	// The retry of the same events is recognised, as over HTTP.
	again, err := w.WriteSignals(ctx, ev)
	if err != nil || again.Duplicates != 2 {
		t.Fatalf("the same events again: expected 2 duplicates, found %+v, %v", again, err)
	}
	cfg, err := certs.ClientTLS(dir, "reader")
	if err != nil {
		t.Fatal(err)
	}
	e, err := client.New(srv.ClientAddr(), client.WithTLS(cfg)).Entity(ctx, 9)
	if err != nil {
		t.Fatal(err)
	}
	if e.Signals["view"].Count != 1 || e.Signals["like"].Count != 1 {
		t.Fatalf("entity 9 over HTTP: expected one view and one like, found %+v", e.Signals)
	}
}
