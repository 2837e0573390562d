package auth_test

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

// cluster is a node's client plane served for real: TLS from a certs
// directory, HTTP/2, auth.Handler in front of a handler that records
// what reached it.
type cluster struct {
	dir     string
	caKey   string
	url     string
	mu      sync.Mutex
	reached []reached
}

type reached struct {
	method, path string
	proto        int
	principal    auth.Principal
	hasPrincipal bool
}

const (
	readerSecret = "reader-secret-0123456789abcdef"
	writerSecret = "writer-secret-0123456789abcdef"
	adminSecret  = "admin-secret-0123456789abcdef"
)

func startCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{dir: t.TempDir()}
	c.caKey = filepath.Join(t.TempDir(), "ca.key")
	o := certs.CreateOptions{CertsDir: c.dir, CAKey: c.caKey}
	if _, err := certs.CreateCA(o); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateNode(o, 1, []string{"localhost", "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range auth.Roles {
		if _, err := certs.CreateClient(o, "cert-"+r.String(), r); err != nil {
			t.Fatal(err)
		}
	}
	tokensPath := filepath.Join(c.dir, "tokens")
	file := "# test tokens\n" +
		"tok-reader reader " + auth.HashSecret(readerSecret) + "\n" +
		"tok-writer writer " + auth.HashSecret(writerSecret) + "\n" +
		"tok-admin admin " + auth.HashSecret(adminSecret) + "\n"
	if err := os.WriteFile(tokensPath, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := auth.LoadTokens(tokensPath)
	if err != nil {
		t.Fatal(err)
	}
	store, err := certs.Load(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	policy, err := auth.NewPolicy(auth.DefaultRules(true))
	if err != nil {
		t.Fatal(err)
	}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := auth.PrincipalFrom(r.Context())
		c.mu.Lock()
		c.reached = append(c.reached, reached{r.Method, r.URL.Path, r.ProtoMajor, p, ok})
		c.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: auth.Handler(api, auth.Options{Policy: policy, Tokens: tokens}), TLSConfig: store.ServerTLS(),
		ReadHeaderTimeout: time.Minute}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("ServeTLS: %v", err)
		}
	})
	c.url = "https://" + ln.Addr().String()
	return c
}

// client returns an HTTP/2 client presenting client.NAME.crt ("" for
// none).
func (c *cluster) client(t *testing.T, name string) *http.Client {
	t.Helper()
	cfg, err := certs.ClientTLS(c.dir, name)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

func (c *cluster) last() (reached, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.reached) == 0 {
		return reached{}, 0
	}
	return c.reached[len(c.reached)-1], len(c.reached)
}

type errorBody struct {
	Error *struct {
		Code    string  `json:"code"`
		Message string  `json:"message"`
		Field   *string `json:"field"`
	} `json:"error"`
}

