package lifecycle

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// securedNode is one tidal-server process started by hand with a certs
// directory and a tokens file made by the real CLI (`tidal-server certs
// ...`, `tokens add`), as README's "Secure cluster" does.
type securedNode struct {
	*node
	addr    string
	certs   string            // ca.crt, node.crt/key, client.{reader,writer,admin}.crt/key
	tokens  string            // the node's --tokens file
	secrets map[string]string // role -> bearer secret
}

// makeCertsDir makes a CA, a node certificate for member on 127.0.0.1,
// and a client certificate per role, with the tidal-server CLI.
func makeCertsDir(dir string, member int) {
	run := func(args ...string) {
		out, code := tidalServer(args...)
		Expect(code).To(Equal(0), "tidal-server %s:\n%s", strings.Join(args, " "), out)
	}
	run("certs", "create-ca", "--certs-dir", dir)
	run("certs", "create-node", "--certs-dir", dir, "--id", fmt.Sprint(member), "--host", "127.0.0.1,localhost")
	for _, r := range auth.Roles {
		run("certs", "create-client", r.String(), "--role", r.String(), "--certs-dir", dir)
	}
}

// addToken appends a token for role to file with `tokens add` and returns
// the secret it printed.
func addToken(file, name, role string) string {
	cmd := []string{"tokens", "add", name, "--role", role, "--file", file}
	out, err := execCommand(bins.TidalServer, cmd...)
	Expect(err).NotTo(HaveOccurred(), "tidal-server %s: %s", strings.Join(cmd, " "), out)
	return strings.TrimSpace(out)
}

// execCommand runs bin to completion and returns its standard output
// (with standard error appended when it fails).
func execCommand(bin string, args ...string) (string, error) {
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

func startSecuredNode(name string, extra ...string) *securedNode {
	dir := specDir(name)
	s := &securedNode{certs: filepath.Join(dir, "certs"), tokens: filepath.Join(dir, "tokens"), secrets: map[string]string{}}
	makeCertsDir(s.certs, 1)
	for _, r := range auth.Roles {
		s.secrets[r.String()] = addToken(s.tokens, "tok-"+r.String(), r.String())
	}
	addrs := freeAddrs(2)
	s.addr = addrs[0]
	args := runArgs(1, addrs[0], addrs[1], filepath.Join(dir, "data"), append([]string{"--certs-dir", s.certs, "--tokens", s.tokens}, extra...)...)
	s.node = startNode(-1, args...)
	// Ready: /readyz is open, but over TLS.
	c := client.New(s.addr, client.WithTLS(s.tls("")), client.WithRetries(0), client.WithTimeout(2*time.Second))
	Eventually(func() error {
		select {
		case <-s.exited:
			return StopTrying(fmt.Sprintf("tidal-server exited (%v) before it was ready; output:\n%s", s.err, s.out))
		default:
		}
		return c.Ready(context.Background())
	}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	return s
}

// tls is a client configuration trusting the node's CA and presenting
// client.NAME.crt ("" for none).
func (s *securedNode) tls(name string) *tls.Config {
	cfg, err := certs.ClientTLS(s.certs, name)
	Expect(err).NotTo(HaveOccurred())
	return cfg
}

// credential is one way a client may present itself.
type credential struct {
	name  string
	cert  string // client certificate name, "" for none
	token string // bearer secret, "" for none
	role  auth.Role
}

func (s *securedNode) httpClient(cert string) *http.Client {
	tr := &http.Transport{TLSClientConfig: s.tls(cert), ForceAttemptHTTP2: true}
	DeferCleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// do sends one request as cred and returns the response with its body read.
func (s *securedNode) do(hc *http.Client, token, method, path, body string) (*http.Response, []byte) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "https://"+s.addr+path, rd)
	Expect(err).NotTo(HaveOccurred())
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	Expect(err).NotTo(HaveOccurred(), "%s %s", method, path)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred(), "%s %s: reading the body", method, path)
	return resp, data
}

