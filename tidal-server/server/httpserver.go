package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of the client plane's http.Server (docs/ARCHITECTURE.md,
// "Client plane: connections and timeouts").
const (
	DefaultHTTPReadHeaderTimeout = 10 * time.Second
	DefaultHTTPReadTimeout       = 30 * time.Second
	DefaultHTTPWriteTimeout      = 60 * time.Second
	DefaultHTTPIdleTimeout       = 2 * time.Minute
	DefaultHTTPStreamTimeout     = 10 * time.Minute
	DefaultMaxConns              = 4096
	DefaultHTTP2MaxStreams       = 250
)

// httpDefaults fills zero values with the defaults and checks the rest.
func httpDefaults(cfg *Config) error {
	set := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	set(&cfg.HTTPReadHeaderTimeout, DefaultHTTPReadHeaderTimeout)
	set(&cfg.HTTPReadTimeout, DefaultHTTPReadTimeout)
	set(&cfg.HTTPWriteTimeout, DefaultHTTPWriteTimeout)
	set(&cfg.HTTPIdleTimeout, DefaultHTTPIdleTimeout)
	set(&cfg.HTTPStreamTimeout, DefaultHTTPStreamTimeout)
	if cfg.MaxConns == 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.HTTP2MaxStreams == 0 {
		cfg.HTTP2MaxStreams = DefaultHTTP2MaxStreams
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--http-read-header-timeout", cfg.HTTPReadHeaderTimeout}, {"--http-read-timeout", cfg.HTTPReadTimeout},
		{"--http-write-timeout", cfg.HTTPWriteTimeout}, {"--http-idle-timeout", cfg.HTTPIdleTimeout}, {"--http-stream-timeout", cfg.HTTPStreamTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("%s: expected a positive duration, found %s", d.flag, d.v)
		}
	}
	if cfg.MaxConns < 0 {
		return fmt.Errorf("--max-conns: expected a positive number of connections, found %d", cfg.MaxConns)
	}
	if cfg.HTTPReadHeaderTimeout > cfg.HTTPReadTimeout {
		return fmt.Errorf("--http-read-header-timeout %s: expected at most --http-read-timeout %s (the whole request includes its headers)",
			cfg.HTTPReadHeaderTimeout, cfg.HTTPReadTimeout)
	}
	// A write waits up to --write-timeout for its commit and then answers
	// 504; a connection write deadline shorter than that would cut the
	// answer off (HTTP/2 resets the stream) and turn a known outcome into
	// a lost connection.
	if write := cfg.WriteTimeout; write > 0 && cfg.HTTPWriteTimeout <= write {
		return fmt.Errorf("--http-write-timeout %s: expected longer than --write-timeout %s, or the answer to a write that waited its full time could not be sent",
			cfg.HTTPWriteTimeout, write)
	}
	return nil
}

// newHTTPServer builds the client plane's http.Server. Its handler chain,
// outermost first: the connection cap's 503, per-request read and write
// deadline adjustments, then h (auth and the API).
func newHTTPServer(cfg Config, h http.Handler, log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           shedOverCap(deadlines(h, cfg.HTTPStreamTimeout)),
		ReadHeaderTimeout: cfg.HTTPReadHeaderTimeout,
		ReadTimeout:       cfg.HTTPReadTimeout,
		WriteTimeout:      cfg.HTTPWriteTimeout,
		IdleTimeout:       cfg.HTTPIdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(newQuietErrors(log, 10*time.Second).handler(), slog.LevelWarn),
		ConnContext:       markOverCap,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: cfg.HTTP2MaxStreams,
		},
	}
	return srv
}

// streamRoutes answer with a body whose size grows with the state (a
// backup, every remembered event id): they get --http-stream-timeout to
// write it instead of --http-write-timeout.
var streamRoutes = map[string]bool{"/admin/backup": true, "/v1/audit/events": true}

// deadlines gives streaming routes --http-stream-timeout to write their
// answer instead of --http-write-timeout. (The read deadline needs no
// help: net/http lifts it once a request's body has been read, so a
// handler that works past --http-read-timeout, a write waiting for its
// commit, keeps its context.)
func deadlines(h http.Handler, stream time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && streamRoutes[r.URL.Path] {
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(stream))
		}
		h.ServeHTTP(w, r)
	})
}

// connLimit is the client plane's cap on open connections (--max-conns).
// Up to the cap, connections are served as usual. Past it a connection is
// still accepted, but every request on it but a probe (shedOverCap) is
// answered 503 with Retry-After and the connection is closed after that
// answer: a client
// learns at once, and for certain, that nothing was done — where a
// listener that stops accepting leaves it waiting in the kernel's backlog
// until its own timeout, not knowing whether a write landed. Past twice
// the cap, connections are closed at accept, so the answers themselves
// stay bounded too.
type connLimit struct {
	net.Listener
	max int
	log *slog.Logger

	open    prometheus.Gauge
	shed    *prometheus.CounterVec
	mu      sync.Mutex
	n       int  // open connections
	over    bool // shedding: logged once per episode
	shedded int  // connections shed in this episode
}

func newConnLimit(l net.Listener, max int, reg prometheus.Registerer, log *slog.Logger) *connLimit {
	c := &connLimit{Listener: l, max: max, log: log,
		open: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_http_connections", Help: "Client connections open."}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_http_connections_shed_total",
			Help: "Client connections past --max-conns: answered 503 (how=answered) or closed at accept past twice the cap (how=closed)."}, []string{"how"}),
	}
	if reg != nil {
		reg.MustRegister(c.open, c.shed)
	}
	return c
}

