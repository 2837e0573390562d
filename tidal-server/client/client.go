// Package client is the Go client for the tidal-server HTTP API and its
// gRPC ingest stream (IngestStream, stream.go), used by the tests, the
// chaos harness and the load generators.
//
// It deliberately imports no other tidal package but shard: the wire
// structs here are the contract as a client sees it, so a server-side
// refactor that changes the JSON breaks these tests instead of silently
// moving both sides. Package shard is the exception because it is the
// routing function itself — the slot hash is part of the data format,
// and a client that hashed with a copy of it would be a second
// definition of where an entity lives — and it is pure (no I/O, no
// server state).
//
// Shards. Against a cluster with more than one raft group the client
// caches the shard map and sends each group's share of a batch straight
// to that group's leader (shards.go). Against a single group it sends
// exactly today's requests, and no more.
//
// Retries. A call is retried after a 503 (refused before proposing), a 504
// (outcome unknown), a connection error or a per-attempt timeout, with
// exponential backoff and jitter, waiting at least the server's
// Retry-After. Every retry resends the same bytes, so a write carries the
// same event ids and the server recognises it (Ack.Duplicates). A 4xx is
// never retried: the same request would fail the same way. No wait extends
// past the caller's context deadline: when the next attempt could not
// start in time the last error is returned at once.
//
// Failed calls return a *RequestError, which wraps the last attempt's error
// (an *APIError for HTTP errors) and says whether any attempt may have been
// applied (RequestError.Indefinite) — what a history checker needs to file a
// failed write as "fail" or "info".
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/tidal-server/shard"
)

const (
	defaultRetries    = 2 // three attempts in all
	defaultBackoff    = 50 * time.Millisecond
	defaultMaxBackoff = time.Second
	defaultTimeout    = 5 * time.Second

	// maxErrorBody bounds how much of an error response is read: the JSON
	// error is small, anything longer is a proxy's HTML page or garbage.
	maxErrorBody = 64 << 10
	// maxResponse bounds a decoded JSON answer (an entity with a 1536-wide
	// embedding is ~20 KiB); it stops a broken server from exhausting the
	// caller's memory.
	maxResponse = 64 << 20
)

// Client talks to one tidal-server node. It is safe for concurrent use and
// keeps connections alive between calls.
type Client struct {
	base       string
	tls        *tls.Config // nil: plain HTTP
	token      string      // "": no Authorization header
	hc         *http.Client
	transport  *http.Transport // nil when the caller supplied the http.Client
	retries    int
	backoff    time.Duration
	maxBackoff time.Duration
	timeout    time.Duration
	binaryVec  bool // vectors as application/octet-stream (WithBinaryVectors)
	// routes is the shard-map cache: empty until a node announces a map
	// with more than one group (shards.go).
	routes routes
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send through hc instead of its own tuned
// transport. The per-attempt timeout still applies; hc.Timeout, if set,
// bounds each attempt too.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.hc, c.transport = hc, nil }
}

// WithBinaryVectors sends embedding puts and nearest queries as raw
// little-endian float32s (application/octet-stream, the write id and k in
// the query) instead of JSON: cheaper for both ends at high dimensions.
// The server accepts both; servers without the binary encoding answer 415.
func WithBinaryVectors() Option {
	return func(c *Client) { c.binaryVec = true }
}

// WithRetries sets how many times a failed attempt is retried (0: never);
// the default is 2, three attempts in all.
func WithRetries(n int) Option {
	return func(c *Client) { c.retries = max(n, 0) }
}

// WithBackoff sets the wait before the first retry (base) and the cap on
// later ones (max); each retry doubles the wait, then picks uniformly in
// its upper half so that clients retrying together spread out.
func WithBackoff(base, max time.Duration) Option {
	return func(c *Client) { c.backoff, c.maxBackoff = base, max }
}

// WithTimeout bounds each attempt (0: no bound beyond the context). For
// streaming calls (AuditEvents, Backup) it bounds the wait for the response
// headers only, so a long stream is not cut off.
func WithTimeout(perAttempt time.Duration) Option {
	return func(c *Client) { c.timeout = perAttempt }
}

// WithTLS makes the client speak HTTPS with cfg: the CAs it trusts and,
// optionally, a client certificate (certs.ClientTLS builds one from a
// certs directory). HTTP/2 is used when the node offers it (ALPN), as
// tidal-server does. An address given without a scheme gets https://.
func WithTLS(cfg *tls.Config) Option {
	return func(c *Client) { c.tls = cfg }
}

// WithToken sends "Authorization: Bearer secret" with every request. A
// token crosses the network in clear unless the client also uses TLS.
func WithToken(secret string) Option {
	return func(c *Client) { c.token = secret }
}