// errorCode is the code of an API error body ("" if it is not one).
func errorCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(body, &e)
	return e.Error.Code
}

// routeRequests are concrete requests for each pattern of the policy. A
// pattern the policy gains without a request here fails the matrix spec,
// so the matrix always covers every route. Bodies are empty or invalid
// where a valid one would change the cluster: the answer past
// authorization is then a 400 or 404 from the API, never 401 or 403.
var routeRequests = map[string][][3]string{
	"GET /healthz":                        {{"GET", "/healthz", ""}},
	"GET /readyz":                         {{"GET", "/readyz", ""}},
	"GET /metrics":                        {{"GET", "/metrics", ""}},
	"GET /v1/entities/{entity}":           {{"GET", "/v1/entities/1?consistency=local", ""}},
	"POST /v1/query/nearest":              {{"POST", "/v1/query/nearest", `{}`}},
	"GET /v1/top":                         {{"GET", "/v1/top?signal=view&window=1h&k=1", ""}},
	"GET /v1/events/{id...}":              {{"GET", "/v1/events/no-such-id", ""}},
	"GET /v1/audit/events":                {{"GET", "/v1/audit/events", ""}},
	"GET /v1/audit/digest":                {{"GET", "/v1/audit/digest", ""}},
	"GET /cluster/status":                 {{"GET", "/cluster/status", ""}},
	"POST /v1/signals":                    {{"POST", "/v1/signals", `{"events":[]}`}},
	"PUT /v1/entities/{entity}/embedding": {{"PUT", "/v1/entities/1/embedding", `{}`}},
	"/admin/": {{"POST", "/admin/members", `{}`}, {"DELETE", "/admin/members/0", ""}, {"POST", "/admin/transfer-leader", `{}`},
		{"POST", "/admin/snapshot", ""}, {"GET", "/admin/backup", ""}},
	// Not in the policy: a route nobody listed needs admin (fail closed).
	"": {{"GET", "/no/such/route", ""}},
}

