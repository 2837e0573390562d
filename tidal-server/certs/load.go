package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
)

// LoadOptions tune Load.
type LoadOptions struct {
	// Now is the clock for validity checks; nil means time.Now.
	Now func() time.Time
	// OnReload is told the outcome of each reload the files' change
	// caused: nil when the new files are in use, else why the old ones
	// were kept. Called once per change, from a TLS handshake goroutine.
	OnReload func(error)
}

// Store holds a node's certificates (ca.crt, node.crt, node.key) and
// hands out TLS configurations that use whatever the files hold now: each
// handshake stats the three files and, when one changed, reads them
// again. A change that does not load (a half-copied rotation, a key that
// does not match) keeps the certificates in use and is retried at the
// next change.
type Store struct {
	dir  string
	opts LoadOptions

	mu     sync.Mutex // serializes reloads
	failed stamps     // the files as they were at the last failed reload
	cur    atomic.Pointer[material]
}

// material is one consistent reading of the directory.
type material struct {
	stamps stamps
	cas    []*x509.Certificate
	pool   *x509.CertPool
	node   tls.Certificate
	leaf   *x509.Certificate
	member uint64

	clientPlane *tls.Config
	peerServer  *tls.Config
}

// stamps identify the files' contents cheaply: inode, size and mtime of
// each. The inode catches a rotation by rename (how CreateOptions.Overwrite
// and most tools replace a file) even within one tick of the file
// system's coarse clock.
type stamps [3]struct {
	ino   uint64
	size  int64
	mtime int64 // unix nanoseconds
}

// Load reads a node's certs directory. Every problem is an error naming
// the file: missing, unreadable, not PEM, expired or not yet valid, a key
// that does not match, a key readable by others, node.crt not signed by a
// CA in ca.crt, or without a member identity or the server and client
// usages the two planes need.
func Load(dir string) (*Store, error) { return LoadWith(dir, LoadOptions{}) }

// LoadWith is Load with options.
func LoadWith(dir string, opts LoadOptions) (*Store, error) {
	s := &Store{dir: dir, opts: opts}
	st, err := s.stat()
	if err != nil {
		return nil, err
	}
	m, err := s.load(st)
	if err != nil {
		return nil, err
	}
	s.cur.Store(m)
	return s, nil
}

func (s *Store) now() time.Time {
	if s.opts.Now != nil {
		return s.opts.Now()
	}
	return time.Now()
}

func (s *Store) paths() [3]string {
	return [3]string{filepath.Join(s.dir, CACertFile), filepath.Join(s.dir, NodeCertFile), filepath.Join(s.dir, NodeKeyFile)}
}

func (s *Store) stat() (stamps, error) {
	var st stamps
	for i, p := range s.paths() {
		fi, err := os.Stat(p)
		if err != nil {
			return st, fileError(p, err)
		}
		st[i].size, st[i].mtime = fi.Size(), fi.ModTime().UnixNano()
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			st[i].ino = uint64(sys.Ino)
		}
	}
	return st, nil
}

// Member is the member id node.crt names. It never changes for the life
// of the Store: a reloaded node.crt naming another member is refused.
func (s *Store) Member() uint64 { return s.cur.Load().member }

// NodeCert is node.crt's certificate in use.
func (s *Store) NodeCert() *x509.Certificate { return s.current().leaf }

// Reload re-reads the directory now if a file changed since the last
// reading. On error the certificates in use stay.
func (s *Store) Reload() error {
	st, err := s.stat()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == s.cur.Load().stamps {
		return nil
	}
	m, err := s.loadSameMember(st)
	if err != nil {
		s.failed = st
		return err
	}
	s.failed = stamps{}
	s.cur.Store(m)
	return nil
}

