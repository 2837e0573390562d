package main

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// flagValue is the value after name in args, and whether name is there.
func flagValue(args []string, name string) (string, bool) {
	i := slices.Index(args, name)
	if i < 0 || i+1 >= len(args) {
		return "", i >= 0
	}
	return args[i+1], true
}

// TestTLSABOnTheStream: -tls-ab -protocol grpc writes both sides on the
// ingest stream, only the secured side with the writer's certificate (TLS
// and the transport are independent flags of storeload); -baseline keeps
// -baseline-protocol for etcd's slot.
func TestTLSABOnTheStream(t *testing.T) {
	so := sbsOptions{tlsAB: true, protocol: "grpc", baselineProtocol: "http", grpcStreams: 2}
	for _, system := range []string{"etcd", "tidal"} {
		if got := so.protocolOf(system); got != "grpc" {
			t.Errorf("-tls-ab -protocol grpc: expected %s's slot on grpc, found %s", system, got)
		}
	}
	secure := &clusterCerts{clientDir: "/certs/clients"}
	for _, tc := range []struct {
		name   string
		secure *clusterCerts
	}{{"plaintext", nil}, {"TLS", secure}} {
		lt := loadTarget{system: "tidal", protocol: "grpc", endpoints: []string{"a:1", "b:1"}, grpcEndpoints: []string{"a:2", "b:2"}, secure: tc.secure}
		args := storeloadArgs(so, lt, 16, 1, "/out.json")
		for name, want := range map[string]string{"-protocol": "grpc", "-grpc-endpoints": "a:2,b:2", "-grpc-streams": "2"} {
			if got, _ := flagValue(args, name); got != want {
				t.Errorf("%s: expected %s %s, found %q in %v", tc.name, name, want, got, args)
			}
		}
		dir, has := flagValue(args, "-certs-dir")
		if has != (tc.secure != nil) || (has && dir != secure.clientDir) {
			t.Errorf("%s: expected -certs-dir only on the TLS side (%s), found %v", tc.name, secure.clientDir, args)
		}
		if slices.Contains(args, "-http1") {
			t.Errorf("%s: expected no -http1 on the stream, found %v", tc.name, args)
		}
	}
	ab := sbsOptions{baseline: "/old/tidal-server", protocol: "grpc", baselineProtocol: "http"}
	if got := ab.protocolOf("etcd"); got != "http" {
		t.Errorf("-baseline -baseline-protocol http: expected the baseline's slot on http, found %s", got)
	}
	// Plain HTTP over TLS keeps -tls-http1's -http1.
	h1 := storeloadArgs(sbsOptions{tlsAB: true, tlsHTTP1: true, protocol: "http"}, loadTarget{system: "tidal", protocol: "http", secure: secure}, 1, 1, "/o.json")
	if !slices.Contains(h1, "-http1") || slices.Contains(h1, "-grpc-endpoints") {
		t.Errorf("-tls-ab -tls-http1: expected -http1 and no gRPC flags, found %v", h1)
	}
}

// -tls-http1 asks for HTTP/1.1 over TLS, which the gRPC stream cannot be:
// the pair is refused with both flags named; so are unknown transports.
func TestCheckProtocolsRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		so    sbsOptions
		names []string
	}{
		"-tls-http1 with the stream": {sbsOptions{tlsAB: true, tlsHTTP1: true, protocol: "grpc", baselineProtocol: "http"}, []string{"-tls-http1", "-protocol grpc"}},
		"unknown protocol":           {sbsOptions{protocol: "quic", baselineProtocol: "http"}, []string{"-protocol", "quic"}},
		"unknown baseline protocol":  {sbsOptions{protocol: "http", baselineProtocol: "h3"}, []string{"-baseline-protocol", "h3"}},
	} {
		err := tc.so.checkProtocols()
		for _, n := range tc.names {
			if err == nil || !strings.Contains(err.Error(), n) {
				t.Errorf("%s: expected an error naming %q, found %v", name, n, err)
			}
		}
	}
	if err := (sbsOptions{tlsAB: true, protocol: "grpc", baselineProtocol: "http"}).checkProtocols(); err != nil {
		t.Errorf("-tls-ab -protocol grpc: expected it accepted, found %v", err)
	}
	// runSideBySide refuses before building or starting anything.
	o := options{repo: t.TempDir(), sbs: sbsOptions{clients: "1", rounds: 1, tlsAB: true, tlsHTTP1: true, protocol: "grpc", baselineProtocol: "http"}}
	if err := runSideBySide(t.Context(), o); err == nil || !strings.Contains(err.Error(), "-tls-http1 and -protocol grpc") {
		t.Errorf("runSideBySide -tls-ab -tls-http1 -protocol grpc: expected the refusal, found %v", err)
	}
}

// TestSideBySideSummaryOfTLSABOnTheStream: a -tls-ab -protocol grpc file
// says both sides were on the stream, the plaintext one in the clear and
// the TLS one over TLS, and does not claim HTTP/1.1 connections.
func TestSideBySideSummaryOfTLSABOnTheStream(t *testing.T) {
	rounds := sampleRounds()
	r := &sideBySide{Schema: 1, Kind: sideBySideKind, Time: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC), Note: sharedMachineNote,
		Env:         env{Commit: "abc123", Cores: 2},
		Config:      sbsConfig{TLSAB: true, Protocol: "grpc", BaselineProtocol: "grpc", GRPCStreams: 1, Rounds: 3, Clients: []int{1, 64}, Warmup: time.Second, Duration: 5 * time.Second},
		StoreRounds: rounds, Stores: storeRows(rounds, []int{1, 64}), EtcdVersion: "plaintext tidal-server (this build)"}
	md := sideBySideSummary(r)
	for _, w := range []string{
		"- both sides were written on the gRPC ingest stream (1 stream(s) shared by the workers), not HTTP",
		"without `--certs-dir` (plaintext, on the gRPC ingest stream)",
		"to the clients TLS 1.3 on the gRPC ingest stream (HTTP/2)",
		"plaintext clients share 1 gRPC ingest stream(s), one connection each, TLS clients share 1 gRPC ingest stream(s) over TLS, one connection each.",
		"| clients | plaintext writes/s | TLS writes/s |",
	} {
		if !strings.Contains(md, w) {
			t.Errorf("expected the summary to contain %q, found:\n%s", w, md)
		}
	}
	if strings.Contains(md, "HTTP/1.1") {
		t.Errorf("expected no HTTP/1.1 in a summary of the stream, found:\n%s", md)
	}
}