var _ = Describe("a node with --certs-dir and --tokens", Label("lifecycle"), func() {
	// The 401/403 matrix, every route of the policy
	// against every role, by certificate and by token, on a real node.
	It("answers every route 401 without credentials, 403 below its role, and serves it at or above, over HTTP/2", func() {
		s := startSecuredNode("authz-matrix")
		creds := []credential{{name: "no credentials"}}
		for _, r := range auth.Roles {
			creds = append(creds,
				credential{name: r.String() + " certificate", cert: r.String(), role: r},
				credential{name: r.String() + " token", token: s.secrets[r.String()], role: r})
		}
		creds = append(creds, credential{name: "unknown token (beside an admin certificate)", cert: "admin", token: "not-a-token-0123456789"})
		clients := map[string]*http.Client{}
		for _, c := range creds {
			if clients[c.cert] == nil {
				clients[c.cert] = s.httpClient(c.cert)
			}
		}
		rules := auth.DefaultRules(true)
		rules = append(rules, auth.Rule{Pattern: "", Role: auth.Admin})
		Expect(rules).To(HaveLen(len(routeRequests)), "routeRequests must have requests for exactly the policy's patterns")
		checked := 0
		for _, rule := range rules {
			reqs, ok := routeRequests[rule.Pattern]
			Expect(ok).To(BeTrue(), "no request for the policy's pattern %q: add one to routeRequests", rule.Pattern)
			for _, rq := range reqs {
				for _, c := range creds {
					what := fmt.Sprintf("%s %s as %s", rq[0], rq[1], c.name)
					resp, body := s.do(clients[c.cert], c.token, rq[0], rq[1], rq[2])
					Expect(resp.ProtoMajor).To(Equal(2), "%s: expected HTTP/2", what)
					switch {
					case rule.Open:
						Expect(resp.StatusCode).NotTo(BeElementOf(401, 403), "%s: an open route", what)
					case c.role == 0:
						Expect(resp.StatusCode).To(Equal(401), "%s: %s", what, body)
						Expect(errorCode(body)).To(Equal(auth.CodeUnauthenticated), what)
						Expect(resp.Header.Get("WWW-Authenticate")).To(HavePrefix("Bearer"), what)
					case !c.role.Allows(rule.Role):
						Expect(resp.StatusCode).To(Equal(403), "%s (needs %s): %s", what, rule.Role, body)
						Expect(errorCode(body)).To(Equal(auth.CodePermissionDenied), what)
					default:
						Expect(resp.StatusCode).NotTo(BeElementOf(401, 403), "%s (needs %s): %s", what, rule.Role, body)
					}
					checked++
				}
			}
		}
		GinkgoWriter.Printf("checked %d route x credential pairs\n", checked)
		s.stop()
	})

	// Writes and reads over HTTP/2, with a client
	// certificate and with a token; a 204 over HTTP/2 carries no body
	// (DESIGN.md's lesson: HTTP/2 resets a 204 that has one).
	It("takes writes and serves reads over HTTP/2 with a certificate and with a token; its 204s have no body", func() {
		s := startSecuredNode("h2-writes")
		writerCert, anon := s.httpClient("writer"), s.httpClient("")
		for i, w := range []struct {
			hc    *http.Client
			token string
		}{{writerCert, ""}, {anon, s.secrets["writer"]}} {
			id := fmt.Sprintf("h2-%d", i)
			resp, body := s.do(w.hc, w.token, "POST", "/v1/signals", fmt.Sprintf(`{"events":[{"id":%q,"entity":7,"signal":"view"}]}`, id))
			Expect(resp.StatusCode).To(Equal(http.StatusNoContent), string(body))
			Expect(resp.ProtoMajor).To(Equal(2))
			Expect(body).To(BeEmpty(), "a 204 over HTTP/2 must carry no body")
			Expect(resp.Header.Get("X-Tidal-Seq")).NotTo(BeEmpty())

			resp, body = s.do(w.hc, w.token, "GET", "/v1/events/"+id, "")
			Expect(resp.StatusCode).To(Equal(http.StatusOK), string(body))
			Expect(resp.ProtoMajor).To(Equal(2))
		}
		vec := "[" + strings.TrimSuffix(strings.Repeat("0.5,", 1536), ",") + "]"
		resp, body := s.do(anon, s.secrets["writer"], "PUT", "/v1/entities/7/embedding", `{"id":"emb-1","vector":`+vec+`}`)
		Expect(resp.StatusCode).To(Equal(http.StatusNoContent), string(body))
		Expect(resp.ProtoMajor).To(Equal(2))
		Expect(body).To(BeEmpty())

		// The Go client, as the harness and tidal-stress use it.
		c := client.New(s.addr, client.WithTLS(s.tls("reader")))
		DeferCleanup(c.CloseIdleConnections)
		e, err := c.Entity(context.Background(), 7)
		Expect(err).NotTo(HaveOccurred())
		Expect(e.Embedding).To(HaveLen(1536))
		_, err = c.WriteSignals(context.Background(), []client.Event{{ID: "as-reader", Entity: 7, Signal: "view"}})
		Expect(client.IsPermissionDenied(err)).To(BeTrue(), "a write as reader: %v", err)
		plain := client.New(s.addr, client.WithRetries(0))
		DeferCleanup(plain.CloseIdleConnections)
		_, err = plain.Status(context.Background())
		Expect(err).To(MatchError(ContainSubstring("serves HTTPS")), "a plain HTTP client must be told the node serves HTTPS")
		s.stop()
	})

	// SIGHUP re-reads the tokens file; a file that does
	// not parse is reported and the tokens in use stay.
	It("reloads its tokens on SIGHUP: a new token works, a removed one gets 401, a broken file keeps the old set", func() {
		s := startSecuredNode("token-reload")
		hc := s.httpClient("")
		status := func(token string) int {
			resp, _ := s.do(hc, token, "GET", "/cluster/status", "")
			return resp.StatusCode
		}
		old := s.secrets["reader"]
		Expect(status(old)).To(Equal(200))
		// Replace the file: the reader's token goes, a new one comes.
		Expect(os.Remove(s.tokens)).To(Succeed())
		fresh := addToken(s.tokens, "fresh", "reader")
		Expect(status(fresh)).To(Equal(401), "before SIGHUP the new token is unknown")
		Expect(s.cmd.Process.Signal(syscall.SIGHUP)).To(Succeed())
		Eventually(func() int { return status(fresh) }).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Equal(200))
		Expect(status(old)).To(Equal(401), "a removed token must be refused after SIGHUP")

		Expect(os.WriteFile(s.tokens, []byte("not a tokens line\n"), 0o600)).To(Succeed())
		Expect(s.cmd.Process.Signal(syscall.SIGHUP)).To(Succeed())
		Eventually(s.out.String).WithTimeout(30 * time.Second).Should(ContainSubstring("tokens file did not reload"))
		Expect(status(fresh)).To(Equal(200), "after a failed reload the tokens in use stay")
		s.stop()
	})
})

