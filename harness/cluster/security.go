package cluster

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// Security is a secured cluster's material, made fresh for each cluster
// (DESIGN.md: the harness runs secured by default): a CA, a client
// certificate per role, a tokens file with one token per role, and per
// node a certs directory holding ca.crt and a node certificate for the
// member id in the slot.
//
//	<Dir>/ca.crt, ca.key
//	<Dir>/client.{admin,writer,reader}.crt/key
//	<Dir>/tokens          NAME ROLE sha256:HEX, one line per role
//	<Dir>/tokens.json     the secrets, {"admin": "...", ...} (0600)
//	<node>/certs/         ca.crt, node.crt, node.key, tokens (what the node reads)
type Security struct {
	Dir        string
	TokensFile string

	caKey   string
	host    string
	secrets map[string]string      // role -> secret
	tls     map[string]*tls.Config // client certificate name -> config
}

// Roles of the harness's credentials, by the name their certificate and
// token carry.
const (
	RoleAdmin  = "admin"
	RoleWriter = "writer"
	RoleReader = "reader"
)

// tokensSecretsFile keeps the secrets of the run's tokens, so a person can
// use them against a run's cluster (curl -H "Authorization: Bearer ...").
const tokensSecretsFile = "tokens.json"

// newSecurity makes the CA, client certificates and tokens in dir; node
// certificates name host (the address clients dial) and localhost.
func newSecurity(dir, host string) (*Security, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	o := certs.CreateOptions{CertsDir: dir, Overwrite: true}
	if _, err := certs.CreateCA(o); err != nil {
		return nil, fmt.Errorf("cluster: security: %w", err)
	}
	s := &Security{Dir: dir, TokensFile: filepath.Join(dir, "tokens"), caKey: filepath.Join(dir, certs.CAKeyFile), host: host,
		secrets: map[string]string{}, tls: map[string]*tls.Config{}}
	os.Remove(s.TokensFile) // a retried start makes a fresh set
	for _, r := range auth.Roles {
		name := r.String()
		if _, err := certs.CreateClient(o, name, r); err != nil {
			return nil, fmt.Errorf("cluster: security: %w", err)
		}
		cfg, err := certs.ClientTLS(dir, name)
		if err != nil {
			return nil, fmt.Errorf("cluster: security: %w", err)
		}
		s.tls[name] = cfg
		secret := auth.NewSecret()
		if _, err := auth.AppendToken(s.TokensFile, "harness-"+name, r, secret); err != nil {
			return nil, fmt.Errorf("cluster: security: %w", err)
		}
		s.secrets[name] = secret
	}
	data, err := json.MarshalIndent(s.secrets, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, tokensSecretsFile), append(data, '\n'), 0o600); err != nil {
		return nil, err
	}
	return s, nil
}

// nodeCerts writes nodeDir/certs for member id: ca.crt, the tokens file,
// and node.crt/key naming the member (replaced when the slot gets a new
// member). It returns the directory.
func (s *Security) nodeCerts(nodeDir string, id uint64) (string, error) {
	dir := filepath.Join(nodeDir, "certs")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for _, f := range []string{certs.CACertFile, "tokens"} {
		data, err := os.ReadFile(filepath.Join(s.Dir, f))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o600); err != nil {
			return "", err
		}
	}
	if st, err := certs.Load(dir); err == nil && st.Member() == id {
		return dir, nil
	}
	_, err := certs.CreateNode(certs.CreateOptions{CertsDir: dir, CAKey: s.caKey, Overwrite: true}, id, []string{s.host, "localhost"})
	if err != nil {
		return "", fmt.Errorf("cluster: node certificate for member %d: %w", id, err)
	}
	return dir, nil
}

// TLS is the client configuration presenting client.NAME.crt (admin,
// writer, reader); nil for another name.
func (s *Security) TLS(name string) *tls.Config {
	if cfg := s.tls[name]; cfg != nil {
		return cfg.Clone()
	}
	return nil
}

// Token is the secret of the run's token for role ("" for another name).
func (s *Security) Token(role string) string { return s.secrets[role] }

// Options present client.NAME.crt, or with viaToken only trust the CA
// and send the role's token.
func (s *Security) Options(name string, viaToken bool) []client.Option {
	if viaToken {
		cfg, _ := certs.ClientTLS(s.Dir, "")
		return []client.Option{client.WithTLS(cfg), client.WithToken(s.Token(name))}
	}
	return []client.Option{client.WithTLS(s.TLS(name))}
}

// CLIFlags are the flags tidal-server's admin commands (and tidal-stress)
// take to act as client NAME of this cluster.
func (s *Security) CLIFlags(name string) []string {
	return []string{"--certs-dir", s.Dir, "--cert-name", name}
}

// nodeArgs are the security flags of a node whose certs directory is dir.
func nodeArgs(dir string) []string {
	return []string{"--certs-dir", dir, "--tokens", filepath.Join(dir, "tokens")}
}

// Security is the cluster's credentials; nil when Config.Insecure.
func (c *Cluster) Security() *Security { return c.sec }

// clientOptions are the options presenting client name (admin, writer,
// reader) on a secured cluster; none on an insecure one.
func (c *Cluster) clientOptions(name string) []client.Option {
	if c.sec == nil {
		return nil
	}
	return c.sec.Options(name, false)
}

// ClientAs returns a client for name's client relay presenting role's
// certificate (or, viaToken, its token); opts come after.
func (c *Cluster) ClientAs(name, role string, viaToken bool, opts ...client.Option) *client.Client {
	var base []client.Option
	if c.sec != nil {
		base = c.sec.Options(role, viaToken)
	}
	return c.Client(name, append(base, opts...)...)
}

// AdminClientWith is a new client of name's own address (not through the
// mesh) presenting the admin's certificate on a secured cluster, with
// opts (retries, timeouts) after; unlike AdminClient it is not cached.
func (c *Cluster) AdminClientWith(name string, opts ...client.Option) *client.Client {
	c.mu.Lock()
	n, err := c.node(name)
	c.mu.Unlock()
	if err != nil {
		return client.New("127.0.0.1:1")
	}
	return client.New(n.ClientAddr, append(c.clientOptions(RoleAdmin), opts...)...)
}

// URL is the base URL of a node address: https:// on a secured cluster.
func (c *Cluster) URL(addr string) string {
	if c.sec != nil {
		return "https://" + addr
	}
	return "http://" + addr
}

// HTTPClient is a raw HTTP client acting as the admin client (certificate
// client.admin.crt on a secured cluster, HTTP/2), for what the Go client
// does not cover (a stream copied to a file as is).
func (c *Cluster) HTTPClient(timeout time.Duration) *http.Client {
	tr := &http.Transport{Proxy: nil, DisableCompression: true}
	if c.sec != nil {
		tr.TLSClientConfig = c.sec.TLS(RoleAdmin)
		tr.ForceAttemptHTTP2 = true
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}
