// Package relay forwards every TCP connection accepted on one listener to
// one upstream address, and injects faults into the forwarded streams.
//
// Each connection is pumped by two goroutines, one per direction. While no
// fault covers a direction its pump copies small messages with one read
// and one write each (copy.go) and moves bulk data with splice(2) through
// a kernel pipe, never through user space (splice_linux.go).
// Otherwise the fault-aware loop in pump.go reads chunks, lets each fault's
// flow hold, delay, slice, meter or cut them, and writes them on.
//
// Invariant — a change has taken effect on existing connections when
// Apply returns, and from then on no byte moves but through the new set:
//   - no byte a pump reads after Apply has swapped the fault set goes
//     anywhere but through the new set. Every pump checks that its set is
//     current just before each read syscall (so a pump that saw the swap
//     reads nothing under the old set) and again just after it (so bytes
//     read by a syscall racing the swap are treated as read under the new
//     set: handed to its faults, never forwarded under the old one);
//   - no byte is written under the old set after Apply returns. A pump
//     announces each write (pump.announce) before its last check that the
//     set is current, and Apply, after the swap, waits until no pump is
//     announced under an older set (conn.settle). Bytes read but not yet
//     written when the swap lands are handed to the new set, like bytes
//     read after it (TCP streams never get holes: a blackhole holds them,
//     it does not drop them).
//
// Pumps waiting for data, or for room to write, are woken by deadlines in
// the past (a "kick"), which Apply sets on both sockets of every
// connection after the swap. Apply takes no lock that a pump holds across
// a syscall, and waits only for writes in progress, which a kick
// interrupts, so it cannot hang however busy or stuck the connections are.
package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	// ErrFaultExists is returned when adding a fault whose name is taken.
	ErrFaultExists = errors.New("fault already exists")
	// ErrNoFault is returned when removing a fault that is not installed.
	ErrNoFault = errors.New("no such fault")
	// ErrClosed is returned by operations on a closed relay.
	ErrClosed = errors.New("relay closed")
)

// Config describes a relay.
type Config struct {
	Name     string
	Listen   string // host:port; port 0 picks a free one (see Addr)
	Upstream string // host:port dialed for every accepted connection
	// DialTimeout bounds the upstream dial; default 5s.
	DialTimeout time.Duration
	Logger      *slog.Logger
}

// Stats are the relay's counters. Bytes count what was written to the
// destination; on the splice path they are updated every few MB and when
// a copy round ends.
type Stats struct {
	ConnectionsTotal  uint64 `json:"connections_total"`
	ConnectionsActive int64  `json:"connections_active"`
	BytesUpstream     uint64 `json:"bytes_upstream"`
	BytesDownstream   uint64 `json:"bytes_downstream"`
	FaultsActive      int    `json:"faults_active"`
}

// installed is a fault on a relay, with an id that is never reused so a
// connection's toxicity decision stays tied to one installation.
type installed struct {
	Fault
	id uint64
}

// snapshot is an immutable fault set. changed is closed when a newer
// snapshot replaces it, waking pumps that wait on a timer.
type snapshot struct {
	faults  []installed
	maxID   uint64
	gen     uint64 // 0 for the first set, +1 with every change
	changed chan struct{}
}

// Relay is one listener forwarding to one upstream. Safe for concurrent use.
type Relay struct {
	cfg    Config
	ln     *net.TCPListener
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	snap atomic.Pointer[snapshot] // current fault set; see the package invariant

	// applyMu serializes fault-set edits (Apply) and Close; nothing on a
	// connection's path takes it.
	applyMu sync.Mutex
	nextID  uint64 // guarded by applyMu
	closed  atomic.Bool

	// conns holds every live connection (*conn -> struct{}). A map
	// without a relay-wide lock: with one, Apply queued behind every
	// connection being set up or torn down at that moment (measured: over
	// a second behind 100 connections starting at once under -race). A
	// connection registers before it loads the fault set, and Apply swaps
	// the set before it ranges over conns, so every connection either is
	// seen by Apply or sees the new set itself.
	conns sync.Map

	total, up, down atomic.Uint64
	active          atomic.Int64

	wg sync.WaitGroup // accept loop and connection goroutines

	dialer net.Dialer // the upstream dial's, set once in Listen
}

