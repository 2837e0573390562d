package runbook

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// Client certificate names local-cluster.sh makes in $TIDAL_CERTS.
const (
	certAdmin  = "admin"
	certWriter = "writer"
)

// fileCreds is a client of a secured local cluster as a long-running
// service would be one: it trusts the CAs in ca.crt of the cluster's
// client directory ($TIDAL_CERTS) and presents client.NAME.crt from it,
// and it re-reads the three files whenever they change. A page that
// rotates the CA replaces those files while the workload writes: a client
// that read them once would stop trusting the nodes as soon as they
// present certificates of the new CA, and measure its own stale trust as
// the cluster's unavailability. A change that does not load (a key written
// before its certificate) keeps the files in use until the next change.
type fileCreds struct {
	dir, name string

	mu     sync.Mutex
	stamp  [3]fileStamp
	failed [3]fileStamp
	roots  *x509.CertPool
	cert   *tls.Certificate
}

// fileStamp identifies a file's contents cheaply: inode, size, mtime.
type fileStamp struct {
	ino   uint64
	size  int64
	mtime int64
}

func newFileCreds(dir, name string) (*fileCreds, error) {
	c := &fileCreds{dir: dir, name: name}
	if _, err := c.current(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *fileCreds) paths() [3]string {
	return [3]string{filepath.Join(c.dir, certs.CACertFile), filepath.Join(c.dir, certs.ClientCertFile(c.name)),
		filepath.Join(c.dir, certs.ClientKeyFile(c.name))}
}

func (c *fileCreds) stat() [3]fileStamp {
	var st [3]fileStamp
	for i, p := range c.paths() {
		fi, err := os.Stat(p)
		if err != nil {
			continue // a file replaced by delete and create: read it next time
		}
		st[i].size, st[i].mtime = fi.Size(), fi.ModTime().UnixNano()
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			st[i].ino = uint64(sys.Ino)
		}
	}
	return st
}

// current returns the roots and certificate in use, reading the files
// again when they changed since the last reading (or failed reading).
func (c *fileCreds) current() (*tls.Config, error) {
	st := c.stat()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.roots != nil && (st == c.stamp || st == c.failed) {
		return &tls.Config{RootCAs: c.roots, Certificates: []tls.Certificate{*c.cert}}, nil
	}
	cfg, err := certs.ClientTLS(c.dir, c.name)
	if err != nil {
		c.failed = st
		if c.roots == nil {
			return nil, fmt.Errorf("runbook: client credentials %s in %s: %w", c.name, c.dir, err)
		}
		return &tls.Config{RootCAs: c.roots, Certificates: []tls.Certificate{*c.cert}}, nil
	}
	c.stamp, c.failed = st, [3]fileStamp{}
	c.roots, c.cert = cfg.RootCAs, &cfg.Certificates[0]
	return cfg, nil
}

// TLS is the configuration a client of the node at host (a name or IP
// address, as dialled) dials with. The standard verification is replaced
// by the same checks against the CAs of the moment: the chain up to a CA
// in ca.crt, for a TLS server, naming host.
func (c *fileCreds) TLS(host string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cfg, err := c.current()
			if err != nil {
				return nil, err
			}
			return &cfg.Certificates[0], nil
		},
		// Verification is not skipped: VerifyConnection does it.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			cfg, err := c.current()
			if err != nil {
				return err
			}
			return verifyServer(cs, host, cfg.RootCAs)
		},
	}
}

// verifyServer is crypto/tls's verification of a server at host, against
// roots. (A client's ConnectionState has no server name for an IP
// address: no SNI is sent for one.)
func verifyServer(cs tls.ConnectionState, host string, roots *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the server presented no certificate")
	}
	if host == "" {
		return errors.New("no host name to check the server's certificate against")
	}
	inter := x509.NewCertPool()
	for _, ic := range cs.PeerCertificates[1:] {
		inter.AddCert(ic)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: host,
		CurrentTime: time.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: cs.PeerCertificates, Err: err}
	}
	return nil
}

// Options are client options presenting these credentials to the node
// at addr (host:port).
func (c *fileCreds) Options(addr string) []client.Option {
	return []client.Option{client.WithTLS(c.TLS(hostOf(addr)))}
}

// HTTPClient is a raw HTTP/2 client of the node at addr (host:port)
// presenting these credentials.
func (c *fileCreds) HTTPClient(addr string, timeout time.Duration) *http.Client {
	tr := &http.Transport{Proxy: nil, DisableCompression: true, TLSClientConfig: c.TLS(hostOf(addr)), ForceAttemptHTTP2: true}
	return &http.Client{Transport: tr, Timeout: timeout}
}

func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}
