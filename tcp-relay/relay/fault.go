package relay

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Direction names which way of a connection a fault acts on. Upstream is
// client -> server (towards the relay's upstream), downstream is the reply
// path server -> client.
type Direction string

const (
	Upstream   Direction = "upstream"
	Downstream Direction = "downstream"
	Both       Direction = "both"
)

// covers reports whether a fault declared for d acts on pump direction p
// (p is Upstream or Downstream, never Both).
func (d Direction) covers(p Direction) bool { return d == Both || d == p }

// A Fault is one named toxic installed on a relay. It is immutable once
// added: changing a fault means replacing it (see Relay.Apply).
type Fault struct {
	// Name is unique per relay; it is what RemoveFault takes.
	Name      string
	Direction Direction
	// Toxicity is the probability in [0,1] that a connection is affected.
	// It is drawn once per connection and fault (Toxiproxy semantics), so
	// a connection is either affected for the fault's whole life or never.
	Toxicity float64
	Toxic    Toxic
}

// A Toxic is the behaviour of a fault. Connection-level toxics (Reject,
// Reset) act on accept or when added; the others open a flow on every
// (connection, direction) they cover, and the pump consults the flow before
// every read and write while the fault is installed.
type Toxic interface {
	// Type is the name used in the API: "latency", "blackhole", ...
	Type() string
	// open returns the state of this toxic on one direction of one
	// connection, first seen at start; nil for connection-level toxics.
	open(start time.Time, rng *rand.Rand) flow
}

// chunk is data read from the source and not yet fully written to the
// destination. seed is drawn at read time so that a jittered delay stays
// the same however often the pump re-evaluates the chunk.
type chunk struct {
	readAt time.Time
	seed   float64 // uniform in [-1, 1)
	data   []byte
}

// flow is a toxic's state on one direction of one connection.
//
// The pump calls check before it reads or writes: hold=true stops both
// (nothing is read, so the sender meets TCP backpressure); a non-zero wake
// asks to be called again then; end asks for the connection to be closed.
// gate says how many bytes of the head chunk may be written now (0 means
// wait until retry), and wrote reports bytes actually written.
type flow interface {
	check(now time.Time) (hold bool, wake time.Time, end bool)
	gate(now time.Time, c *chunk) (allow int, retry time.Time)
	wrote(now time.Time, n int) (end bool)
}

// passFlow is embedded by flows that ignore some of the hooks.
type passFlow struct{}

func (passFlow) check(time.Time) (bool, time.Time, bool)     { return false, time.Time{}, false }
func (passFlow) gate(_ time.Time, c *chunk) (int, time.Time) { return len(c.data), time.Time{} }
func (passFlow) wrote(time.Time, int) bool                   { return false }

// Blackhole forwards nothing while installed and keeps connections open.
//
// It stops reading rather than reading and discarding: the sender then
// meets ordinary TCP backpressure (its send buffer fills, writes block),
// nothing buffers without bound in the relay, and the byte stream never
// gets a hole — as with a real partition, where TCP retransmits and
// delivers everything after the heal. A write in progress when the fault
// is added finishes before AddFault returns; bytes the relay had read but
// not yet begun to write are held with the rest (see the package
// invariant).
type Blackhole struct{}

func (Blackhole) Type() string                    { return "blackhole" }
func (Blackhole) open(time.Time, *rand.Rand) flow { return blackholeFlow{} }

type blackholeFlow struct{ passFlow }

func (blackholeFlow) check(time.Time) (bool, time.Time, bool) { return true, time.Time{}, false }

// Reject closes new connections at once with an RST (SO_LINGER 0), before
// dialing the upstream. Existing connections are untouched; the direction
// is ignored.
type Reject struct{}

func (Reject) Type() string                    { return "reject" }
func (Reject) open(time.Time, *rand.Rand) flow { return nil }

// Reset sends an RST on every existing connection when added, and on every
// new connection while installed. Direction picks who receives the RST:
// upstream = the server side, downstream = the client side, both = both;
// a side not chosen is closed normally (FIN).
type Reset struct{}

func (Reset) Type() string                    { return "reset" }
func (Reset) open(time.Time, *rand.Rand) flow { return nil }

// Latency delays every chunk by Latency ± Jitter (uniform), measured from
// when the relay read it. Order is preserved: a chunk never overtakes the
// one before it, so jitter only ever adds delay behind a slow chunk.
type Latency struct {
	Latency, Jitter time.Duration
}

func (Latency) Type() string { return "latency" }
func (l Latency) open(time.Time, *rand.Rand) flow {
	return &latencyFlow{l: l}
}

type latencyFlow struct {
	passFlow
	l Latency
}