// New returns a client for the node at addr, "127.0.0.1:7070",
// "http://127.0.0.1:7070" or "https://127.0.0.1:7070".
func New(addr string, opts ...Option) *Client {
	t := &http.Transport{
		// No proxy from the environment: tidal traffic is node-local or
		// cluster-internal, and a stray HTTP_PROXY would reroute a test.
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		// Load generators run hundreds of concurrent requests against one
		// node; every connection they return must stay reusable.
		MaxIdleConns:        0, // no global cap
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		// Local traffic: compressing costs CPU and saves nothing.
		DisableCompression: true,
	}
	c := &Client{
		hc:         &http.Client{Transport: t},
		transport:  t,
		retries:    defaultRetries,
		backoff:    defaultBackoff,
		maxBackoff: defaultMaxBackoff,
		timeout:    defaultTimeout,
	}
	for _, o := range opts {
		o(c)
	}
	c.base = strings.TrimRight(addr, "/")
	if !strings.Contains(c.base, "://") {
		scheme := "http://"
		if c.tls != nil {
			scheme = "https://"
		}
		c.base = scheme + c.base
	}
	if c.tls != nil && c.transport != nil {
		c.transport.TLSClientConfig = c.tls.Clone()
		// A custom TLS configuration turns net/http's automatic HTTP/2
		// off; the node offers h2 by ALPN, so ask for it.
		c.transport.ForceAttemptHTTP2 = true
		c.transport.HTTP2 = &http.HTTP2Config{
			// One HTTP/2 connection carries many requests: a connection
			// that went silent (a paused node, a blackholed link) must be
			// noticed and replaced, not waited on by each of them.
			SendPingTimeout: 10 * time.Second,
			PingTimeout:     5 * time.Second,
		}
	}
	return c
}

// Addr returns the base URL the client sends to.
func (c *Client) Addr() string { return c.base }

// CloseIdleConnections closes the keep-alive connections the client holds
// open. The client stays usable.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// request describes one API call; its body is encoded once and resent
// byte for byte on every attempt.
type request struct {
	// base is the node the request goes to ("": the client's own, c.base);
	// a routed request names its group's leader (shards.go).
	base   string
	header http.Header // extra headers: the route of a routed request
	method string
	path   string
	query  url.Values
	body   []byte // nil: no body
	ctype  string // body's Content-Type; "" means application/json
	// probe calls (healthz, readyz) report the node's state as it is; a
	// retry would only delay the answer.
	probe bool
	// stream calls hand the open body to the caller; the per-attempt
	// timeout stops once the headers are in.
	stream bool
}

func (r *request) op() string { return r.method + " " + r.path }

// jsonRequest encodes v as the body of a request.
func jsonRequest(method, path string, v any) (*request, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("tidal: %s %s: encoding request: %w", method, path, err)
	}
	return &request{method: method, path: path, body: body}, nil
}

// do runs r with retries. handle is called with each 2xx response and its
// error is final; do closes the body afterwards. It returns the number of
// attempts made.
func (c *Client) do(ctx context.Context, r *request, handle func(*http.Response) error) (int, error) {
	var (
		attempts   int
		indefinite bool
		last       error
	)
	fail := func(err error) (int, error) {
		return attempts, &RequestError{Op: r.op(), Attempts: attempts, Indefinite: indefinite, Err: err}
	}
	for {
		if err := ctx.Err(); err != nil {
			if last != nil {
				return fail(last)
			}
			return fail(err)
		}
		attempts++
		retry, maybeApplied, err := c.attempt(ctx, r, handle)
		indefinite = indefinite || maybeApplied
		if err == nil {
			return attempts, nil
		}
		last = err
		if !retry || r.probe || attempts > c.retries || ctx.Err() != nil {
			return fail(err)
		}
		if !c.pauseBeforeRetry(ctx, attempts, err) {
			return fail(err)
		}
	}
}

