package certs

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
)

// ClientTLS is the configuration a client of the HTTP API dials with: it
// trusts the CAs in dir/ca.crt (host names are checked as usual, against
// node.crt's --host names) and, when name is not "", presents
// dir/client.NAME.crt, checked here first (present, key matching, valid
// now, signed by ca.crt, naming client name) so a mistake is reported by
// name rather than as a refused handshake. ALPN offers h2 and http/1.1;
// an http.Transport given this config needs ForceAttemptHTTP2 to use h2.
func ClientTLS(dir, name string) (*tls.Config, error) {
	caPath := filepath.Join(dir, CACertFile)
	cas, err := readCerts(caPath)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}, RootCAs: pool}
	if name == "" {
		return cfg, nil
	}
	if err := auth.ValidName(name); err != nil {
		return nil, err
	}
	certPath, keyPath := filepath.Join(dir, ClientCertFile(name)), filepath.Join(dir, ClientKeyFile(name))
	chain, err := readCerts(certPath)
	if err != nil {
		return nil, err
	}
	key, err := readKey(keyPath)
	if err != nil {
		return nil, err
	}
	leaf := chain[0]
	if !sameKey(leaf, key) {
		return nil, fmt.Errorf("%s does not belong to %s: their public keys differ", keyPath, certPath)
	}
	now := time.Now()
	if err := checkValidity(certPath, leaf, now); err != nil {
		return nil, err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, verifyError(certPath, caPath, "TLS client", "create-client", err)
	}
	got, _, err := auth.ClientFromCert(leaf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certPath, err)
	}
	if got != name {
		return nil, fmt.Errorf("%s: names client %q, expected %q", certPath, got, name)
	}
	ders := make([][]byte, len(chain))
	for i, c := range chain {
		ders[i] = c.Raw
	}
	cfg.Certificates = []tls.Certificate{{Certificate: ders, PrivateKey: key, Leaf: leaf}}
	return cfg, nil
}
