package server

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

// makeCerts writes a CA, a node certificate for member and 127.0.0.1, and
// one client certificate per role (client.reader, client.writer,
// client.admin) into a fresh directory.
func makeCerts(t testing.TB, member uint64) string {
	t.Helper()
	dir := t.TempDir()
	o := certs.CreateOptions{CertsDir: dir}
	if _, err := certs.CreateCA(o); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateNode(o, member, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range auth.Roles {
		if _, err := certs.CreateClient(o, r.String(), r); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// logBuffer is a concurrency-safe log sink tests read.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startNode starts a one-node server on 127.0.0.1 with cfg's security
// settings; it is shut down when the test ends.
func startNode(t *testing.T, cfg Config) (*Server, *logBuffer) {
	t.Helper()
	if cfg.ID == 0 {
		cfg.ID = 1
	}
	if cfg.ClientAddr == "" {
		cfg.ClientAddr = "127.0.0.1:0"
	}
	if cfg.PeerAddr == "" {
		cfg.PeerAddr = "127.0.0.1:0"
	}
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.TickInterval = 10 * time.Millisecond
	cfg.ReadyWithin = 1000
	logs := &logBuffer{}
	srv, err := Start(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv, logs
}

// httpsClient trusts dir/ca.crt and presents client.NAME.crt ("" for
// none), speaking HTTP/2.
func httpsClient(t *testing.T, dir, name string) *http.Client {
	t.Helper()
	cfg, err := certs.ClientTLS(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

func get(t *testing.T, hc *http.Client, url, token string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// Without --certs-dir a node binds loopback only; an
// address on every interface or a routable IP is refused before anything
// is bound or written, naming the flag and the ways out.
func TestPlaintextRefusesNonLoopbackAddresses(t *testing.T) {
	for _, tc := range []struct{ client, peer, flag string }{
		{"0.0.0.0:0", "127.0.0.1:0", "--client-addr"},
		{":0", "127.0.0.1:0", "--client-addr"},
		{"192.0.2.1:7070", "127.0.0.1:0", "--client-addr"},
		{"127.0.0.1:0", "0.0.0.0:0", "--peer-addr"},
		{"127.0.0.1:0", "127.0.0.1:0", "--grpc-addr"}, // the ingest stream on 0.0.0.0
	} {
		data := filepath.Join(t.TempDir(), "data")
		cfg := Config{ID: 1, ClientAddr: tc.client, PeerAddr: tc.peer, DataDir: data, Transport: nopTransport}
		if tc.flag == "--grpc-addr" {
			cfg.GRPCAddr = "0.0.0.0:0"
		}
		_, err := Start(cfg, nil)
		if err == nil || !strings.Contains(err.Error(), tc.flag) || !strings.Contains(err.Error(), "--certs-dir") || !strings.Contains(err.Error(), "--insecure") {
			t.Errorf("client %s peer %s: expected a refusal naming %s, --certs-dir and --insecure, got %v", tc.client, tc.peer, tc.flag, err)
		}
		if _, statErr := os.Stat(data); !errors.Is(statErr, os.ErrNotExist) {
			t.Errorf("client %s peer %s: the data dir was created by a refused start", tc.client, tc.peer)
		}
	}
	for _, addr := range []string{"127.0.0.1:1", "[::1]:1", "localhost:1"} {
		if err := checkLoopbackAddr("--client-addr", addr, "x"); err != nil {
			t.Errorf("%s is loopback, refused: %v", addr, err)
		}
	}
}

// With certificates the peer plane stays plaintext until the transport
// takes them: a routable --peer-addr is still refused then, and the log
// says the peer plane is not yet wired.
func TestCertsWithoutPeerTLSKeepThePeerPlaneOnLoopback(t *testing.T) {
	dir := makeCerts(t, 1)
	_, err := Start(Config{ID: 1, ClientAddr: "127.0.0.1:0", PeerAddr: "0.0.0.0:0", DataDir: filepath.Join(t.TempDir(), "d"),
		CertsDir: dir, Transport: nopTransport}, nil)
	if err == nil || !strings.Contains(err.Error(), "--peer-addr") || !strings.Contains(err.Error(), "not yet wired") {
		t.Fatalf("expected --peer-addr refused as plaintext (TLS not yet wired), got %v", err)
	}
	_, logs := startNode(t, Config{CertsDir: dir, Transport: nopTransport})
	if !strings.Contains(logs.String(), "peer plane: TLS not yet wired") {
		t.Fatalf("expected the start-up log to say the peer plane is not yet wired:\n%s", logs)
	}
}

// A node certificate for another member is refused,
// naming both ids.
func TestNodeCertForAnotherMemberRefused(t *testing.T) {
	dir := makeCerts(t, 2)
	_, err := Start(Config{ID: 1, ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", DataDir: filepath.Join(t.TempDir(), "d"), CertsDir: dir}, nil)
	if err == nil || !strings.Contains(err.Error(), "member 2") || !strings.Contains(err.Error(), "--id is 1") {
		t.Fatalf("expected a refusal naming member 2 and --id 1, got %v", err)
	}
}

// With --certs-dir the client plane is TLS with
// HTTP/2, every route asks for credentials (probes open by default), and
// roles decide.
func TestCertsDirServesH2WithAuthentication(t *testing.T) {
	dir := makeCerts(t, 1)
	srv, logs := startNode(t, Config{CertsDir: dir, OpenProbes: true})
	base := "https://" + srv.ClientAddr()
	anon := httpsClient(t, dir, "")
	resp, _ := get(t, anon, base+"/healthz", "")
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("/healthz without credentials: expected 200 over HTTP/2, got %d over HTTP/%d", resp.StatusCode, resp.ProtoMajor)
	}
	resp, body := get(t, anon, base+"/cluster/status", "")
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, auth.CodeUnauthenticated) {
		t.Fatalf("/cluster/status without credentials: expected 401 unauthenticated, got %d %s", resp.StatusCode, body)
	}
	resp, body = get(t, httpsClient(t, dir, "reader"), base+"/admin/backup", "")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, auth.CodePermissionDenied) {
		t.Fatalf("/admin/backup as reader: expected 403, got %d %s", resp.StatusCode, body)
	}
	resp, _ = get(t, httpsClient(t, dir, "reader"), base+"/cluster/status", "")
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("/cluster/status as reader: expected 200 over HTTP/2, got %d over HTTP/%d", resp.StatusCode, resp.ProtoMajor)
	}
	if !strings.Contains(logs.String(), "client plane: TLS") {
		t.Fatalf("expected the start-up line to describe the TLS client plane:\n%s", logs)
	}
}

// Insecure loopback mode with no tokens has no
// authentication, and says so; with a tokens file every request needs a
// token even without TLS.
func TestLoopbackAuthIsOffWithoutTokensAndOnWithThem(t *testing.T) {
	srv, logs := startNode(t, Config{OpenProbes: true})
	resp, _ := get(t, http.DefaultClient, "http://"+srv.ClientAddr()+"/cluster/status", "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("loopback, no tokens: expected 200 without credentials, got %d", resp.StatusCode)
	}
	if !strings.Contains(logs.String(), "insecure: no authentication") {
		t.Fatalf("expected the start-up line to say insecure: no authentication:\n%s", logs)
	}

	tokens := filepath.Join(t.TempDir(), "tokens")
	if _, err := auth.AppendToken(tokens, "ops", auth.Admin, "0123456789abcdef-ops"); err != nil {
		t.Fatal(err)
	}
	srv, _ = startNode(t, Config{TokensPath: tokens, OpenProbes: true})
	url := "http://" + srv.ClientAddr() + "/cluster/status"
	if resp, _ := get(t, http.DefaultClient, url, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("tokens file, no token: expected 401, got %d", resp.StatusCode)
	}
	if resp, _ := get(t, http.DefaultClient, url, "0123456789abcdef-ops"); resp.StatusCode != http.StatusOK {
		t.Fatalf("tokens file, valid token: expected 200, got %d", resp.StatusCode)
	}
}

// Reload (SIGHUP) re-reads the tokens file: a new token
// works, a removed one gets 401, and a file that does not parse keeps the
// set in use.
func TestReloadTokens(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	if _, err := auth.AppendToken(tokens, "old", auth.Reader, "old-secret-0123456789"); err != nil {
		t.Fatal(err)
	}
	srv, logs := startNode(t, Config{TokensPath: tokens})
	url := "http://" + srv.ClientAddr() + "/cluster/status"
	status := func(tok string) int {
		resp, _ := get(t, http.DefaultClient, url, tok)
		return resp.StatusCode
	}
	if status("old-secret-0123456789") != 200 || status("new-secret-0123456789") != 401 {
		t.Fatal("before reload: expected the old token accepted and the new one refused")
	}
	if err := os.WriteFile(tokens, []byte("new reader "+auth.HashSecret("new-secret-0123456789")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if status("old-secret-0123456789") != 401 || status("new-secret-0123456789") != 200 {
		t.Fatal("after reload: expected the removed token refused and the new one accepted")
	}
	if err := os.WriteFile(tokens, []byte("broken line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), "--tokens") {
		t.Fatalf("a broken tokens file: expected Reload to report it, got %v", err)
	}
	if status("new-secret-0123456789") != 200 {
		t.Fatal("after a failed reload: expected the tokens in use to stay")
	}
	if !strings.Contains(logs.String(), "tokens file did not reload") {
		t.Fatalf("expected the failed reload logged:\n%s", logs)
	}
}

// The client plane's timeouts are checked against each other at start.
func TestHTTPDefaultsAndChecks(t *testing.T) {
	cfg := Config{WriteTimeout: 5 * time.Second}
	if err := httpDefaults(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.HTTPWriteTimeout != DefaultHTTPWriteTimeout || cfg.MaxConns != DefaultMaxConns || cfg.HTTP2MaxStreams != DefaultHTTP2MaxStreams {
		t.Fatalf("defaults not applied: %+v", cfg)
	}
	cfg = Config{WriteTimeout: 5 * time.Second, HTTPWriteTimeout: 5 * time.Second}
	if err := httpDefaults(&cfg); err == nil || !strings.Contains(err.Error(), "--http-write-timeout") || !strings.Contains(err.Error(), "--write-timeout") {
		t.Fatalf("an HTTP write timeout not longer than --write-timeout: expected refused naming both, got %v", err)
	}
	cfg = Config{HTTPReadHeaderTimeout: time.Minute, HTTPReadTimeout: time.Second}
	if err := httpDefaults(&cfg); err == nil || !strings.Contains(err.Error(), "--http-read-header-timeout") {
		t.Fatalf("a header timeout longer than the request timeout: expected refused, got %v", err)
	}
}

// nopTransport stands in for the peer transport of a one-node cluster:
// Start binds --peer-addr for it, nothing is sent.
var nopTransport TransportFactory = func(uint64, net.Listener, Inbound, prometheus.Registerer, *slog.Logger) (replica.Transport, func(), error) {
	return nopSender{}, func() {}, nil
}

type nopSender struct{}

func (nopSender) Send([]replica.Outbound) {}
func (nopSender) SetPeer(uint64, string)  {}
func (nopSender) RemovePeer(uint64)       {}

// Regression: the start-up line names both planes, so
// a run's node logs show that it ran secured (the chaos smoke spec reads
// it); it used to describe the client plane only, and a peer plane left
// plaintext under --certs-dir said so in a warning alone.
func TestStartLineNamesBothPlanes(t *testing.T) {
	for _, tc := range []struct {
		sec  security
		want string
	}{
		{security{clientTLS: true, peerTLS: true, auth: true}, "client plane: TLS (h2, http/1.1); peer plane: mutual TLS; authentication: client certificates"},
		{security{clientTLS: true, auth: true}, "client plane: TLS (h2, http/1.1); peer plane: plaintext; authentication: client certificates"},
		{security{}, "client plane: plaintext; peer plane: plaintext; insecure: no authentication"},
	} {
		if got := tc.sec.describe(); got != tc.want {
			t.Errorf("%+v: expected %q, found %q", tc.sec, tc.want, got)
		}
	}
}
