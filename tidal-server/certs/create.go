package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tidaldb/tidal/tidal-server/atomicfile"
	"github.com/tidaldb/tidal/tidal-server/auth"
)

// Default lifetimes. The CA lives long because replacing it touches every
// node and client; node and client certificates are rotated more often
// (and cannot outlive the CA that signed them).
const (
	DefaultCALifetime     = 10 * 365 * 24 * time.Hour
	DefaultNodeLifetime   = 2 * 365 * 24 * time.Hour
	DefaultClientLifetime = 2 * 365 * 24 * time.Hour
)

// backdate is how far before "now" a new certificate becomes valid, so a
// node whose clock is a little behind the machine that made it accepts
// it at once.
const backdate = time.Hour

// CreateOptions say where and how to create certificates.
type CreateOptions struct {
	// CertsDir receives the certificates (and keys other than the CA's).
	CertsDir string
	// CAKey is the CA key's path; "" means CertsDir/ca.key. Production
	// keeps it off the nodes, as CockroachDB advises: it can mint any
	// member or admin.
	CAKey string
	// Lifetime of the new certificate; 0 means the kind's default.
	Lifetime time.Duration
	// Overwrite replaces an existing key and certificate.
	Overwrite bool
	// Now is the clock (tests make expired certificates with it).
	Now func() time.Time
}

func (o CreateOptions) caKeyPath() string {
	if o.CAKey != "" {
		return o.CAKey
	}
	return filepath.Join(o.CertsDir, CAKeyFile)
}

func (o CreateOptions) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

func (o CreateOptions) lifetime(def time.Duration) (time.Duration, error) {
	switch {
	case o.Lifetime == 0:
		return def, nil
	case o.Lifetime < 0:
		return 0, fmt.Errorf("lifetime: expected a positive duration, found %s", o.Lifetime)
	}
	return o.Lifetime, nil
}

// Issued describes what a Create call wrote.
type Issued struct {
	Cert     *x509.Certificate
	CertPath string
	KeyPath  string
	// KeptCAs are the previous CA certificates CreateCA kept in ca.crt
	// after the new one (still valid ones only), so certificates they
	// signed keep verifying during a rotation.
	KeptCAs []*x509.Certificate
}

// CreateCA makes a new CA key and certificate. When ca.crt already
// exists (and Overwrite is set), the new certificate is written first and
// the old, unexpired CA certificates after it, so the bundle trusts both
// while certificates are reissued; CockroachDB's create-ca does the same.
func CreateCA(o CreateOptions) (*Issued, error) {
	if o.CertsDir == "" {
		return nil, errors.New("certs dir: expected a directory, found none")
	}
	life, err := o.lifetime(DefaultCALifetime)
	if err != nil {
		return nil, err
	}
	certPath, keyPath := filepath.Join(o.CertsDir, CACertFile), o.caKeyPath()
	if err := refuseExisting(o.Overwrite, keyPath, certPath); err != nil {
		return nil, err
	}
	now := o.now()
	var kept []*x509.Certificate
	if old, err := readCerts(certPath); err == nil {
		for _, c := range old {
			if c.IsCA && now.Before(c.NotAfter) {
				kept = append(kept, c)
			}
		}
	} else if _, statErr := os.Stat(certPath); statErr == nil {
		return nil, fmt.Errorf("keeping the old CA certificates: %w (move the file away to start afresh)", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "tidal CA", Organization: []string{"tidal"}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(life),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	bundle := encodeCert(der)
	for _, c := range kept {
		bundle = append(bundle, encodeCert(c.Raw)...)
	}
	// The key goes first: a crash between the two writes leaves a key
	// that matches no certificate in ca.crt, which signing refuses
	// loudly, rather than a ca.crt whose first CA has no key.
	if err := writeKeyAndCert(keyPath, key, certPath, bundle); err != nil {
		return nil, err
	}
	return &Issued{Cert: cert, CertPath: certPath, KeyPath: keyPath, KeptCAs: kept}, nil
}

// CreateNode makes node.crt and node.key for member id, valid for the
// given host names and IP addresses (at least one), for both TLS server
// and client authentication: the peer plane is mutual TLS.
func CreateNode(o CreateOptions, id uint64, hosts []string) (*Issued, error) {
	ident, err := auth.MemberIdentity(id)
	if err != nil {
		return nil, err
	}
	if len(hosts) == 0 {
		return nil, errors.New("hosts: expected at least one host name or IP address the node is reached at (--host)")
	}
	var dns []string
	var ips []net.IP
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if err := validHostName(h); err != nil {
			return nil, err
		}
		dns = append(dns, strings.ToLower(h))
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: fmt.Sprintf("tidal member %d", id), Organization: []string{"tidal"}},
		URIs:        []*url.URL{ident.URI()},
		DNSNames:    dns,
		IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	return issue(o, DefaultNodeLifetime, tmpl, filepath.Join(o.CertsDir, NodeCertFile), filepath.Join(o.CertsDir, NodeKeyFile))
}

// CreateClient makes client.NAME.crt and client.NAME.key for a client of
// the HTTP API with the given role.
func CreateClient(o CreateOptions, name string, role auth.Role) (*Issued, error) {
	ident, err := auth.ClientIdentity(name, role)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name, Organization: []string{"tidal"}, OrganizationalUnit: []string{role.String()}},
		URIs:        []*url.URL{ident.URI()},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return issue(o, DefaultClientLifetime, tmpl, filepath.Join(o.CertsDir, ClientCertFile(name)), filepath.Join(o.CertsDir, ClientKeyFile(name)))
}

