package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkWriteSignalsSingleGroup is the client's cost of one write to a
// single group, the path every deployment of --shards 1 takes: it must
// stay today's (one request, no map). Compare allocs/op across changes.
func BenchmarkWriteSignalsSingleGroup(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Tidal-Seq", "7")
		w.Header().Set("X-Tidal-Term", "2")
		w.Header().Set("X-Tidal-Node", "1")
		w.WriteHeader(http.StatusNoContent)
	})
	srv := httptest.NewServer(h)
	c := New(srv.Listener.Addr().String())
	b.Cleanup(func() {
		c.CloseIdleConnections()
		srv.Close()
	})
	evs := []Event{{ID: "e-1", Entity: 42, Signal: "view"}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.WriteSignals(ctx, evs); err != nil {
			b.Fatal(err)
		}
	}
}