// pauseBeforeRetry waits out the backoff before retry number attempts
// (1-based), or the server's Retry-After when err carries a longer one. It
// returns false, at once, when ctx's deadline falls before the retry, or
// when ctx ends while it waits.
func (c *Client) pauseBeforeRetry(ctx context.Context, attempts int, err error) bool {
	wait := c.wait(attempts)
	if ae := apiError(err); ae != nil && ae.RetryAfter > wait {
		wait = ae.RetryAfter
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// wait returns the backoff before retry number n (1-based).
func (c *Client) wait(n int) time.Duration {
	d := c.backoff
	for i := 1; i < n && d < c.maxBackoff; i++ {
		d *= 2
	}
	d = min(d, c.maxBackoff)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// attempt sends r once. retry says whether another attempt may succeed;
// maybeApplied whether this one may have changed the server's state.
func (c *Client) attempt(ctx context.Context, r *request, handle func(*http.Response) error) (retry, maybeApplied bool, err error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var timer *time.Timer
	if c.timeout > 0 {
		timer = time.AfterFunc(c.timeout, func() { cancel(errAttemptTimeout) })
		defer timer.Stop()
	}
	// timedOut wraps err with the attempt timeout when that is what cut it
	// short, so IsTimeout sees it.
	timedOut := func(err error) error {
		if context.Cause(actx) == errAttemptTimeout && ctx.Err() == nil {
			return fmt.Errorf("%w after %s: %w", errAttemptTimeout, c.timeout, err)
		}
		return err
	}

	base := r.base
	if base == "" {
		base = c.base
	}
	u := base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(actx, r.method, u, body)
	if err != nil {
		return false, false, fmt.Errorf("building request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "tidal-client/1")
	for k, v := range r.header {
		req.Header[k] = v
	}
	if deadline, ok := ctx.Deadline(); ok {
		// The caller's deadline, for the node to bound the hop it forwards
		// a batch's parts over (docs/ARCHITECTURE.md "Shards").
		req.Header.Set(headerTimeout, strconv.FormatInt(max(time.Until(deadline).Milliseconds(), 1), 10))
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if r.body != nil {
		ctype := r.ctype
		if ctype == "" {
			ctype = "application/json"
		}
		req.Header.Set("Content-Type", ctype)
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(r.body)), nil }
		// Deliberately NOT marked idempotent (no Idempotency-Key): net/http
		// would then resend on a new connection after a reused one failed
		// mid-request, and if that resend is refused the error looks like
		// "never sent" while the first copy may have been applied. That
		// misclassification showed up as failed-but-applied writes across
		// kill -9. Without the mark net/http retries only requests it
		// never wrote, and every other retry is ours and accounted for.
	}

	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			// The caller gave up; whatever was sent may have landed.
			return false, true, err
		}
		if terr := c.tlsProblem(err); terr != nil {
			// A handshake that failed delivered nothing, and the same
			// handshake would fail again.
			return false, false, terr
		}
		return true, !neverSent(err), timedOut(err)
	}
	defer func() {
		// Drain a little so the connection goes back to the pool.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
	}()

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		ae := decodeError(r.op(), resp)
		if resp.StatusCode == http.StatusBadRequest && resp.Request.URL.Scheme == "http" && ae.Message == plainHTTPToTLS {
			ae.Code = CodeTLSRequired
			ae.Message = fmt.Sprintf("the node at %s serves HTTPS (it was started with --certs-dir), and this client speaks plain HTTP: "+
				"give the client TLS (client.WithTLS; tidal-server commands and tidal-stress: --certs-dir)", c.base)
		}
		switch {
		case resp.StatusCode == http.StatusServiceUnavailable:
			return true, false, ae
		case resp.StatusCode == http.StatusGatewayTimeout:
			return true, true, ae
		case resp.StatusCode >= 500:
			return false, true, ae
		default:
			return false, false, ae
		}
	}
	if r.stream && timer != nil {
		timer.Stop()
	}
	if err := handle(resp); err != nil {
		// The server answered 2xx, so a write took effect whatever went
		// wrong reading the answer; a plain read can simply be asked again.
		read := r.method == http.MethodGet
		return read && !r.stream, !read, timedOut(err)
	}
	return false, false, nil
}

// neverSent reports whether a transport error happened before the request
// could reach the server: the connection was refused or never dialled.
func neverSent(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// wireError is the server's error body.
type wireError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"`
	} `json:"error"`
}

func decodeError(op string, resp *http.Response) *APIError {
	ae := &APIError{Op: op, Status: resp.StatusCode, RetryAfter: retryAfter(resp.Header.Get("Retry-After"))}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if resp.StatusCode == misdirected {
		// A routing answer: keep the fix it carries (a map, a leader
		// hint). A body that is not one stays a plain 421 error.
		if rerr, derr := shard.DecodeRouteError(raw); derr == nil {
			ae.route = rerr
		}
	}
	var we wireError
	if json.Unmarshal(raw, &we) == nil && we.Error.Code != "" {
		ae.Code, ae.Message, ae.Field = we.Error.Code, we.Error.Message, we.Error.Field
		return ae
	}
	// Not our JSON (a proxy, a panic page): keep what helps a human.
	ae.Code = codeForStatus(resp.StatusCode)
	ae.Message = strings.TrimSpace(string(raw))
	if len(ae.Message) > 200 {
		ae.Message = ae.Message[:200] + "..."
	}
	if ae.Message == "" {
		ae.Message = http.StatusText(resp.StatusCode)
	}
	return ae
}

func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeInvalidArgument
	case http.StatusUnauthorized:
		return CodeUnauthenticated
	case http.StatusForbidden:
		return CodePermissionDenied
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeConflict
	case http.StatusRequestEntityTooLarge:
		return CodeTooLarge
	case http.StatusUnsupportedMediaType:
		return CodeUnsupportedMediaType
	case http.StatusServiceUnavailable:
		return CodeUnavailable
	case http.StatusGatewayTimeout:
		return CodeTimeout
	}
	return CodeInternal
}

// retryAfter parses a Retry-After header: delay-seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// decodeJSON decodes a bounded response body into v.
func decodeJSON(resp *http.Response, v any) error {
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxResponse))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding %d response: %w", resp.StatusCode, err)
	}
	return nil
}