var _ = Describe("a node's exposure", Label("lifecycle"), func() {
	// Without --certs-dir a node binds loopback only.
	It("refuses to bind 0.0.0.0 without --certs-dir or --insecure, naming the flag, and writes nothing", func() {
		dir := specDir("no-0000")
		for _, flag := range []string{"--client-addr", "--peer-addr"} {
			addrs := freeAddrs(2)
			clientAddr, peerAddr := addrs[0], addrs[1]
			if flag == "--client-addr" {
				clientAddr = "0.0.0.0:" + strings.Split(clientAddr, ":")[1]
			} else {
				peerAddr = "0.0.0.0:" + strings.Split(peerAddr, ":")[1]
			}
			data := filepath.Join(dir, strings.TrimPrefix(flag, "--"))
			n := startNode(-1, runArgs(1, clientAddr, peerAddr, data)...)
			Expect(n.waitExit(30*time.Second)).To(Equal(1), "output:\n%s", n.out)
			Expect(n.out.String()).To(And(ContainSubstring(flag+" 0.0.0.0:"), ContainSubstring("is not a loopback address"),
				ContainSubstring("--certs-dir"), ContainSubstring("--insecure")))
			_, err := os.Stat(data)
			Expect(os.IsNotExist(err)).To(BeTrue(), "the refused node created its data dir")
		}
	})

	// Loopback development stays as easy as before, and
	// the node says it runs without authentication; --insecure is warned.
	It("serves loopback without credentials and says so; --insecure is logged as a warning", func() {
		dir := specDir("loopback-insecure")
		addrs := freeAddrs(2)
		n := startNode(-1, runArgs(1, addrs[0], addrs[1], filepath.Join(dir, "data"), "--insecure")...)
		n.waitReady(addrs[0])
		c := client.New(addrs[0], client.WithRetries(0))
		DeferCleanup(c.CloseIdleConnections)
		_, err := c.Status(context.Background())
		Expect(err).NotTo(HaveOccurred())
		Expect(n.out.String()).To(And(ContainSubstring("insecure: no authentication"), MatchRegexp(`level=WARN msg="insecure: --insecure`)))
		n.stop()
	})

	// The member id is bound to the node certificate.
	It("refuses a node certificate made for member 2 when started as --id 1, naming both", func() {
		dir := specDir("wrong-member")
		certsDir := filepath.Join(dir, "certs")
		makeCertsDir(certsDir, 2)
		addrs := freeAddrs(2)
		data := filepath.Join(dir, "data")
		n := startNode(-1, runArgs(1, addrs[0], addrs[1], data, "--certs-dir", certsDir)...)
		Expect(n.waitExit(30*time.Second)).To(Equal(1), "output:\n%s", n.out)
		Expect(n.out.String()).To(And(ContainSubstring("names member 2"), ContainSubstring("--id is 1")))
		_, err := os.Stat(data)
		Expect(os.IsNotExist(err)).To(BeTrue(), "the refused node created its data dir")
	})
})
