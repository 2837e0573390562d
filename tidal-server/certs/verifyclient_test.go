package certs

import (
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/auth"
)

// VerifyClient judges a client certificate as the client plane's
// handshake does: one the node's CA signed verifies, one another CA
// signed does not (said in those terms).
func TestVerifyClient(t *testing.T) {
	ca := CreateOptions{CertsDir: t.TempDir()}
	if _, err := CreateCA(ca); err != nil {
		t.Fatal(err)
	}
	other := CreateOptions{CertsDir: t.TempDir()}
	if _, err := CreateCA(other); err != nil {
		t.Fatal(err)
	}
	for _, o := range []CreateOptions{ca, other} {
		if _, err := CreateClient(o, "writer", auth.Writer); err != nil {
			t.Fatal(err)
		}
	}
	store := load(t, nodeDir(t, ca, 1))
	chain := func(o CreateOptions) []*x509.Certificate {
		t.Helper()
		certs, err := readCerts(filepath.Join(o.CertsDir, ClientCertFile("writer")))
		if err != nil {
			t.Fatal(err)
		}
		return certs
	}
	if err := store.VerifyClient(chain(ca)); err != nil {
		t.Fatalf("a client certificate signed by the node's CA: %v", err)
	}
	if err := store.VerifyClient(chain(other)); err == nil || !strings.Contains(err.Error(), "not signed by any CA in ca.crt") {
		t.Fatalf("a client certificate signed by another CA: expected it refused as not signed by a CA in ca.crt, found %v", err)
	}
	if err := store.VerifyClient(nil); err == nil {
		t.Fatal("no certificate: expected a refusal")
	}
}
