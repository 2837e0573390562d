package server

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

// BenchmarkClientPlaneTransport is the cost of the client plane's
// transport alone (no raft, no API): a small POST answered 204, sent by
// parallel clients over plaintext HTTP/1.1, TLS with HTTP/1.1 and TLS with
// HTTP/2, with the node's http.Server settings. Client and server share
// the process, so ns/op counts both ends' work.
// bench/results/history-2026-12.md ("TLS on the client plane") records the
// figures.
func BenchmarkClientPlaneTransport(b *testing.B) {
	dir := makeCerts(b, 1)
	store, err := LoadCerts(dir, nil)
	if err != nil {
		b.Fatal(err)
	}
	body := `{"events":[{"id":"bench-0000000001","entity":42,"signal":"view"}]}`
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})
	for _, mode := range []struct {
		name       string
		tls, http2 bool
	}{{"plain-http1", false, false}, {"tls-http1", true, false}, {"tls-http2", true, true}} {
		b.Run(mode.name, func(b *testing.B) {
			cfg := Config{}
			if err := httpDefaults(&cfg); err != nil {
				b.Fatal(err)
			}
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			log := slog.New(slog.DiscardHandler)
			srv := newHTTPServer(cfg, handler, log)
			limited := newConnLimit(lis, cfg.MaxConns, prometheus.NewRegistry(), log)
			tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
			url := "http://" + lis.Addr().String() + "/v1/signals"
			if mode.tls {
				srv.TLSConfig = store.ServerTLS()
				go srv.ServeTLS(limited, "", "")
				cc, err := certs.ClientTLS(dir, "writer")
				if err != nil {
					b.Fatal(err)
				}
				if !mode.http2 {
					cc.NextProtos = []string{"http/1.1"}
				}
				tr.TLSClientConfig, tr.ForceAttemptHTTP2 = cc, mode.http2
				url = "https://" + lis.Addr().String() + "/v1/signals"
			} else {
				go srv.Serve(limited)
			}
			defer srv.Close()
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr}
			b.SetParallelism(16) // 16 x GOMAXPROCS concurrent requests
			b.ReportAllocs()
			// CPU time (both ends, user + system) per request moves less
			// with the machine's load than ns/op does.
			cpu0 := cpuTime()
			b.ResetTimer()
			defer func() { b.ReportMetric(float64(cpuTime()-cpu0)/1e3/float64(b.N), "cpu-µs/op") }()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := hc.Post(url, "application/json", strings.NewReader(body))
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusNoContent {
						b.Errorf("expected 204, got %d", resp.StatusCode)
						return
					}
				}
			})
		})
	}
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
