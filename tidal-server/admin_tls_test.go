package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// testCertsDir makes a CA, a node certificate for 127.0.0.1 and an admin
// client certificate in a fresh directory.
func testCertsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	o := certs.CreateOptions{CertsDir: dir}
	if _, err := certs.CreateCA(o); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateNode(o, 1, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateClient(o, "admin", auth.Admin); err != nil {
		t.Fatal(err)
	}
	return dir
}

// seen is what a TLS test node saw of the requests it answered.
type seen struct {
	mu      sync.Mutex
	protos  []int
	clients []string // client certificate names, "" for none
	authz   []string
}

// tlsNode serves status over TLS (h2) as a node with --certs-dir does,
// verifying client certificates against dir/ca.crt when given, and
// refusing requests that bring neither a certificate nor a token (401).
func tlsNode(t *testing.T, dir string, st func(addr string) client.Status) (*httptest.Server, *seen) {
	t.Helper()
	kp, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.NodeCertFile), filepath.Join(dir, certs.NodeKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, certs.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	var s seen
	var srv *httptest.Server
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := ""
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			name, _, _ = auth.ClientFromCert(r.TLS.VerifiedChains[0][0])
		}
		s.mu.Lock()
		s.protos = append(s.protos, r.ProtoMajor)
		s.clients = append(s.clients, name)
		s.authz = append(s.authz, r.Header.Get("Authorization"))
		s.mu.Unlock()
		if name == "" && r.Header.Get("Authorization") == "" {
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":{"code":"unauthenticated","message":"credentials required","field":""}}`))
			return
		}
		json.NewEncoder(w).Encode(st(srv.Listener.Addr().String()))
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{kp}, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, &s
}

// The admin commands speak TLS (HTTP/2) with --certs-dir,
// presenting client.admin.crt by default; without it, against a TLS node,
// they say the node serves HTTPS.
func TestAdminCommandsSpeakTLSWithCertsDir(t *testing.T) {
	dir := testCertsDir(t)
	leader := func(addr string) client.Status {
		return client.Status{Node: 1, Leader: 1, Role: "leader", Members: []client.MemberStatus{{ID: 1, Role: "leader", ClientAddr: addr}}}
	}
	srv, s := tlsNode(t, dir, leader)
	addr := srv.Listener.Addr().String()

	out, err := execute("status", "--addr", addr, "--certs-dir", dir)
	if err != nil || !strings.Contains(out, "leader 1") {
		t.Fatalf("status --certs-dir: %v\n%s", err, out)
	}
	s.mu.Lock()
	if len(s.protos) != 1 || s.protos[0] != 2 || s.clients[0] != "admin" {
		t.Fatalf("expected one HTTP/2 request presenting client.admin.crt, saw protocols %v, clients %q", s.protos, s.clients)
	}
	s.mu.Unlock()

	// A token given by file, and no --cert-name: the token alone.
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("the-secret-token-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := execute("status", "--addr", addr, "--certs-dir", dir, "--token-file", tokenFile); err != nil {
		t.Fatalf("status --token-file: %v\n%s", err, out)
	}
	s.mu.Lock()
	if last := len(s.authz) - 1; s.authz[last] != "Bearer the-secret-token-0123" || s.clients[last] != "" {
		t.Fatalf("expected the token and no client certificate, saw Authorization %q, client %q", s.authz[last], s.clients[last])
	}
	s.mu.Unlock()

	_, err = execute("status", "--addr", addr)
	if err == nil || !strings.Contains(err.Error(), "serves HTTPS") || !strings.Contains(err.Error(), "--certs-dir") {
		t.Fatalf("status without --certs-dir against a TLS node: expected an error saying it serves HTTPS, got %v", err)
	}
	for _, args := range [][]string{
		{"status", "--addr", addr, "--cert-name", "admin"},
		{"status", "--addr", addr, "--token", "x", "--token-file", tokenFile},
		{"status", "--addr", addr, "--certs-dir", dir, "--cert-name", "nobody"},
	} {
		if _, err := execute(args...); err == nil {
			t.Errorf("%s: expected an error", strings.Join(args, " "))
		}
	}
}

// Regression: status asked on a follower fetches the
// leader's progress from the leader's client address; on a secured
// cluster it must present the same credentials there, or the leader
// refuses it and progress shows as unknown.
func TestStatusFollowsTheLeaderWithTheSameCredentials(t *testing.T) {
	dir := testCertsDir(t)
	leaderSrv, leaderSeen := tlsNode(t, dir, func(addr string) client.Status {
		return client.Status{Node: 2, Leader: 2, Role: "leader", Members: []client.MemberStatus{
			{ID: 1, Role: "follower", Match: 7, Reachable: true}, {ID: 2, Role: "leader", Match: 7, Reachable: true, ClientAddr: addr}}}
	})
	leaderAddr := leaderSrv.Listener.Addr().String()
	follower, _ := tlsNode(t, dir, func(addr string) client.Status {
		return client.Status{Node: 1, Leader: 2, Role: "follower", Members: []client.MemberStatus{
			{ID: 1, Role: "follower", ClientAddr: addr}, {ID: 2, Role: "leader", ClientAddr: leaderAddr}}}
	})
	out, err := execute("status", "--addr", follower.Listener.Addr().String(), "--certs-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "as leader 2") {
		t.Fatalf("expected the leader's view of progress, got:\n%s", out)
	}
	leaderSeen.mu.Lock()
	defer leaderSeen.mu.Unlock()
	if len(leaderSeen.clients) != 1 || leaderSeen.clients[0] != "admin" {
		t.Fatalf("expected the leader asked once with client.admin.crt, saw %q", leaderSeen.clients)
	}
}
