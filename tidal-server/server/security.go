package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

// LoadCerts loads a node's certs directory (--certs-dir) and logs each
// reload the files' change causes: the certificates now in use, or why
// the old ones were kept. The caller sets Config.Certs to the result, so
// the same store serves the client plane and the peer transport.
func LoadCerts(dir string, log *slog.Logger) (*certs.Store, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	store, err := certs.LoadWith(dir, certs.LoadOptions{OnReload: func(err error) {
		if err != nil {
			log.Error("certificates changed but do not load; the ones in use stay", "certs_dir", dir, "err", err)
			return
		}
		log.Info("certificates reloaded", "certs_dir", dir)
	}})
	if err != nil {
		return nil, fmt.Errorf("--certs-dir: %w", err)
	}
	return store, nil
}

// checkMember refuses a node certificate that names another member than
// --id: the peer plane binds the member id to the certificate, so such a
// node would be refused (or, worse, trusted) as someone else.
func checkMember(store *certs.Store, dir string, id uint64) error {
	if got := store.Member(); got != id {
		return fmt.Errorf("--certs-dir: %s names member %d, but --id is %d: give each node the node.crt made for its own id (tidal-server certs create-node --id %d)",
			filepath.Join(dir, certs.NodeCertFile), got, id, id)
	}
	return nil
}

// security is what a node's flags make of its exposure, worked out once
// before anything is bound.
type security struct {
	clientTLS bool // the client plane serves TLS (--certs-dir)
	peerTLS   bool // the peer transport serves and dials TLS
	auth      bool // every request goes through auth.Handler
	tokens    *auth.Tokens
}

func newSecurity(cfg Config) (security, error) {
	sec := security{clientTLS: cfg.Certs != nil, peerTLS: cfg.Certs != nil && cfg.PeerTLS}
	if cfg.PeerTLS && cfg.Certs == nil {
		return sec, errors.New("a peer transport with TLS needs --certs-dir")
	}
	if cfg.TokensPath != "" {
		t, err := auth.LoadTokens(cfg.TokensPath)
		if err != nil {
			return sec, fmt.Errorf("--tokens: %w", err)
		}
		sec.tokens = t
	}
	sec.auth = sec.clientTLS || sec.tokens != nil
	return sec, nil
}

// errNotLoopback says which flag would expose a plaintext listener to the
// network, and the two ways out.
func errNotLoopback(flag, addr, what string) error {
	return fmt.Errorf("%s %s is not a loopback address, and %s would serve it without TLS: "+
		"give --certs-dir DIR (make one with `tidal-server certs create-ca`, `create-node`) or, to serve plaintext to the network anyway, --insecure",
		flag, addr, what)
}

// checkLoopbackAddr refuses, before binding, a listen address that is not
// loopback when it would carry plaintext: an empty or unspecified host
// (all interfaces) or a literal non-loopback IP. Host names are checked
// after binding (checkLoopbackBound), against the address they resolved to.
func checkLoopbackAddr(flag, addr, what string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: %w", flag, addr, err)
	}
	if host == "" {
		return errNotLoopback(flag, addr, what)
	}
	if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() {
		return errNotLoopback(flag, addr, what)
	}
	return nil
}

// checkLoopbackBound refuses a bound listener whose address is not
// loopback (a host name that resolved to a routable address).
func checkLoopbackBound(flag, addr, what string, lis net.Listener) error {
	tcp, ok := lis.Addr().(*net.TCPAddr)
	if !ok || !tcp.IP.IsLoopback() {
		return errNotLoopback(flag, fmt.Sprintf("%s (bound %s)", addr, lis.Addr()), what)
	}
	return nil
}

