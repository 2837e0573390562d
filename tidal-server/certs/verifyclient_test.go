package certs

import (
	"crypto/x509"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/atomicfile"
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

// A client certificate of a CA the node no longer trusts stops verifying
// once the node reloads its bundle: the old CA dropped from ca.crt (a
// rotation's last step), the node's own certificate reissued by the new.
func TestVerifyClientAfterTheOldCAIsDropped(t *testing.T) {
	ca := newCA(t)
	if _, err := CreateClient(ca, "writer", auth.Writer); err != nil {
		t.Fatal(err)
	}
	old, err := readCerts(filepath.Join(ca.CertsDir, ClientCertFile("writer")))
	if err != nil {
		t.Fatal(err)
	}
	dir := nodeDir(t, ca, 1)
	store := load(t, dir)
	if err := store.VerifyClient(old); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	ca.Overwrite = true
	if _, err := CreateCA(ca); err != nil {
		t.Fatal(err)
	}
	bundle, err := readCerts(filepath.Join(ca.CertsDir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := atomicfile.Write(filepath.Join(dir, CACertFile), encodeCert(bundle[0].Raw), 0o644); err != nil { // the new CA only
		t.Fatal(err)
	}
	if _, err := CreateNode(CreateOptions{CertsDir: dir, CAKey: filepath.Join(ca.CertsDir, CAKeyFile), Overwrite: true}, 1, []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	if err := store.Reload(); err != nil {
		t.Fatalf("reloading the rotated directory: %v", err)
	}
	if err := store.VerifyClient(old); err == nil || !strings.Contains(err.Error(), "not signed by any CA in ca.crt") {
		t.Fatalf("a client certificate of the dropped CA after the reload: expected it refused as not signed by a CA in ca.crt, found %v", err)
	}
}