// The 401/403 matrix: every route of the API, every role, by client
// certificate and by bearer token, over TLS with HTTP/2.
func TestHandlerMatrixOverTLSAndHTTP2(t *testing.T) {
	c := startCluster(t)
	type credential struct {
		name   string
		client *http.Client
		token  string
		role   auth.Role // 0: no valid credentials (expect 401)
		who    string
		via    auth.Via
	}
	anon := c.client(t, "")
	creds := []credential{{name: "none", client: anon}}
	for _, r := range auth.Roles {
		creds = append(creds, credential{name: "cert " + r.String(), client: c.client(t, "cert-"+r.String()), role: r, who: "cert-" + r.String(), via: auth.ViaCert})
	}
	for r, secret := range map[auth.Role]string{auth.Reader: readerSecret, auth.Writer: writerSecret, auth.Admin: adminSecret} {
		creds = append(creds, credential{name: "token " + r.String(), client: anon, token: secret, role: r, who: "tok-" + r.String(), via: auth.ViaToken})
	}
	creds = append(creds,
		credential{name: "unknown token", client: anon, token: "not-a-token-0123456789abcdef"},
		// A bad token is refused even beside a good admin certificate:
		// the token is what the caller asked to be judged by.
		credential{name: "bad token with admin cert", client: c.client(t, "cert-admin"), token: "not-a-token-0123456789abcdef"},
		// A token wins over a certificate (as in etcd).
		credential{name: "reader token with admin cert", client: c.client(t, "cert-admin"), token: readerSecret, role: auth.Reader, who: "tok-reader", via: auth.ViaToken},
	)
	routes := []struct {
		method, path string
		need         auth.Role // 0 = open
	}{
		{"GET", "/healthz", 0}, {"GET", "/readyz", 0}, {"GET", "/metrics", 0},
		{"GET", "/v1/entities/1", auth.Reader}, {"POST", "/v1/query/nearest", auth.Reader},
		{"GET", "/v1/top", auth.Reader}, {"GET", "/v1/events/e1", auth.Reader},
		{"GET", "/v1/audit/events", auth.Reader}, {"GET", "/v1/audit/digest", auth.Reader},
		{"GET", "/cluster/status", auth.Reader},
		{"POST", "/v1/signals", auth.Writer}, {"PUT", "/v1/entities/1/embedding", auth.Writer},
		{"POST", "/admin/members", auth.Admin}, {"DELETE", "/admin/members/4", auth.Admin},
		{"POST", "/admin/transfer-leader", auth.Admin}, {"POST", "/admin/snapshot", auth.Admin},
		{"GET", "/admin/backup", auth.Admin},
		{"GET", "/not-a-route", auth.Admin},
	}
	for _, route := range routes {
		for _, cred := range creds {
			want := http.StatusNoContent
			switch {
			case route.need == 0:
			case cred.role == 0:
				want = http.StatusUnauthorized
			case !cred.role.Allows(route.need):
				want = http.StatusForbidden
			}
			req, err := http.NewRequest(route.method, c.url+route.path, strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			if cred.token != "" {
				req.Header.Set("Authorization", "Bearer "+cred.token)
			}
			_, before := c.last()
			resp, err := cred.client.Do(req)
			if err != nil {
				t.Fatalf("%s %s as %s: %v", route.method, route.path, cred.name, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			what := route.method + " " + route.path + " as " + cred.name
			if resp.ProtoMajor != 2 {
				t.Fatalf("%s: answered over HTTP/%d; expected HTTP/2", what, resp.ProtoMajor)
			}
			if resp.StatusCode != want {
				t.Errorf("%s: %d %s; expected %d", what, resp.StatusCode, body, want)
				continue
			}
			got, after := c.last()
			if want != http.StatusNoContent {
				if after != before {
					t.Errorf("%s: refused with %d but the request reached the API", what, want)
				}
				checkErrorBody(t, what, resp, body, want)
				continue
			}
			if after != before+1 || got.method != route.method || got.path != route.path {
				t.Errorf("%s: 204 but the API saw %+v", what, got)
				continue
			}
			if got.proto != 2 {
				t.Errorf("%s: the API saw r.ProtoMajor %d; expected 2", what, got.proto)
			}
			if route.need == 0 {
				continue
			}
			if !got.hasPrincipal || got.principal.Name != cred.who || got.principal.Role != cred.role || got.principal.Via != cred.via {
				t.Errorf("%s: principal %+v (present %v); expected %s %s via %s", what, got.principal, got.hasPrincipal, cred.who, cred.role, cred.via)
			}
		}
	}
}

func checkErrorBody(t *testing.T, what string, resp *http.Response, body []byte, status int) {
	t.Helper()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q; expected application/json", what, ct)
	}
	var eb errorBody
	if err := json.Unmarshal(body, &eb); err != nil || eb.Error == nil || eb.Error.Field == nil {
		t.Errorf("%s: body %s; expected {\"error\":{\"code\",\"message\",\"field\"}}", what, body)
		return
	}
	wantCode := auth.CodeUnauthenticated
	if status == http.StatusForbidden {
		wantCode = auth.CodePermissionDenied
	}
	if eb.Error.Code != wantCode || eb.Error.Message == "" {
		t.Errorf("%s: error %+v; expected code %s with a message", what, eb.Error, wantCode)
	}
	challenge := resp.Header.Get("WWW-Authenticate")
	if status == http.StatusUnauthorized && !strings.HasPrefix(challenge, `Bearer realm="tidal"`) {
		t.Errorf("%s: WWW-Authenticate %q; expected a Bearer challenge", what, challenge)
	}
}

// A member's node certificate is for the peer plane: on the client plane
// it names no client.
func TestHandlerRefusesANodeCertificateAsAClient(t *testing.T) {
	c := startCluster(t)
	cfg, err := certs.ClientTLS(c.dir, "")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(c.dir, certs.NodeCertFile), filepath.Join(c.dir, certs.NodeKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Certificates = []tls.Certificate{pair}
	tr := &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(c.url + "/v1/top")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(body), "expected a client identity") {
		t.Errorf("GET /v1/top with node.crt: %d %s; expected 401 naming the wrong identity", resp.StatusCode, body)
	}
}

func TestHandlerRefusesMalformedAuthorization(t *testing.T) {
	c := startCluster(t)
	hc := c.client(t, "")
	for _, h := range [][]string{
		{"Basic dXNlcjpwYXNz"},
		{"Bearer"},
		{"Bearer "},
		{readerSecret},
		{"Bearer " + readerSecret, "Bearer " + adminSecret},
	} {
		req, _ := http.NewRequest("GET", c.url+"/v1/top", nil)
		req.Header["Authorization"] = h
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), `error="invalid_token"`) {
			t.Errorf("Authorization %q: %d %s (WWW-Authenticate %q); expected 401 invalid_token", h, resp.StatusCode, body, resp.Header.Get("WWW-Authenticate"))
		}
	}
	// The scheme is case-insensitive (RFC 7235).
	req, _ := http.NewRequest("GET", c.url+"/v1/top", nil)
	req.Header.Set("Authorization", "bearer "+readerSecret)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("Authorization: bearer (lower case): %d; expected 204", resp.StatusCode)
	}
}

func TestHandlerWithoutTokensRefusesBearer(t *testing.T) {
	policy, err := auth.NewPolicy(auth.DefaultRules(true))
	if err != nil {
		t.Fatal(err)
	}
	h := auth.Handler(http.NotFoundHandler(), auth.Options{Policy: policy})
	req, _ := http.NewRequest("GET", "/v1/top", nil)
	req.Header.Set("Authorization", "Bearer "+readerSecret)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "no --tokens file") {
		t.Errorf("bearer token with no tokens file: %d %s; expected 401 saying tokens are off", rec.Code, rec.Body.String())
	}
}