func (f *latencyFlow) gate(now time.Time, c *chunk) (int, time.Time) {
	due := c.readAt.Add(f.l.Latency + time.Duration(c.seed*float64(f.l.Jitter)))
	if now.Before(due) {
		return 0, due
	}
	return len(c.data), time.Time{}
}

// Bandwidth caps throughput at Rate bytes per second. Writes go out in
// pieces of at most 20 ms worth of bytes so the rate holds at small scales.
type Bandwidth struct {
	Rate int64 // bytes per second, > 0
}

func (Bandwidth) Type() string { return "bandwidth" }
func (b Bandwidth) open(start time.Time, _ *rand.Rand) flow {
	q := b.Rate / 50
	if q < 1 {
		q = 1
	}
	return &bandwidthFlow{rate: b.Rate, quantum: int(q), next: start}
}

type bandwidthFlow struct {
	passFlow
	rate    int64
	quantum int
	next    time.Time // earliest time the next byte may go out
}

func (f *bandwidthFlow) gate(now time.Time, c *chunk) (int, time.Time) {
	if now.Before(f.next) {
		return 0, f.next
	}
	return min(len(c.data), f.quantum), time.Time{}
}

func (f *bandwidthFlow) wrote(now time.Time, n int) bool {
	// Credit does not accumulate while idle: start from now if behind.
	f.next = later(f.next, now).Add(time.Duration(int64(n) * int64(time.Second) / f.rate))
	return false
}

// Slicer cuts data into writes of AverageSize ± SizeVariation bytes with
// Delay between them, to exercise a receiver's handling of partial reads.
type Slicer struct {
	AverageSize, SizeVariation int
	Delay                      time.Duration
}

func (Slicer) Type() string { return "slicer" }
func (s Slicer) open(_ time.Time, rng *rand.Rand) flow {
	f := &slicerFlow{s: s, rng: rng}
	f.size = f.draw()
	return f
}

type slicerFlow struct {
	passFlow
	s    Slicer
	rng  *rand.Rand
	size int       // size of the next slice
	next time.Time // earliest time of the next slice
}

func (f *slicerFlow) draw() int {
	n := f.s.AverageSize
	if v := f.s.SizeVariation; v > 0 {
		n += f.rng.IntN(2*v+1) - v
	}
	return max(n, 1)
}

func (f *slicerFlow) gate(now time.Time, c *chunk) (int, time.Time) {
	if now.Before(f.next) {
		return 0, f.next
	}
	return min(len(c.data), f.size), time.Time{}
}

func (f *slicerFlow) wrote(now time.Time, _ int) bool {
	f.next = now.Add(f.s.Delay)
	f.size = f.draw()
	return false
}

// LimitData closes the connection once Bytes bytes have gone through in
// the fault's direction, counted from when the fault first acted on it.
// Bytes 0 closes at once.
type LimitData struct {
	Bytes int64
}

func (LimitData) Type() string { return "limit_data" }
func (l LimitData) open(time.Time, *rand.Rand) flow {
	return &limitFlow{left: l.Bytes}
}

type limitFlow struct {
	passFlow
	left int64
}

func (f *limitFlow) check(time.Time) (bool, time.Time, bool) {
	return false, time.Time{}, f.left <= 0
}

func (f *limitFlow) gate(_ time.Time, c *chunk) (int, time.Time) {
	return int(min(int64(len(c.data)), f.left)), time.Time{}
}

func (f *limitFlow) wrote(_ time.Time, n int) bool {
	f.left -= int64(n)
	return f.left <= 0
}

// Timeout stops forwarding (like Blackhole) and closes the connection
// Timeout after the fault first acted on it. Timeout 0 never closes: data
// is held until the fault is removed.
type Timeout struct {
	Timeout time.Duration
}

func (Timeout) Type() string { return "timeout" }
func (t Timeout) open(start time.Time, _ *rand.Rand) flow {
	f := &timeoutFlow{}
	if t.Timeout > 0 {
		f.deadline = start.Add(t.Timeout)
	}
	return f
}

type timeoutFlow struct {
	passFlow
	deadline time.Time // zero: hold forever
}

func (f *timeoutFlow) check(now time.Time) (bool, time.Time, bool) {
	if f.deadline.IsZero() {
		return true, time.Time{}, false
	}
	return true, f.deadline, !now.Before(f.deadline)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// earlier returns the earlier of a and b, treating zero as "never".
func earlier(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero():
		return a
	case a.Before(b):
		return a
	}
	return b
}

func (f Fault) String() string {
	return fmt.Sprintf("%s(%s, %s, toxicity %.2f)", f.Name, f.Toxic.Type(), f.Direction, f.Toxicity)
}