func (l *connLimit) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		l.n++
		n := l.n
		overCap := n > l.max
		if overCap {
			l.shedded++
			if !l.over {
				l.over = true
				l.log.Warn("client connections at --max-conns: answering new ones 503 until some close", "max_conns", l.max)
			}
		}
		l.mu.Unlock()
		l.open.Inc()
		lc := &limitedConn{Conn: conn, l: l, overCap: overCap}
		if n > 2*l.max {
			l.shed.WithLabelValues("closed").Inc()
			lc.Close()
			continue
		}
		if overCap {
			l.shed.WithLabelValues("answered").Inc()
		}
		return lc, nil
	}
}

func (l *connLimit) release() {
	l.open.Dec()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if l.over && l.n < l.max {
		l.log.Info("client connections below --max-conns again", "max_conns", l.max, "shed", l.shedded)
		l.over, l.shedded = false, 0
	}
}

// limitedConn is one accepted connection; closing it frees its slot once.
type limitedConn struct {
	net.Conn
	l       *connLimit
	overCap bool
	once    sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.l.release)
	return err
}

type overCapKey struct{}

// markOverCap is http.Server.ConnContext: it notes in the connection's
// context whether the connection came in past the cap.
func markOverCap(ctx context.Context, c net.Conn) context.Context {
	for {
		if lc, ok := c.(*limitedConn); ok {
			return context.WithValue(ctx, overCapKey{}, lc.overCap)
		}
		inner, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return ctx
		}
		c = inner.NetConn()
	}
}

// shedOverCap answers every request on a connection past the cap with
// 503 and asks for the connection to be closed (HTTP/2: GOAWAY) — except
// a liveness or readiness probe (isProbe), which is served as on any
// connection and then closes its connection likewise. An orchestrator
// that gets 503 from /healthz restarts the node, and one that gets it from
// /readyz takes it out of service: under a connection flood that would
// turn a healthy node that is shedding load into a dead one. A probe past
// the cap costs what the 503 would have (a status read, no body, no
// backend I/O), and the band past the cap is already bounded: past twice
// the cap connections are closed at accept, probes included.
func shedOverCap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if over, _ := r.Context().Value(overCapKey{}).(bool); over {
			w.Header().Set("Connection", "close")
			if isProbe(r) {
				h.ServeHTTP(w, r)
				return
			}
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":"unavailable","message":"too many client connections (--max-conns); retry on a new connection","field":""}}`+"\n")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// isProbe: GET (or HEAD) /healthz or /readyz, the probes an orchestrator
// sends. /metrics is not one: a scrape reads every series, and a
// scraper keeps its connection, inside the cap.
func isProbe(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz")
}

// quietErrors is http.Server's error log. Most of what net/http logs there
// comes from clients, once per connection ("TLS handshake error from
// 10.0.0.7:51234: ...": a port scanner, a client without the CA, a plain
// HTTP request on the TLS port); a line for each would flood the node's
// log. The first line of each kind is logged, then at most one per period
// with the count of those suppressed in between.
type quietErrors struct {
	log    *slog.Logger
	period time.Duration
	now    func() time.Time

	mu    sync.Mutex
	kinds map[string]*quietKind
}

type quietKind struct {
	last       time.Time
	suppressed int
}

func newQuietErrors(log *slog.Logger, period time.Duration) *quietErrors {
	return &quietErrors{log: log, period: period, now: time.Now, kinds: map[string]*quietKind{}}
}

// handler is the slog.Handler the log.Logger of http.Server writes into.
func (q *quietErrors) handler() slog.Handler { return quietHandler{q} }

// kindOf is a line's kind: its text up to the remote address
// ("http: TLS handshake error"), or the whole line.
func kindOf(msg string) string {
	if i := strings.Index(msg, " from "); i > 0 {
		return msg[:i]
	}
	if i := strings.IndexByte(msg, ':'); i > 0 && i+1 < len(msg) {
		if j := strings.IndexByte(msg[i+1:], ':'); j > 0 {
			return msg[:i+1+j]
		}
	}
	return msg
}

// admit decides whether a line of kind k is logged now, and how many of
// its kind were suppressed since the last one that was.
func (q *quietErrors) admit(k string) (bool, int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	st := q.kinds[k]
	if st == nil {
		if len(q.kinds) > 256 {
			clear(q.kinds) // bound the map; a kind seen again is logged again
		}
		st = &quietKind{}
		q.kinds[k] = st
	} else if now.Sub(st.last) < q.period {
		st.suppressed++
		return false, 0
	}
	n := st.suppressed
	st.last, st.suppressed = now, 0
	return true, n
}

type quietHandler struct{ q *quietErrors }

func (h quietHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.q.log.Handler().Enabled(ctx, l)
}

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	ok, suppressed := h.q.admit(kindOf(r.Message))
	if !ok {
		return nil
	}
	if suppressed > 0 {
		r.AddAttrs(slog.Int("suppressed_since_last", suppressed))
	}
	return h.q.log.Handler().Handle(ctx, r)
}

func (h quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return quietHandler{&quietErrors{log: slog.New(h.q.log.Handler().WithAttrs(as)), period: h.q.period, now: h.q.now, kinds: map[string]*quietKind{}}}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{&quietErrors{log: slog.New(h.q.log.Handler().WithGroup(name)), period: h.q.period, now: h.q.now, kinds: map[string]*quietKind{}}}
}
