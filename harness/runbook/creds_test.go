package runbook

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

// pki is a CA and a node's and a client's directories, as local-cluster.sh
// lays them out.
type pki struct {
	caKey, clientDir, nodeDir string
}

func newPKI(t *testing.T) pki {
	t.Helper()
	root := t.TempDir()
	p := pki{caKey: filepath.Join(root, "ca", "ca.key"), clientDir: filepath.Join(root, "certs"), nodeDir: filepath.Join(root, "node")}
	for _, d := range []string{filepath.Dir(p.caKey), p.clientDir, p.nodeDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := certs.CreateCA(certs.CreateOptions{CertsDir: p.clientDir, CAKey: p.caKey}); err != nil {
		t.Fatal(err)
	}
	p.copyCA(t)
	p.issueNode(t, []string{"127.0.0.1"})
	p.issueWriter(t)
	return p
}

func (p pki) copyCA(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.clientDir, certs.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.nodeDir, certs.CACertFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func (p pki) issueNode(t *testing.T, hosts []string) {
	t.Helper()
	if _, err := certs.CreateNode(certs.CreateOptions{CertsDir: p.nodeDir, CAKey: p.caKey, Overwrite: true}, 1, hosts); err != nil {
		t.Fatal(err)
	}
}

func (p pki) issueWriter(t *testing.T) {
	t.Helper()
	if _, err := certs.CreateClient(certs.CreateOptions{CertsDir: p.clientDir, CAKey: p.caKey, Overwrite: true}, "writer", auth.Writer); err != nil {
		t.Fatal(err)
	}
}

// rotateCA makes a new CA: ca.crt becomes [new, old] in the client
// directory (and, copied, the node's).
func (p pki) rotateCA(t *testing.T) {
	t.Helper()
	if _, err := certs.CreateCA(certs.CreateOptions{CertsDir: p.clientDir, CAKey: p.caKey, Overwrite: true}); err != nil {
		t.Fatal(err)
	}
	p.copyCA(t)
}

// dropOldCA keeps only the first (newest) CA in the client directory's
// ca.crt, as the rotation page's last step does.
func (p pki) dropOldCA(t *testing.T) {
	t.Helper()
	path := filepath.Join(p.clientDir, certs.CACertFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const end = "-----END CERTIFICATE-----\n"
	first := string(b)[:strings.Index(string(b), end)+len(end)]
	if err := os.WriteFile(path+".tmp", []byte(first), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// serveNode serves HTTPS with whatever certificate the node directory
// holds at each handshake (certs.Store), answering 200 with the client
// certificate's common name.
func serveNode(t *testing.T, p pki) *httptest.Server {
	t.Helper()
	store, err := certs.Load(p.nodeDir)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := "-"
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			name = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		io.WriteString(w, name)
	}))
	srv.TLS = store.ServerTLS()
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// get makes a request on a new connection (every rotation step is judged
// by a fresh handshake, as a new client connection would see it).
func get(creds *fileCreds, url string) (string, error) {
	hc := creds.HTTPClient(strings.TrimPrefix(url, "https://"), 10*time.Second)
	defer hc.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// A long-running client follows a CA rotation through its files: it
// trusts the node's certificate from the new CA once ca.crt holds it,
// presents its reissued certificate, and keeps working after the old CA is
// dropped; one that read the files once would have failed at the first
// node certificate of the new CA.
func TestFileCredsFollowACARotation(t *testing.T) {
	p := newPKI(t)
	srv := serveNode(t, p)
	creds, err := newFileCreds(p.clientDir, "writer")
	if err != nil {
		t.Fatal(err)
	}
	once, err := certs.ClientTLS(p.clientDir, "writer") // read once, never again
	if err != nil {
		t.Fatal(err)
	}
	step := func(what string) {
		t.Helper()
		if got, err := get(creds, srv.URL); err != nil || got != "writer" {
			t.Fatalf("%s: request as writer: %q, %v", what, got, err)
		}
	}
	step("before the rotation")
	p.rotateCA(t)
	step("after create-ca --overwrite (ca.crt: new and old CA)")
	p.issueNode(t, []string{"127.0.0.1"})
	step("after the node's certificate was reissued by the new CA")
	onceClient := &http.Client{Transport: &http.Transport{TLSClientConfig: once}, Timeout: 10 * time.Second}
	if _, err := onceClient.Get(srv.URL); err == nil {
		t.Fatal("a client that read ca.crt before the rotation trusted the new CA's node certificate; the test proves nothing")
	}
	p.issueWriter(t)
	step("after the writer's certificate was reissued")
	p.dropOldCA(t)
	step("after the old CA was dropped from ca.crt")
}

// The credentials verify the server as crypto/tls would: a node whose
// certificate no CA in ca.crt signed, or that does not name the host
// dialled, is refused.
func TestFileCredsRefuseAnUntrustedOrMisnamedServer(t *testing.T) {
	p := newPKI(t)
	creds, err := newFileCreds(p.clientDir, "writer")
	if err != nil {
		t.Fatal(err)
	}

	other := newPKI(t) // another cluster's CA
	foreign := serveNode(t, other)
	if _, err := get(creds, foreign.URL); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a node of another CA: expected a certificate error, found %v", err)
	}

	p.issueNode(t, []string{"10.9.9.9"}) // not the address dialled
	misnamed := serveNode(t, p)
	if _, err := get(creds, misnamed.URL); err == nil || !strings.Contains(err.Error(), "valid for 10.9.9.9, not 127.0.0.1") {
		t.Errorf("a node certificate for another host: expected a host name error, found %v", err)
	}

	if _, err := newFileCreds(t.TempDir(), "writer"); err == nil {
		t.Error("credentials from an empty directory: expected an error")
	}
}

// A change that does not load (a key written before its certificate, as
// certs.Create* do) keeps the credentials in use.
func TestFileCredsKeepWhatWorksOnAHalfWrittenChange(t *testing.T) {
	p := newPKI(t)
	srv := serveNode(t, p)
	creds, err := newFileCreds(p.clientDir, "writer")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.clientDir, certs.ClientKeyFile("writer")), []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := get(creds, srv.URL); err != nil || got != "writer" {
		t.Fatalf("with a broken key file: %q, %v; expected the credentials in use to keep working", got, err)
	}
}