// Listen binds cfg.Listen and starts forwarding to cfg.Upstream.
func Listen(cfg Config) (*Relay, error) {
	if err := checkName(cfg.Name); err != nil {
		return nil, err
	}
	if _, _, err := net.SplitHostPort(cfg.Upstream); err != nil {
		return nil, fieldErr("upstream", "expected host:port, found %q: %v", cfg.Upstream, err)
	}
	if _, _, err := net.SplitHostPort(cfg.Listen); err != nil {
		return nil, fieldErr("listen", "expected host:port, found %q: %v", cfg.Listen, err)
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	lc := net.ListenConfig{Control: tuneListener, KeepAlive: listenerKeepAlive}
	ln, err := lc.Listen(context.Background(), "tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("relay %s: listen on %s: %w", cfg.Name, cfg.Listen, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relay{
		cfg:    cfg,
		ln:     ln.(*net.TCPListener),
		log:    cfg.Logger.With("relay", cfg.Name),
		ctx:    ctx,
		cancel: cancel,
	}
	r.dialer = net.Dialer{Timeout: cfg.DialTimeout, Control: dialControl}
	r.snap.Store(&snapshot{changed: make(chan struct{})})
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *Relay) Name() string     { return r.cfg.Name }
func (r *Relay) Upstream() string { return r.cfg.Upstream }

// Addr is the address the relay listens on (with the real port when the
// configured one was 0).
func (r *Relay) Addr() *net.TCPAddr { return r.ln.Addr().(*net.TCPAddr) }

// Stats returns a copy of the counters.
func (r *Relay) Stats() Stats {
	return Stats{
		ConnectionsTotal:  r.total.Load(),
		ConnectionsActive: r.active.Load(),
		BytesUpstream:     r.up.Load(),
		BytesDownstream:   r.down.Load(),
		FaultsActive:      len(r.snap.Load().faults),
	}
}

// Faults returns the installed faults in the order they were added.
func (r *Relay) Faults() []Fault {
	s := r.snap.Load()
	out := make([]Fault, len(s.faults))
	for i, f := range s.faults {
		out[i] = f.Fault
	}
	return out
}

// AddFault installs f. It returns once f acts on every existing connection
// (see the package invariant), with the time it took effect.
func (r *Relay) AddFault(f Fault) (time.Time, error) { return r.Apply(nil, []Fault{f}) }

// RemoveFault removes the fault called name, with the same guarantee.
func (r *Relay) RemoveFault(name string) (time.Time, error) { return r.Apply([]string{name}, nil) }

// RemoveAll removes every fault, with the same guarantee as Apply. On a
// closed relay it returns ErrClosed.
func (r *Relay) RemoveAll() (time.Time, error) {
	for {
		var names []string
		for _, f := range r.Faults() {
			names = append(names, f.Name)
		}
		at, err := r.Apply(names, nil)
		if errors.Is(err, ErrNoFault) {
			// Only a concurrent removal can make a name vanish; retry on
			// the fresh set rather than leave faults behind.
			continue
		}
		return at, err
	}
}

// Apply removes the faults named in remove and then installs add, as one
// atomic change: no connection ever sees the set in between (this is how
// the mesh moves a partition without opening a link for an instant).
// It returns once the change acts on every existing connection.
func (r *Relay) Apply(remove []string, add []Fault) (time.Time, error) {
	for _, f := range add {
		if err := checkName(f.Name); err != nil {
			return time.Time{}, err
		}
		if f.Toxic == nil {
			return time.Time{}, fieldErr("type", "fault %q has no toxic", f.Name)
		}
		if f.Direction != Upstream && f.Direction != Downstream && f.Direction != Both {
			return time.Time{}, fieldErr("direction", "expected upstream, downstream or both, found %q", f.Direction)
		}
	}
	r.applyMu.Lock()
	if r.closed.Load() {
		r.applyMu.Unlock()
		return time.Time{}, fmt.Errorf("relay %s: %w", r.cfg.Name, ErrClosed)
	}
	old := r.snap.Load()
	next := slices.Clone(old.faults)
	for _, name := range remove {
		i := slices.IndexFunc(next, func(f installed) bool { return f.Name == name })
		if i < 0 {
			r.applyMu.Unlock()
			return time.Time{}, fmt.Errorf("relay %s: fault %q: %w", r.cfg.Name, name, ErrNoFault)
		}
		next = slices.Delete(next, i, i+1)
	}
	var resets []installed
	for _, f := range add {
		if slices.ContainsFunc(next, func(g installed) bool { return g.Name == f.Name }) {
			r.applyMu.Unlock()
			return time.Time{}, fmt.Errorf("relay %s: fault %q: %w", r.cfg.Name, f.Name, ErrFaultExists)
		}
		r.nextID++
		in := installed{Fault: f, id: r.nextID}
		next = append(next, in)
		if _, ok := f.Toxic.(Reset); ok {
			resets = append(resets, in)
		}
	}
	snap := &snapshot{faults: next, maxID: r.nextID, gen: old.gen + 1, changed: make(chan struct{})}
	r.snap.Store(snap)
	r.applyMu.Unlock()

	close(old.changed)
	r.conns.Range(func(k, _ any) bool {
		c := k.(*conn)
		for _, f := range resets {
			if on, _ := c.affected(f); on {
				c.reset(f.Direction)
			}
		}
		c.kick()
		return true
	})
	// Kicked first, all of them, so that the writes waited for below
	// are all being interrupted at once.
	r.conns.Range(func(k, _ any) bool {
		k.(*conn).settle(snap)
		return true
	})
	return time.Now(), nil
}

// Close stops accepting, closes every connection and waits for all
// goroutines of the relay to end.
func (r *Relay) Close() error {
	r.applyMu.Lock()
	already := r.closed.Swap(true)
	r.applyMu.Unlock()
	if already {
		return nil
	}
	r.cancel()
	err := r.ln.Close()
	// A connection registering now sees closed after storing itself, so
	// each one is shut down here or by itself.
	r.conns.Range(func(k, _ any) bool {
		k.(*conn).shutdown(false, false)
		return true
	})
	r.wg.Wait()
	return err
}

func (r *Relay) accept() {
	defer r.wg.Done()
	var backoff time.Duration
	for {
		c, err := r.ln.AcceptTCP()
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			// EMFILE and friends: back off instead of spinning.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			r.log.Warn("accept failed", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-r.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		r.wg.Add(1)
		go r.serve(c)
	}
}

// serve runs one connection to its end.
func (r *Relay) serve(client *net.TCPConn) {
	defer r.wg.Done()
	c := &conn{r: r, client: client, done: make(chan struct{})}
	for _, f := range r.snap.Load().faults {
		if _, ok := f.Toxic.(Reject); ok {
			if on, _ := c.affected(f); on {
				_ = client.SetLinger(0)
				_ = client.Close()
				return
			}
		}
	}
	sc, err := r.dialUpstream()
	if err != nil {
		// An unreachable upstream looks to the client like a refused
		// connection, not like a server that accepted and hung up.
		r.log.Debug("dial upstream failed", "upstream", r.cfg.Upstream, "err", err)
		_ = client.SetLinger(0)
		_ = client.Close()
		return
	}
	c.server = sc

	r.conns.Store(c, struct{}{})
	if r.closed.Load() {
		r.conns.Delete(c)
		c.shutdown(false, false)
		return
	}
	r.total.Add(1)
	r.active.Add(1)

	// Registered before this load: a reset added later finds c in r.conns.
	for _, f := range r.snap.Load().faults {
		if _, ok := f.Toxic.(Reset); ok {
			if on, _ := c.affected(f); on {
				c.reset(f.Direction)
			}
		}
	}

	up, err := newPump(c, Upstream, client, c.server, &r.up)
	if err == nil {
		var down *pump
		if down, err = newPump(c, Downstream, c.server, client, &r.down); err == nil {
			var wg sync.WaitGroup
			wg.Add(1)
			// The client speaks first: its direction runs on this
			// goroutine at once, the reply direction on a new one, which
			// is ready long before a reply can come back.
			go func() { defer wg.Done(); down.run() }()
			up.run()
			wg.Wait()
		}
	}
	if err != nil {
		r.log.Warn("connection dropped", "err", err)
	}
	c.shutdown(false, false)

	r.conns.Delete(c)
	r.active.Add(-1)
}

// dialUpstream connects to the upstream for one accepted connection.
// (Dialer.DialTCP with a parsed address would skip the resolver, but it
// always binds a local address after the Control function, where the
// socket is already connected: see dial_linux.go.)
func (r *Relay) dialUpstream() (*net.TCPConn, error) {
	c, err := r.dialer.DialContext(r.ctx, "tcp", r.cfg.Upstream)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// hit is a connection's toxicity decision for one installed fault.
type hit struct {
	on    bool
	since time.Time // when the fault first acted on the connection
}

// conn is one client connection and its upstream connection.
type conn struct {
	r              *Relay
	client, server *net.TCPConn
	done           chan struct{}
	once           sync.Once

	mu   sync.Mutex     // guards hits, rng
	hits map[uint64]hit // created on first use, as rng: most connections meet no fault
	rng  *rand.Rand

	// clientEOF is set once the client's FIN was read (upstream pump).
	clientEOF atomic.Bool

	// forwarding holds, per direction (upstream, downstream), the fault
	// set a pump is writing bytes under right now, nil when it is not
	// writing (pump.announce). Apply waits for the older ones to clear.
	forwarding [2]atomic.Pointer[snapshot]
}

// settle returns once no pump of c is writing under a fault set older
// than s: from then on no byte of c moves but through s. The writes it
// waits for cannot block: Apply's kick has set the write deadlines in the
// past, and a pump never waits for anything else while announced.
func (c *conn) settle(s *snapshot) {
	for i := range c.forwarding {
		for spins := 0; ; spins++ {
			f := c.forwarding[i].Load()
			if f == nil || f.gen >= s.gen || c.isDone() {
				break
			}
			if spins == 0 {
				if h := testHookSettleWaits.Load(); h != nil {
					(*h)(c)
				}
			}
			// One write syscall is all there is to wait for.
			if spins < 100 {
				runtime.Gosched()
			} else {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}
}

// testHookSettleWaits, when set, runs when Apply finds a pump it has to
// wait for.
var testHookSettleWaits atomic.Pointer[func(c *conn)]

// affected draws (once) whether f acts on c, and since when.
func (c *conn) affected(f installed) (bool, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.hits[f.id]
	if !ok {
		if f.Toxicity < 1 && c.rng == nil {
			c.rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
		}
		h = hit{on: f.Toxicity >= 1 || c.rng.Float64() < f.Toxicity, since: time.Now()}
		if c.hits == nil {
			c.hits = make(map[uint64]hit)
		}
		c.hits[f.id] = h
	}
	return h.on, h.since
}

// forget drops decisions for faults removed before s: ids up to s.maxID
// that s no longer holds can never come back.
func (c *conn) forget(s *snapshot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.hits {
		if id <= s.maxID && !slices.ContainsFunc(s.faults, func(f installed) bool { return f.id == id }) {
			delete(c.hits, id)
		}
	}
}

// past is a read deadline that has always expired.
var past = time.Unix(1, 0)

// kick interrupts any read or write in progress on either socket; see
// the package invariant.
func (c *conn) kick() {
	_ = c.client.SetDeadline(past)
	_ = c.server.SetDeadline(past)
}

// reset sends RST to the side(s) d names and closes the connection.
func (c *conn) reset(d Direction) {
	c.shutdown(d.covers(Downstream), d.covers(Upstream))
}

// shutdown closes both sockets, with RST on the ones asked for.
func (c *conn) shutdown(resetClient, resetServer bool) {
	c.once.Do(func() {
		if resetClient {
			_ = c.client.SetLinger(0)
		}
		if resetServer {
			_ = c.server.SetLinger(0)
		}
		_ = c.client.Close()
		_ = c.server.Close()
		close(c.done)
	})
}

func (c *conn) isDone() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// isReset reports whether err means the peer reset its connection, which
// the relay passes on to the other side.
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
