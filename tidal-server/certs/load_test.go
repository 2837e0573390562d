package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/atomicfile"
	"github.com/tidaldb/tidal/tidal-server/auth"
)

func TestLoadNode(t *testing.T) {
	ca := newCA(t)
	s := load(t, nodeDir(t, ca, 7))
	if s.Member() != 7 {
		t.Errorf("Member() = %d; expected 7", s.Member())
	}
	if s.NodeCert() == nil || s.NodeCert().URIs[0].String() != "tidal://member/7" {
		t.Errorf("NodeCert() = %v", s.NodeCert())
	}
}

// Every way a node's certs directory can be wrong is reported naming the
// file at fault.
func TestLoadNamesTheBadFile(t *testing.T) {
	ca := newCA(t)
	other := newCA(t)
	past := func(o *CreateOptions) {
		o.Now = func() time.Time { return time.Now().Add(-3 * 365 * 24 * time.Hour) }
		o.Lifetime = 365 * 24 * time.Hour
	}
	cases := []struct {
		name  string
		setup func(dir string)
		file  string
		want  string
	}{
		{"missing ca.crt", func(dir string) { os.Remove(filepath.Join(dir, CACertFile)) }, CACertFile, "missing"},
		{"missing node.crt", func(dir string) { os.Remove(filepath.Join(dir, NodeCertFile)) }, NodeCertFile, "missing"},
		{"missing node.key", func(dir string) { os.Remove(filepath.Join(dir, NodeKeyFile)) }, NodeKeyFile, "missing"},
		{"garbage node.crt", func(dir string) {
			os.WriteFile(filepath.Join(dir, NodeCertFile), []byte("not a certificate\n"), 0o644)
		}, NodeCertFile, "expected PEM CERTIFICATE blocks"},
		{"key in node.crt", func(dir string) {
			copyFile(t, filepath.Join(dir, NodeKeyFile), filepath.Join(dir, NodeCertFile))
		}, NodeCertFile, `found "PRIVATE KEY"`},
		{"garbage ca.crt", func(dir string) {
			os.WriteFile(filepath.Join(dir, CACertFile), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), 0o644)
		}, CACertFile, "PEM block 1"},
		{"garbage node.key", func(dir string) {
			os.WriteFile(filepath.Join(dir, NodeKeyFile), []byte("nope"), 0o600)
		}, NodeKeyFile, "no PEM block"},
		{"node.key readable by others", func(dir string) {
			os.Chmod(filepath.Join(dir, NodeKeyFile), 0o644)
		}, NodeKeyFile, "chmod 600"},
		{"node.key of another node", func(dir string) {
			copyFile(t, filepath.Join(nodeDir(t, ca, 2), NodeKeyFile), filepath.Join(dir, NodeKeyFile))
		}, NodeKeyFile, "does not belong to"},
		{"node.crt from another CA", func(dir string) {
			o := nodeDir(t, other, 1)
			copyFile(t, filepath.Join(o, NodeCertFile), filepath.Join(dir, NodeCertFile))
			copyFile(t, filepath.Join(o, NodeKeyFile), filepath.Join(dir, NodeKeyFile))
		}, NodeCertFile, "not signed by any CA in"},
		{"expired node.crt", func(dir string) {
			o := nodeDir(t, ca, 1, past)
			copyFile(t, filepath.Join(o, NodeCertFile), filepath.Join(dir, NodeCertFile))
			copyFile(t, filepath.Join(o, NodeKeyFile), filepath.Join(dir, NodeKeyFile))
		}, NodeCertFile, "expired at"},
		{"node.crt not yet valid", func(dir string) {
			o := nodeDir(t, ca, 1, func(o *CreateOptions) {
				o.Now = func() time.Time { return time.Now().Add(48 * time.Hour) }
			})
			copyFile(t, filepath.Join(o, NodeCertFile), filepath.Join(dir, NodeCertFile))
			copyFile(t, filepath.Join(o, NodeKeyFile), filepath.Join(dir, NodeKeyFile))
		}, NodeCertFile, "not valid before"},
		{"a client certificate as node.crt", func(dir string) {
			if _, err := CreateClient(CreateOptions{CertsDir: dir, CAKey: filepath.Join(ca.CertsDir, CAKeyFile)}, "ops", auth.Admin); err != nil {
				t.Fatal(err)
			}
			copyFile(t, filepath.Join(dir, ClientCertFile("ops")), filepath.Join(dir, NodeCertFile))
			copyFile(t, filepath.Join(dir, ClientKeyFile("ops")), filepath.Join(dir, NodeKeyFile))
		}, NodeCertFile, "not usable as a TLS server"},
		{"node.crt naming a client", func(dir string) {
			signLeaf(t, CreateOptions{CertsDir: ca.CertsDir}, &x509.Certificate{
				URIs:        []*url.URL{{Scheme: "tidal", Host: "client", Path: "/x", RawQuery: "role=admin"}},
				ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			}, dir, NodeCertFile, NodeKeyFile)
		}, NodeCertFile, "expected a member identity"},
		{"node.crt without identity", func(dir string) {
			signLeaf(t, CreateOptions{CertsDir: ca.CertsDir}, &x509.Certificate{
				DNSNames:    []string{"localhost"},
				ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			}, dir, NodeCertFile, NodeKeyFile)
		}, NodeCertFile, "no identity"},
		{"ca.crt holding a leaf", func(dir string) {
			copyFile(t, filepath.Join(dir, NodeCertFile), filepath.Join(dir, CACertFile))
		}, CACertFile, "is not a CA certificate"},
		{"expired CA", func(dir string) {
			old := CreateOptions{CertsDir: t.TempDir(), Lifetime: 24 * time.Hour,
				Now: func() time.Time { return time.Now().Add(-48 * time.Hour) }}
			if _, err := CreateCA(old); err != nil {
				t.Fatal(err)
			}
			copyFile(t, filepath.Join(old.CertsDir, CACertFile), filepath.Join(dir, CACertFile))
		}, CACertFile, "every CA certificate has expired"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := nodeDir(t, ca, 1)
			c.setup(dir)
			_, err := Load(dir)
			if err == nil {
				t.Fatalf("Load: no error; expected one naming %s and containing %q", c.file, c.want)
			}
			if !strings.Contains(err.Error(), filepath.Join(dir, c.file)) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Load: %v\nexpected an error naming %s and containing %q", err, filepath.Join(dir, c.file), c.want)
			}
		})
	}
}

