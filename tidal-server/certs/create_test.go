package certs

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
)

// newCA creates a CA in a fresh directory and returns the options that
// sign with it.
func newCA(t *testing.T) CreateOptions {
	t.Helper()
	o := CreateOptions{CertsDir: t.TempDir()}
	if _, err := CreateCA(o); err != nil {
		t.Fatal(err)
	}
	return o
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func approx(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if d := got.Sub(want); d < -2*time.Hour || d > 2*time.Hour {
		t.Errorf("%s = %s; expected about %s", what, got, want)
	}
}

func TestCreateCA(t *testing.T) {
	dir := t.TempDir()
	iss, err := CreateCA(CreateOptions{CertsDir: filepath.Join(dir, "certs")})
	if err != nil {
		t.Fatal(err)
	}
	c := iss.Cert
	if !c.IsCA || !c.MaxPathLenZero || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA certificate: IsCA %v, MaxPathLenZero %v, KeyUsage %b; expected a CA that signs leaves only", c.IsCA, c.MaxPathLenZero, c.KeyUsage)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("CA key %T; expected ECDSA P-256", c.PublicKey)
	}
	approx(t, "CA NotAfter", c.NotAfter, time.Now().Add(DefaultCALifetime))
	if m := mode(t, iss.KeyPath); m != 0o600 {
		t.Errorf("ca.key mode %#o; expected 0600", m)
	}
	if m := mode(t, iss.CertPath); m != 0o644 {
		t.Errorf("ca.crt mode %#o; expected 0644", m)
	}
	if m := mode(t, filepath.Join(dir, "certs")); m != 0o700 {
		t.Errorf("certs dir mode %#o; expected 0700", m)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "certs"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"ca.crt", "ca.key"}) {
		t.Errorf("certs dir holds %q; expected exactly ca.crt and ca.key (no temporary files left)", names)
	}
}

func TestCreateNodeBindsMemberAndHosts(t *testing.T) {
	o := newCA(t)
	iss, err := CreateNode(o, 3, []string{"node3.example.com", "localhost", "127.0.0.1", "::1", "*.tidal.internal"})
	if err != nil {
		t.Fatal(err)
	}
	c := iss.Cert
	if id, err := auth.MemberFromCert(c); err != nil || id != 3 {
		t.Errorf("MemberFromCert(node.crt) = %d, %v; expected 3", id, err)
	}
	if len(c.URIs) != 1 || c.URIs[0].String() != "tidal://member/3" {
		t.Errorf("node.crt URIs %v; expected exactly tidal://member/3", c.URIs)
	}
	if !slices.Equal(c.DNSNames, []string{"node3.example.com", "localhost", "*.tidal.internal"}) {
		t.Errorf("node.crt DNS names %q", c.DNSNames)
	}
	if len(c.IPAddresses) != 2 || !c.IPAddresses[0].Equal(net.ParseIP("127.0.0.1")) || !c.IPAddresses[1].Equal(net.ParseIP("::1")) {
		t.Errorf("node.crt IPs %v; expected 127.0.0.1 and ::1", c.IPAddresses)
	}
	if !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(c.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		t.Errorf("node.crt extended key usages %v; expected server and client auth", c.ExtKeyUsage)
	}
	if c.IsCA {
		t.Error("node.crt is a CA")
	}
	approx(t, "node NotAfter", c.NotAfter, time.Now().Add(DefaultNodeLifetime))
	if m := mode(t, iss.KeyPath); m != 0o600 {
		t.Errorf("node.key mode %#o; expected 0600", m)
	}
	if filepath.Base(iss.CertPath) != "node.crt" || filepath.Base(iss.KeyPath) != "node.key" {
		t.Errorf("node files %s, %s", iss.CertPath, iss.KeyPath)
	}
}

func TestCreateClientBindsNameAndRole(t *testing.T) {
	o := newCA(t)
	o.Lifetime = 48 * time.Hour
	iss, err := CreateClient(o, "ci-bot", auth.Writer)
	if err != nil {
		t.Fatal(err)
	}
	name, role, err := auth.ClientFromCert(iss.Cert)
	if err != nil || name != "ci-bot" || role != auth.Writer {
		t.Errorf("ClientFromCert = %q, %v, %v; expected ci-bot writer", name, role, err)
	}
	if !slices.Equal(iss.Cert.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("client extended key usages %v; expected client auth only", iss.Cert.ExtKeyUsage)
	}
	approx(t, "client NotAfter (--lifetime 48h)", iss.Cert.NotAfter, time.Now().Add(48*time.Hour))
	if filepath.Base(iss.CertPath) != "client.ci-bot.crt" || filepath.Base(iss.KeyPath) != "client.ci-bot.key" {
		t.Errorf("client files %s, %s", iss.CertPath, iss.KeyPath)
	}
	if m := mode(t, iss.KeyPath); m != 0o600 {
		t.Errorf("client key mode %#o; expected 0600", m)
	}
}

