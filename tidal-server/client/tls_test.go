package client

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// serveTLS starts an HTTPS server offering h2 and http/1.1 (as a node
// with --certs-dir does) that asks for a client certificate, and returns
// it with a client configuration that trusts it.
func serveTLS(t *testing.T, h http.Handler) (*httptest.Server, *tls.Config) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	trusted := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	return srv, trusted
}

// selfSignedClientCert makes a throwaway client certificate; the test
// server requests one without verifying it, so any will do.
func selfSignedClientCert(t *testing.T, cn string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// The client speaks TLS with HTTP/2 when the node offers
// it, presents its client certificate and sends its bearer token.
func TestTLSUsesHTTP2ClientCertAndToken(t *testing.T) {
	var (
		mu     sync.Mutex
		proto  int
		authz  string
		client string
	)
	srv, trusted := serveTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		proto, authz = r.ProtoMajor, r.Header.Get("Authorization")
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			client = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		mu.Unlock()
		w.Header().Set("X-Tidal-Seq", "5")
		w.WriteHeader(http.StatusNoContent)
	}))
	trusted.Certificates = []tls.Certificate{selfSignedClientCert(t, "writer-1")}
	c := New(srv.Listener.Addr().String(), WithTLS(trusted), WithToken("s3cret-token-value"))
	t.Cleanup(c.CloseIdleConnections)
	if !strings.HasPrefix(c.Addr(), "https://") {
		t.Fatalf("an address without a scheme and WithTLS: expected https://, found %s", c.Addr())
	}
	ack, err := c.WriteSignals(context.Background(), []Event{{ID: "a", Entity: 1, Signal: "view"}})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ack.Seq != 5 || proto != 2 || authz != "Bearer s3cret-token-value" || client != "writer-1" {
		t.Fatalf("expected seq 5 over HTTP/2 with the token and the client certificate, found seq %d, HTTP/%d, Authorization %q, client cert %q",
			ack.Seq, proto, authz, client)
	}
}

// A client without TLS that reaches a node serving
// HTTPS is told so in those words (net/http's server answers a bare 400),
// and is not retried: the next attempt would meet the same port.
func TestPlainHTTPToTLSNodeSaysSo(t *testing.T) {
	srv, _ := serveTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("a plain HTTP request must not reach the handler")
	}))
	c := New(srv.Listener.Addr().String(), WithBackoff(time.Millisecond, time.Millisecond))
	t.Cleanup(c.CloseIdleConnections)
	_, err := c.WriteSignals(context.Background(), []Event{{ID: "a", Entity: 1, Signal: "view"}})
	ae := apiError(err)
	if ae == nil || ae.Code != CodeTLSRequired || !strings.Contains(ae.Message, "serves HTTPS") || !strings.Contains(ae.Message, "--certs-dir") {
		t.Fatalf("expected a %s error saying the node serves HTTPS, got %v", CodeTLSRequired, err)
	}
	if IsIndefinite(err) || attempts(err) != 1 {
		t.Fatalf("expected one attempt and a definite failure, got %d attempts, indefinite %v: %v", attempts(err), IsIndefinite(err), err)
	}
}

// A TLS client that reaches a plaintext node is told the
// node does not serve TLS; no request was delivered, nothing is retried.
func TestTLSClientToPlainNodeSaysSo(t *testing.T) {
	var hits int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	c := New(srv.Listener.Addr().String(), WithTLS(&tls.Config{}), WithBackoff(time.Millisecond, time.Millisecond))
	t.Cleanup(c.CloseIdleConnections)
	_, err := c.WriteSignals(context.Background(), []Event{{ID: "a", Entity: 1, Signal: "view"}})
	if !IsTLS(err) || !strings.Contains(err.Error(), "does not serve TLS") {
		t.Fatalf("expected a TLS error saying the node does not serve TLS, got %v", err)
	}
	if IsIndefinite(err) || attempts(err) != 1 {
		t.Fatalf("expected one attempt and a definite failure, got %d attempts, indefinite %v: %v", attempts(err), IsIndefinite(err), err)
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 0 {
		t.Fatalf("expected no request delivered, the handler saw %d", hits)
	}
}

// A node whose certificate no trusted CA signed is refused, once, with a
// message that says so.
func TestUnknownCAIsATLSError(t *testing.T) {
	srv, _ := serveTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	c := New(srv.Listener.Addr().String(), WithTLS(&tls.Config{RootCAs: x509.NewCertPool()}), WithBackoff(time.Millisecond, time.Millisecond))
	t.Cleanup(c.CloseIdleConnections)
	_, err := c.Status(context.Background())
	if !IsTLS(err) || !strings.Contains(err.Error(), "not signed by a CA this client trusts") || attempts(err) != 1 {
		t.Fatalf("expected one attempt refused as signed by an unknown CA, got %v", err)
	}
}

// 401 and 403 are decoded with their codes and never retried.
func TestAuthErrorsAreDecodedAndNotRetried(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
		is     func(error) bool
	}{
		{http.StatusUnauthorized, CodeUnauthenticated, IsUnauthenticated},
		{http.StatusForbidden, CodePermissionDenied, IsPermissionDenied},
	} {
		rec := &recorder{script: []func(http.ResponseWriter){status(tc.status)}}
		_, c := serve(t, rec)
		_, err := c.WriteSignals(context.Background(), []Event{{ID: "a", Entity: 1, Signal: "view"}})
		if !tc.is(err) || apiError(err).Code != tc.code || rec.count() != 1 || IsIndefinite(err) {
			t.Errorf("%d: expected code %s after one definite attempt, got %v after %d", tc.status, tc.code, err, rec.count())
		}
	}
}

func attempts(err error) int {
	var re *RequestError
	if errors.As(err, &re) {
		return re.Attempts
	}
	return 0
}