// loadSameMember loads the files for a reload: they must name the member
// the node already is (a node's identity in raft never changes).
func (s *Store) loadSameMember(st stamps) (*material, error) {
	m, err := s.load(st)
	if err != nil {
		return nil, err
	}
	if was := s.cur.Load().member; m.member != was {
		return nil, fmt.Errorf("%s: names member %d, but this node is member %d", filepath.Join(s.dir, NodeCertFile), m.member, was)
	}
	return m, nil
}

// current returns the material in use, reloading first when the files
// changed since it was read (and since the last failed attempt).
func (s *Store) current() *material {
	m := s.cur.Load()
	st, err := s.stat()
	if err != nil || st == m.stamps {
		// A file that vanished for a moment (a rotation by delete and
		// create) is not a reason to stop serving: keep what we have.
		return m
	}
	m, changed, report := s.reloadIfChanged(st)
	if changed && s.opts.OnReload != nil {
		s.opts.OnReload(report)
	}
	return m
}

// reloadIfChanged loads the files as stamped by st unless that state is
// already in use or already failed. changed says whether it tried.
func (s *Store) reloadIfChanged(st stamps) (m *material, changed bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m = s.cur.Load(); st == m.stamps || st == s.failed {
		return m, false, nil
	}
	next, err := s.loadSameMember(st)
	if err != nil {
		s.failed = st
		return m, true, fmt.Errorf("certificates changed but do not load; keeping the ones in use: %w", err)
	}
	s.failed = stamps{}
	s.cur.Store(next)
	return next, true, nil
}

func (s *Store) load(st stamps) (*material, error) {
	now := s.now()
	p := s.paths()
	caPath, certPath, keyPath := p[0], p[1], p[2]
	cas, err := readCerts(caPath)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	var latest time.Time
	for i, c := range cas {
		if !c.IsCA {
			return nil, fmt.Errorf("%s: certificate %d (%q) is not a CA certificate", caPath, i+1, c.Subject.CommonName)
		}
		if c.NotAfter.After(latest) {
			latest = c.NotAfter
		}
		pool.AddCert(c)
	}
	if now.After(latest) {
		return nil, fmt.Errorf("%s: every CA certificate has expired (the last at %s)", caPath, latest.UTC().Format(time.RFC3339))
	}
	chain, err := readCerts(certPath)
	if err != nil {
		return nil, err
	}
	leaf := chain[0]
	key, err := readKey(keyPath)
	if err != nil {
		return nil, err
	}
	if !sameKey(leaf, key) {
		return nil, fmt.Errorf("%s does not belong to %s: their public keys differ", keyPath, certPath)
	}
	if err := checkValidity(certPath, leaf, now); err != nil {
		return nil, err
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	for _, use := range []struct {
		eku  x509.ExtKeyUsage
		what string
	}{{x509.ExtKeyUsageServerAuth, "TLS server (both planes)"}, {x509.ExtKeyUsageClientAuth, "TLS client (the peer plane is mutual TLS)"}} {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{use.eku}})
		if err != nil {
			return nil, verifyError(certPath, caPath, use.what, "create-node", err)
		}
	}
	member, err := auth.MemberFromCert(leaf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certPath, err)
	}
	ders := make([][]byte, len(chain))
	for i, c := range chain {
		ders[i] = c.Raw
	}
	m := &material{stamps: st, cas: cas, pool: pool, leaf: leaf, member: member,
		node: tls.Certificate{Certificate: ders, PrivateKey: key, Leaf: leaf}}
	m.clientPlane = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
		Certificates: []tls.Certificate{m.node},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    pool,
		Time:         s.opts.Now,
	}
	m.peerServer = &tls.Config{
		MinVersion:   tls.VersionTLS13,
		NextProtos:   []string{"h2"},
		Certificates: []tls.Certificate{m.node},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    pool,
		Time:         s.opts.Now,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if _, err := auth.MemberFromState(&cs); err != nil {
				return fmt.Errorf("peer plane: %w", err)
			}
			return nil
		},
	}
	return m, nil
}