func TestCreateRefusesToReplaceKeysWithoutOverwrite(t *testing.T) {
	o := newCA(t)
	if _, err := CreateNode(o, 1, []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateClient(o, "ops", auth.Admin); err != nil {
		t.Fatal(err)
	}
	keys := map[string][]byte{}
	for _, f := range []string{CAKeyFile, NodeKeyFile, ClientKeyFile("ops")} {
		keys[f], _ = os.ReadFile(filepath.Join(o.CertsDir, f))
	}
	_, errCA := CreateCA(o)
	_, errNode := CreateNode(o, 1, []string{"localhost"})
	_, errClient := CreateClient(o, "ops", auth.Reader)
	for what, err := range map[string]error{"create-ca": errCA, "create-node": errNode, "create-client": errClient} {
		if err == nil || !strings.Contains(err.Error(), "--overwrite") {
			t.Errorf("%s over existing files: %v; expected a refusal mentioning --overwrite", what, err)
		}
	}
	for f, before := range keys {
		if after, _ := os.ReadFile(filepath.Join(o.CertsDir, f)); !bytes.Equal(before, after) {
			t.Errorf("%s changed after a refused create", f)
		}
	}
	o.Overwrite = true
	if _, err := CreateNode(o, 1, []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(o.CertsDir, NodeKeyFile)); bytes.Equal(keys[NodeKeyFile], after) {
		t.Error("node.key unchanged after create-node --overwrite")
	}
}

// A new CA over an old one keeps the old certificate in ca.crt (after the
// new), so certificates the old CA signed verify until they are reissued.
func TestCreateCAOverwriteKeepsTheOldCAInTheBundle(t *testing.T) {
	o := newCA(t)
	oldNode, err := CreateNode(o, 1, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	o.Overwrite = true
	iss, err := CreateCA(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(iss.KeptCAs) != 1 {
		t.Fatalf("kept %d old CAs; expected 1", len(iss.KeptCAs))
	}
	bundle, err := readCerts(filepath.Join(o.CertsDir, CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(bundle) != 2 || !bundle[0].Equal(iss.Cert) || !bundle[1].Equal(iss.KeptCAs[0]) {
		t.Fatalf("ca.crt holds %d certificates; expected the new CA then the old", len(bundle))
	}
	pool := x509.NewCertPool()
	for _, c := range bundle {
		pool.AddCert(c)
	}
	if _, err := oldNode.Cert.Verify(x509.VerifyOptions{Roots: pool}); err != nil {
		t.Errorf("a node certificate of the old CA no longer verifies against the bundle: %v", err)
	}
	newNode, err := CreateNode(o, 2, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if newNode.Cert.CheckSignatureFrom(iss.Cert) != nil {
		t.Error("a node certificate made after the rotation is not signed by the new CA")
	}
}

// Production keeps ca.key off the nodes (--ca-key elsewhere).
func TestCreateWithTheCAKeyElsewhere(t *testing.T) {
	o := CreateOptions{CertsDir: t.TempDir(), CAKey: filepath.Join(t.TempDir(), "safe", "ca.key")}
	if _, err := CreateCA(o); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(o.CertsDir, CAKeyFile)); err == nil {
		t.Error("ca.key written into the certs dir although --ca-key points elsewhere")
	}
	if _, err := CreateNode(o, 1, []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	o.CAKey = ""
	_, err := CreateClient(o, "ops", auth.Admin)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(o.CertsDir, CAKeyFile)) || !strings.Contains(err.Error(), "missing") {
		t.Errorf("create-client without --ca-key: %v; expected an error naming the missing %s", err, filepath.Join(o.CertsDir, CAKeyFile))
	}
}

func TestCreateRefusesBadInput(t *testing.T) {
	o := newCA(t)
	cases := []struct {
		name string
		err  func() error
		want string
	}{
		{"member 0", func() error { _, err := CreateNode(o, 0, []string{"localhost"}); return err }, "found 0"},
		{"no hosts", func() error { _, err := CreateNode(o, 1, nil); return err }, "at least one host"},
		{"bad host", func() error { _, err := CreateNode(o, 1, []string{"a b"}); return err }, `host "a b"`},
		{"empty label", func() error { _, err := CreateNode(o, 1, []string{"a..b"}); return err }, `host "a..b"`},
		{"bad client name", func() error { _, err := CreateClient(o, "../x", auth.Admin); return err }, "expected a-z"},
		{"no role", func() error { _, err := CreateClient(o, "x", 0); return err }, "expected role"},
		{"negative lifetime", func() error {
			o := o
			o.Lifetime = -time.Hour
			_, err := CreateClient(o, "x", auth.Admin)
			return err
		}, "positive duration"},
		{"outlives the CA", func() error {
			o := o
			o.Lifetime = DefaultCALifetime + 24*time.Hour
			_, err := CreateNode(o, 1, []string{"localhost"})
			return err
		}, "after the CA"},
		{"no certs dir", func() error { _, err := CreateCA(CreateOptions{}); return err }, "certs dir"},
	}
	for _, c := range cases {
		if err := c.err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; expected an error containing %q", c.name, err, c.want)
		}
	}
}

// A CA key that belongs to no certificate in ca.crt (a crash between the
// key and certificate writes of create-ca, or --ca-key of another
// cluster) is refused, never used to sign.
func TestCreateRefusesACAKeyOfAnotherCA(t *testing.T) {
	o := newCA(t)
	other := newCA(t)
	o.CAKey = filepath.Join(other.CertsDir, CAKeyFile)
	_, err := CreateNode(o, 1, []string{"localhost"})
	if err == nil || !strings.Contains(err.Error(), "matches no certificate") {
		t.Errorf("CreateNode with another CA's key: %v; expected a refusal", err)
	}
}