// plaintextPlanes lists the listeners that will carry plaintext, with the
// flag that names each, for the loopback checks and the --insecure warning.
func (sec security) plaintextPlanes(cfg Config, peer bool) [][3]string {
	var out [][3]string
	if !sec.clientTLS {
		out = append(out, [3]string{"--client-addr", cfg.ClientAddr, "the client plane (API, /metrics)"})
		if cfg.GRPCAddr != "" {
			out = append(out, [3]string{"--grpc-addr", cfg.GRPCAddr, "the client plane's gRPC ingest stream"})
		}
	}
	if peer && !sec.peerTLS {
		what := "the peer plane"
		if sec.clientTLS {
			what = "the peer plane (TLS is not yet wired into the peer transport)"
		}
		out = append(out, [3]string{"--peer-addr", cfg.PeerAddr, what})
	}
	return out
}

// describe is the one log line that says how the node is exposed.
func (sec security) describe() string {
	var parts []string
	if sec.clientTLS {
		parts = append(parts, "client plane: TLS (h2, http/1.1)")
	} else {
		parts = append(parts, "client plane: plaintext")
	}
	// Both planes, so a node's log shows how it ran (the chaos suite
	// checks its runs were secured by this line).
	if sec.peerTLS {
		parts = append(parts, "peer plane: mutual TLS")
	} else {
		parts = append(parts, "peer plane: plaintext")
	}
	switch {
	case sec.auth && sec.tokens != nil && sec.clientTLS:
		parts = append(parts, fmt.Sprintf("authentication: client certificates and %d bearer tokens", sec.tokens.Len()))
	case sec.auth && sec.tokens != nil:
		parts = append(parts, fmt.Sprintf("authentication: %d bearer tokens (sent in clear: no TLS)", sec.tokens.Len()))
	case sec.auth:
		parts = append(parts, "authentication: client certificates")
	default:
		parts = append(parts, "insecure: no authentication")
	}
	return strings.Join(parts, "; ")
}

// logSecurity says once, at start, how the node is exposed: a warning for
// every plaintext listener --insecure let through, and for a peer plane
// that stays plaintext although the node has certificates.
func (s *Server) logSecurity(plaintext [][3]string) {
	if s.cfg.Insecure {
		var planes []string
		for _, p := range plaintext {
			planes = append(planes, fmt.Sprintf("%s %s (%s)", p[0], p[1], p[2]))
		}
		if len(planes) == 0 {
			planes = append(planes, "none: every plane has TLS")
		}
		s.log.Warn("insecure: --insecure lets plaintext listeners bind any address; anyone who can reach them can read and, without --tokens or --certs-dir, change the cluster",
			"plaintext", strings.Join(planes, "; "))
	}
	if s.cfg.Certs != nil && s.peerLis != nil && !s.sec.peerTLS {
		s.log.Warn("peer plane: TLS not yet wired; raft traffic between nodes is plaintext and unauthenticated (the client plane has TLS)",
			"peer_addr", s.cfg.PeerAddr)
	}
}

// Reload re-reads the tokens file and the certificates (the node does so
// on SIGHUP), then ends the open ingest streams whose credential is no
// longer good (ingest.Service.Recheck). A file that does not load is
// logged and its old contents stay in use; the error says which.
func (s *Server) Reload() error {
	var errs []error
	if t := s.sec.tokens; t != nil {
		if err := t.Reload(); err != nil {
			s.log.Error("tokens file did not reload; the tokens in use stay", "tokens", t.Path(), "err", err, "in_use", t.Len())
			errs = append(errs, fmt.Errorf("--tokens: %w", err))
		} else {
			s.log.Info("tokens file reloaded", "tokens", t.Path(), "in_use", t.Len())
		}
	}
	if c := s.cfg.Certs; c != nil {
		if err := c.Reload(); err != nil {
			s.log.Error("certificates did not reload; the ones in use stay", "certs_dir", s.cfg.CertsDir, "err", err)
			errs = append(errs, fmt.Errorf("--certs-dir: %w", err))
		} else {
			s.log.Info("certificates re-read", "certs_dir", s.cfg.CertsDir, "member", c.Member(), "not_after", c.NodeCert().NotAfter.UTC().Format(time.RFC3339))
		}
	}
	if s.ingest != nil {
		// Streams authenticated once, at open: ask again, and end those
		// whose credential the reload took away.
		s.ingest.Recheck()
	}
	return errors.Join(errs...)
}