func checkValidity(path string, c *x509.Certificate, now time.Time) error {
	if now.After(c.NotAfter) {
		return fmt.Errorf("%s: expired at %s (now %s); issue a new one with `tidal-server certs create-...`",
			path, c.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	if now.Before(c.NotBefore) {
		return fmt.Errorf("%s: not valid before %s (now %s); check this machine's clock",
			path, c.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return nil
}

func verifyError(certPath, caPath, use, command string, err error) error {
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) {
		return fmt.Errorf("%s: not signed by any CA in %s", certPath, caPath)
	}
	var invalid x509.CertificateInvalidError
	if errors.As(err, &invalid) && invalid.Reason == x509.IncompatibleUsage {
		return fmt.Errorf("%s: not usable as a %s; issue it with `tidal-server certs %s`", certPath, use, command)
	}
	return fmt.Errorf("%s: does not verify against %s: %w", certPath, caPath, err)
}

// ServerTLS is the client plane's server configuration: TLS 1.2 or later,
// ALPN h2 and http/1.1, a client certificate optional but verified against
// ca.crt when given (auth.Handler reads its identity). Serve it with
// http.Server.ServeTLS(ln, "", "").
func (s *Store) ServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return &s.current().node, nil
		},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.current().clientPlane, nil
		},
	}
}

// VerifyClient verifies a client certificate chain (the leaf first, as a
// TLS client presents it) as the client plane's handshake would now: with
// the CA bundle in use (reloaded when the files changed) and the current
// time, for client authentication. It is how a connection authenticated
// before a reload is judged again (the ingest stream's Recheck).
func (s *Store) VerifyClient(chain []*x509.Certificate) error {
	if len(chain) == 0 {
		return errors.New("no certificate presented")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: s.current().pool, Intermediates: inter, CurrentTime: s.now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	var unknown x509.UnknownAuthorityError
	if errors.As(err, &unknown) {
		return errors.New("certificate not signed by any CA in ca.crt")
	}
	return err
}

// PeerServerTLS is the peer plane's server configuration: TLS 1.3, ALPN
// h2 (gRPC), a client certificate required, verified against ca.crt and
// naming a member (auth.MemberFromState reads which one). Whether that
// member may send a given message is the transport's decision.
func (s *Store) PeerServerTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		ClientAuth: tls.RequireAndVerifyClientCert,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.current().peerServer, nil
		},
	}
}

// PeerClientTLS is the peer plane's client configuration for dialing
// member expect (0: any member): it presents node.crt and accepts the
// server only with a certificate signed by a CA in ca.crt that names
// member expect. Peers are identified by member id, not host name: their
// addresses are rewritten (--peer-dial) and relayed, and the id is what
// raft trusts; so the standard host name check is replaced by this one.
func (s *Store) PeerClientTLS(expect uint64) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		Time:       s.opts.Now,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &s.current().node, nil
		},
		// Verification is not skipped: VerifyConnection verifies the
		// chain against ca.crt (on resumed sessions too) and the member.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			got, err := verifyMember(cs.PeerCertificates, s.current().pool, s.now())
			if err != nil {
				return fmt.Errorf("peer plane: server %s: %w", cs.ServerName, err)
			}
			if expect != 0 && got != expect {
				return fmt.Errorf("peer plane: server %s presented the certificate of member %d, expected member %d", cs.ServerName, got, expect)
			}
			return nil
		},
	}
}

// verifyMember verifies a peer's certificate chain as a TLS server
// against pool and returns the member it names.
func verifyMember(chain []*x509.Certificate, pool *x509.CertPool, now time.Time) (uint64, error) {
	if len(chain) == 0 {
		return 0, errors.New("no certificate presented")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	verified, err := chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		var unknown x509.UnknownAuthorityError
		if errors.As(err, &unknown) {
			return 0, errors.New("certificate not signed by any CA in ca.crt")
		}
		return 0, err
	}
	return auth.MemberFromCert(verified[0][0])
}
