package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/atomicfile"
)

// nodeDir makes a node's certs directory: ca.crt copied from the CA's
// directory and node.crt/node.key for member id, signed by the CA's key
// kept in the CA's directory (as --ca-key would point to it).
func nodeDir(t *testing.T, ca CreateOptions, id uint64, mutate ...func(*CreateOptions)) string {
	t.Helper()
	dir := t.TempDir()
	copyFile(t, filepath.Join(ca.CertsDir, CACertFile), filepath.Join(dir, CACertFile))
	o := CreateOptions{CertsDir: dir, CAKey: filepath.Join(ca.CertsDir, CAKeyFile)}
	for _, m := range mutate {
		m(&o)
	}
	if _, err := CreateNode(o, id, []string{"localhost", "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Write(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func load(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// signLeaf signs tmpl with the CA of o, writing crt and key into dir; for
// certificates the create commands refuse to make.
func signLeaf(t *testing.T, o CreateOptions, tmpl *x509.Certificate, dir, crt, key string) {
	t.Helper()
	ca, caKey, err := loadSigner(o, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.SerialNumber, err = newSerial(); err != nil {
		t.Fatal(err)
	}
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, k.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeKeyAndCert(filepath.Join(dir, key), k, filepath.Join(dir, crt), encodeCert(der)); err != nil {
		t.Fatal(err)
	}
}

// keyPair loads a certificate and key as a TLS certificate, without any
// of Load's checks (for presenting bad certificates on purpose).
func keyPair(t *testing.T, dir, crt, key string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, crt), filepath.Join(dir, key))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type handshakeResult struct {
	server     tls.ConnectionState
	serverErr  error
	clientErr  error
	serverCert *x509.Certificate // the certificate the client saw
	negotiated string
}

// handshake connects a TLS client to a TLS server over a real loopback
// TCP connection. The server writes one byte once its handshake is done,
// so a client refused by the server (which TLS 1.3 tells the client only
// after the client's own handshake) sees the refusal on its read.
func handshake(t *testing.T, server, client *tls.Config) handshakeResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		state tls.ConnectionState
		err   error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		tc := tls.Server(c, server)
		err = tc.Handshake()
		if err == nil {
			_, err = tc.Write([]byte{1})
		}
		done <- result{state: tc.ConnectionState(), err: err}
	}()
	var r handshakeResult
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Minute))
	tc := tls.Client(c, client)
	r.clientErr = tc.Handshake()
	if r.clientErr == nil {
		var b [1]byte
		_, r.clientErr = tc.Read(b[:])
		cs := tc.ConnectionState()
		r.negotiated = cs.NegotiatedProtocol
		if len(cs.PeerCertificates) > 0 {
			r.serverCert = cs.PeerCertificates[0]
		}
	}
	c.Close()
	res := <-done
	r.server, r.serverErr = res.state, res.err
	return r
}