// The peer plane: mutual TLS, every peer a member of this cluster's CA,
// the server the member the client meant to dial.
func TestPeerPlaneMutualTLS(t *testing.T) {
	ca := newCA(t)
	other := newCA(t)
	n1 := load(t, nodeDir(t, ca, 1))
	n2dir := nodeDir(t, ca, 2)
	n2 := load(t, n2dir)
	foreign := load(t, nodeDir(t, other, 1))

	t.Run("member 2 dials member 1", func(t *testing.T) {
		r := handshake(t, n1.PeerServerTLS(), n2.PeerClientTLS(1))
		if r.serverErr != nil || r.clientErr != nil {
			t.Fatalf("server %v, client %v", r.serverErr, r.clientErr)
		}
		if id, err := auth.MemberFromState(&r.server); err != nil || id != 2 {
			t.Errorf("server sees member %d, %v; expected 2", id, err)
		}
		if r.server.Version != tls.VersionTLS13 || r.negotiated != "h2" {
			t.Errorf("version %x, ALPN %q; expected TLS 1.3 and h2", r.server.Version, r.negotiated)
		}
	})
	t.Run("server is not the member dialed", func(t *testing.T) {
		r := handshake(t, n1.PeerServerTLS(), n2.PeerClientTLS(3))
		if r.clientErr == nil || !strings.Contains(r.clientErr.Error(), "expected member 3") {
			t.Errorf("client error %v; expected a refusal naming member 3", r.clientErr)
		}
	})
	t.Run("client without a certificate", func(t *testing.T) {
		pool := x509.NewCertPool()
		pool.AddCert(n1.current().cas[0])
		r := handshake(t, n1.PeerServerTLS(), &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"h2"}})
		if r.serverErr == nil || r.clientErr == nil {
			t.Errorf("server %v, client %v; expected both to fail", r.serverErr, r.clientErr)
		}
	})
	t.Run("client of another CA", func(t *testing.T) {
		r := handshake(t, n1.PeerServerTLS(), foreign.PeerClientTLS(0))
		if r.serverErr == nil || r.clientErr == nil {
			t.Errorf("server %v, client %v; expected both to fail", r.serverErr, r.clientErr)
		}
	})
	t.Run("client certificate of the same CA that names a client", func(t *testing.T) {
		if _, err := CreateClient(CreateOptions{CertsDir: n2dir, CAKey: filepath.Join(ca.CertsDir, CAKeyFile)}, "ops", auth.Admin); err != nil {
			t.Fatal(err)
		}
		cfg := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"},
			Certificates: []tls.Certificate{keyPair(t, n2dir, ClientCertFile("ops"), ClientKeyFile("ops"))}}
		r := handshake(t, n1.PeerServerTLS(), cfg)
		if r.serverErr == nil || !strings.Contains(r.serverErr.Error(), "expected a member identity") || r.clientErr == nil {
			t.Errorf("server %v, client %v; expected the server to refuse a client identity", r.serverErr, r.clientErr)
		}
	})
	t.Run("expired member certificate of the same CA", func(t *testing.T) {
		dir := nodeDir(t, ca, 2, func(o *CreateOptions) {
			o.Now = func() time.Time { return time.Now().Add(-3 * 365 * 24 * time.Hour) }
			o.Lifetime = 365 * 24 * time.Hour
		})
		cfg := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"},
			Certificates: []tls.Certificate{keyPair(t, dir, NodeCertFile, NodeKeyFile)}}
		r := handshake(t, n1.PeerServerTLS(), cfg)
		if r.serverErr == nil || !strings.Contains(r.serverErr.Error(), "expired") {
			t.Errorf("server %v; expected a refusal of the expired certificate", r.serverErr)
		}
	})
	t.Run("server of another CA", func(t *testing.T) {
		r := handshake(t, foreign.PeerServerTLS(), n2.PeerClientTLS(1))
		if r.clientErr == nil || !strings.Contains(r.clientErr.Error(), "not signed by any CA") {
			t.Errorf("client error %v; expected a refusal of the server's CA", r.clientErr)
		}
	})
}