// issue signs tmpl with the CA and writes the key and certificate.
func issue(o CreateOptions, defLife time.Duration, tmpl *x509.Certificate, certPath, keyPath string) (*Issued, error) {
	if o.CertsDir == "" {
		return nil, errors.New("certs dir: expected a directory, found none")
	}
	life, err := o.lifetime(defLife)
	if err != nil {
		return nil, err
	}
	if err := refuseExisting(o.Overwrite, keyPath, certPath); err != nil {
		return nil, err
	}
	now := o.now()
	ca, caKey, err := loadSigner(o, now)
	if err != nil {
		return nil, err
	}
	tmpl.NotBefore = now.Add(-backdate)
	tmpl.NotAfter = now.Add(life)
	if tmpl.NotAfter.After(ca.NotAfter) {
		return nil, fmt.Errorf("the certificate would expire at %s, after the CA that signs it (%s): shorten --lifetime or rotate the CA",
			tmpl.NotAfter.UTC().Format(time.RFC3339), ca.NotAfter.UTC().Format(time.RFC3339))
	}
	if tmpl.SerialNumber, err = newSerial(); err != nil {
		return nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.BasicConstraintsValid = true
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if err := writeKeyAndCert(keyPath, key, certPath, encodeCert(der)); err != nil {
		return nil, err
	}
	return &Issued{Cert: cert, CertPath: certPath, KeyPath: keyPath}, nil
}

// loadSigner reads ca.key and the certificate in ca.crt that belongs to
// it (during a rotation ca.crt holds several).
func loadSigner(o CreateOptions, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	certPath := filepath.Join(o.CertsDir, CACertFile)
	if _, err := os.Stat(certPath); errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("%s: missing: copy the cluster's ca.crt into the certs directory first (or create a CA with create-ca)", certPath)
	}
	cas, err := readCerts(certPath)
	if err != nil {
		return nil, nil, err
	}
	key, err := readKey(o.caKeyPath())
	if err != nil {
		return nil, nil, err
	}
	for _, c := range cas {
		if !sameKey(c, key) {
			continue
		}
		if !c.IsCA {
			return nil, nil, fmt.Errorf("%s: the certificate of %s is not a CA", certPath, o.caKeyPath())
		}
		if now.After(c.NotAfter) {
			return nil, nil, fmt.Errorf("%s: the CA certificate of %s expired at %s; create a new CA (certs create-ca --overwrite)",
				certPath, o.caKeyPath(), c.NotAfter.UTC().Format(time.RFC3339))
		}
		return c, key, nil
	}
	return nil, nil, fmt.Errorf("%s matches no certificate in %s (is --ca-key the key of this CA?)", o.caKeyPath(), certPath)
}

func writeKeyAndCert(keyPath string, key crypto.Signer, certPath string, certPEM []byte) error {
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	for _, dir := range []string{filepath.Dir(keyPath), filepath.Dir(certPath)} {
		if err := os.MkdirAll(dir, dirMode); err != nil {
			return err
		}
	}
	if err := atomicfile.Write(keyPath, keyPEM, keyMode); err != nil {
		return err
	}
	return atomicfile.Write(certPath, certPEM, certMode)
}

func newSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

// validHostName accepts DNS names (letters, digits, '-', dots between
// labels) and one leading wildcard label ("*.example.com").
func validHostName(h string) error {
	name := strings.TrimPrefix(h, "*.")
	if name == "" || len(h) > 253 {
		return fmt.Errorf("host %q: expected an IP address or a DNS name", h)
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host %q: expected an IP address or a DNS name, found the label %q", h, label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("host %q: expected an IP address or a DNS name, found %q", h, c)
			}
		}
	}
	return nil
}