// The client plane: TLS 1.2+, h2 by ALPN, a client certificate optional
// but verified when given.
func TestClientPlaneTLS(t *testing.T) {
	ca := newCA(t)
	other := newCA(t)
	dir := nodeDir(t, ca, 1)
	n1 := load(t, dir)
	caKey := filepath.Join(ca.CertsDir, CAKeyFile)
	if _, err := CreateClient(CreateOptions{CertsDir: dir, CAKey: caKey}, "alice", auth.Reader); err != nil {
		t.Fatal(err)
	}
	withName := func(cfg *tls.Config) *tls.Config { cfg.ServerName = "127.0.0.1"; return cfg }

	t.Run("client certificate", func(t *testing.T) {
		cfg, err := ClientTLS(dir, "alice")
		if err != nil {
			t.Fatal(err)
		}
		r := handshake(t, n1.ServerTLS(), withName(cfg))
		if r.serverErr != nil || r.clientErr != nil {
			t.Fatalf("server %v, client %v", r.serverErr, r.clientErr)
		}
		if r.negotiated != "h2" {
			t.Errorf("ALPN %q; expected h2", r.negotiated)
		}
		if len(r.server.VerifiedChains) == 0 {
			t.Fatal("server has no verified chain for alice")
		}
		if name, role, err := auth.ClientFromCert(r.server.VerifiedChains[0][0]); err != nil || name != "alice" || role != auth.Reader {
			t.Errorf("server sees %q %v %v; expected alice reader", name, role, err)
		}
	})
	t.Run("no client certificate", func(t *testing.T) {
		cfg, err := ClientTLS(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		r := handshake(t, n1.ServerTLS(), withName(cfg))
		if r.serverErr != nil || r.clientErr != nil || len(r.server.VerifiedChains) != 0 {
			t.Errorf("server %v, client %v, chains %d; expected a handshake without a client identity", r.serverErr, r.clientErr, len(r.server.VerifiedChains))
		}
	})
	t.Run("http/1.1 only client", func(t *testing.T) {
		cfg, _ := ClientTLS(dir, "")
		cfg.NextProtos = []string{"http/1.1"}
		if r := handshake(t, n1.ServerTLS(), withName(cfg)); r.clientErr != nil || r.negotiated != "http/1.1" {
			t.Errorf("client %v, ALPN %q; expected http/1.1", r.clientErr, r.negotiated)
		}
	})
	t.Run("TLS 1.1 refused", func(t *testing.T) {
		cfg, _ := ClientTLS(dir, "")
		cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
		if r := handshake(t, n1.ServerTLS(), withName(cfg)); r.serverErr == nil {
			t.Error("a TLS 1.1 client was served; expected TLS 1.2 or later only")
		}
	})
	t.Run("host name is checked", func(t *testing.T) {
		cfg, _ := ClientTLS(dir, "")
		cfg.ServerName = "elsewhere.example.com"
		if r := handshake(t, n1.ServerTLS(), cfg); r.clientErr == nil {
			t.Error("client accepted node.crt for a host it does not name")
		}
	})
	t.Run("client certificate of another CA", func(t *testing.T) {
		odir := t.TempDir()
		copyFile(t, filepath.Join(other.CertsDir, CACertFile), filepath.Join(odir, CACertFile))
		if _, err := CreateClient(CreateOptions{CertsDir: odir, CAKey: filepath.Join(other.CertsDir, CAKeyFile)}, "alice", auth.Admin); err != nil {
			t.Fatal(err)
		}
		cfg, _ := ClientTLS(dir, "")
		cfg.Certificates = []tls.Certificate{keyPair(t, odir, ClientCertFile("alice"), ClientKeyFile("alice"))}
		r := handshake(t, n1.ServerTLS(), withName(cfg))
		if r.serverErr == nil || r.clientErr == nil {
			t.Errorf("server %v, client %v; expected the foreign client certificate refused", r.serverErr, r.clientErr)
		}
	})
	t.Run("expired client certificate", func(t *testing.T) {
		o := CreateOptions{CertsDir: dir, CAKey: caKey, Lifetime: time.Hour,
			Now: func() time.Time { return time.Now().Add(-48 * time.Hour) }}
		if _, err := CreateClient(o, "old", auth.Admin); err != nil {
			t.Fatal(err)
		}
		if _, err := ClientTLS(dir, "old"); err == nil || !strings.Contains(err.Error(), "expired at") {
			t.Errorf("ClientTLS(old) = %v; expected an error saying it expired", err)
		}
		cfg, _ := ClientTLS(dir, "")
		cfg.Certificates = []tls.Certificate{keyPair(t, dir, ClientCertFile("old"), ClientKeyFile("old"))}
		r := handshake(t, n1.ServerTLS(), withName(cfg))
		if r.serverErr == nil || !strings.Contains(r.serverErr.Error(), "expired") {
			t.Errorf("server %v; expected the expired client certificate refused", r.serverErr)
		}
	})
}

func TestClientTLSNamesTheBadFile(t *testing.T) {
	ca := newCA(t)
	dir := nodeDir(t, ca, 1)
	o := CreateOptions{CertsDir: dir, CAKey: filepath.Join(ca.CertsDir, CAKeyFile)}
	for _, name := range []string{"alice", "bob"} {
		if _, err := CreateClient(o, name, auth.Writer); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ClientTLS(dir, "carol"); err == nil || !strings.Contains(err.Error(), ClientCertFile("carol")+": missing") {
		t.Errorf("ClientTLS(carol) = %v; expected client.carol.crt missing", err)
	}
	copyFile(t, filepath.Join(dir, ClientCertFile("bob")), filepath.Join(dir, ClientCertFile("alice")))
	copyFile(t, filepath.Join(dir, ClientKeyFile("bob")), filepath.Join(dir, ClientKeyFile("alice")))
	if _, err := ClientTLS(dir, "alice"); err == nil || !strings.Contains(err.Error(), `names client "bob"`) {
		t.Errorf("ClientTLS(alice holding bob's certificate) = %v; expected a name mismatch", err)
	}
	if _, err := ClientTLS(t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), CACertFile) {
		t.Errorf("ClientTLS(no ca.crt) = %v; expected ca.crt missing", err)
	}
}

// Certificates rotate without a restart: a handshake after the files
// change serves the new ones; a change that does not load keeps the old
// ones and is reported once.
func TestStoreReloadsChangedFiles(t *testing.T) {
	ca := newCA(t)
	dir := nodeDir(t, ca, 1)
	var mu sync.Mutex
	var reports []error
	s, err := LoadWith(dir, LoadOptions{OnReload: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reports = append(reports, err)
	}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ClientTLS(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	client.ServerName = "localhost"
	served := func() *x509.Certificate {
		t.Helper()
		r := handshake(t, s.ServerTLS(), client)
		if r.clientErr != nil || r.serverErr != nil {
			t.Fatalf("handshake: server %v, client %v", r.serverErr, r.clientErr)
		}
		return r.serverCert
	}
	first := served()
	if !first.Equal(s.NodeCert()) {
		t.Fatal("served certificate is not node.crt")
	}
	if served(); len(reports) != 0 {
		t.Fatalf("reports %v with no change; expected none", reports)
	}

	rotated, err := CreateNode(CreateOptions{CertsDir: dir, CAKey: filepath.Join(ca.CertsDir, CAKeyFile), Overwrite: true}, 1, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if got := served(); !got.Equal(rotated.Cert) {
		t.Errorf("after rotation the server presents serial %x; expected the new %x", got.SerialNumber, rotated.Cert.SerialNumber)
	}
	if len(reports) != 1 || reports[0] != nil {
		t.Errorf("reports %v; expected one successful reload", reports)
	}

	// A broken node.crt (a half-finished copy): keep serving the rotated
	// certificate, report once, not at every handshake.
	if err := atomicfile.Write(filepath.Join(dir, NodeCertFile), []byte("half a certificate"), certMode); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if got := served(); !got.Equal(rotated.Cert) {
			t.Fatalf("after a broken node.crt the server presents serial %x; expected the last good %x", got.SerialNumber, rotated.Cert.SerialNumber)
		}
	}
	if len(reports) != 2 || reports[1] == nil || !strings.Contains(reports[1].Error(), filepath.Join(dir, NodeCertFile)) {
		t.Errorf("reports %v; expected one more, naming node.crt", reports)
	}
	if err := s.Reload(); err == nil {
		t.Error("Reload with a broken node.crt: expected an error")
	}
	if s.Member() != 1 || !s.NodeCert().Equal(rotated.Cert) {
		t.Error("a failed Reload replaced the certificate in use")
	}

	// node.crt of another member: a node's identity never changes.
	other, err := CreateNode(CreateOptions{CertsDir: dir, CAKey: filepath.Join(ca.CertsDir, CAKeyFile), Overwrite: true}, 2, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if got := served(); got.Equal(other.Cert) || !got.Equal(rotated.Cert) {
		t.Error("after node.crt changed to member 2, the server presents it; expected member 1's certificate kept")
	}
	if s.Member() != 1 {
		t.Errorf("Member() = %d after a node.crt of member 2; expected 1", s.Member())
	}
	if len(reports) != 3 || reports[2] == nil || !strings.Contains(reports[2].Error(), "names member 2, but this node is member 1") {
		t.Errorf("reports %v; expected one more, refusing member 2", reports)
	}

	// The next good change is taken.
	again, err := CreateNode(CreateOptions{CertsDir: dir, CAKey: filepath.Join(ca.CertsDir, CAKeyFile), Overwrite: true}, 1, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	if got := served(); !got.Equal(again.Cert) {
		t.Errorf("after the fix the server presents serial %x; expected %x", got.SerialNumber, again.Cert.SerialNumber)
	}
}

// A CA rotation: the new CA is added to every node's ca.crt first (the
// bundle create-ca --overwrite writes), then node certificates are
// reissued one by one; meanwhile members with old and new certificates
// accept each other.
func TestPeerPlaneAcrossACARotation(t *testing.T) {
	ca := newCA(t)
	d1, d2 := nodeDir(t, ca, 1), nodeDir(t, ca, 2)
	n1, n2 := load(t, d1), load(t, d2)
	ca.Overwrite = true
	if _, err := CreateCA(ca); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{d1, d2} {
		copyFile(t, filepath.Join(ca.CertsDir, CACertFile), filepath.Join(d, CACertFile))
	}
	if _, err := CreateNode(CreateOptions{CertsDir: d2, CAKey: filepath.Join(ca.CertsDir, CAKeyFile), Overwrite: true}, 2, []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name           string
		server, client *Store
		expect         uint64
	}{{"new dials old", n1, n2, 1}, {"old dials new", n2, n1, 2}} {
		r := handshake(t, c.server.PeerServerTLS(), c.client.PeerClientTLS(c.expect))
		if r.serverErr != nil || r.clientErr != nil {
			t.Errorf("%s: server %v, client %v", c.name, r.serverErr, r.clientErr)
		}
	}
	if len(n1.current().cas) != 2 || len(n2.current().cas) != 2 {
		t.Errorf("nodes trust %d and %d CAs after the bundle changed; expected 2 each", len(n1.current().cas), len(n2.current().cas))
	}
}
