package relay

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// spliceRound bounds one ReadFrom call on the splice path so the byte
	// counters advance during long transfers.
	spliceRound = 4 << 20
	// readSize is the fault-aware loop's read size.
	readSize = 32 << 10
	// maxPending bounds bytes read but not yet written (e.g. held by
	// latency): the loop stops reading beyond it, so a slow or delayed
	// direction pushes back on its sender instead of buffering.
	maxPending = 256 << 10
)

// readBufs recycles the pumps' read buffers: a connection that lives for
// one request would otherwise allocate 2 x readSize for it.
var readBufs = sync.Pool{New: func() any { return new([readSize]byte) }}

// pump moves one direction of one connection, src -> dst.
type pump struct {
	c        *conn
	dir      Direction
	src, dst *net.TCPConn
	bytes    *atomic.Uint64
	rng      *rand.Rand // created on first use (random): most connections never meet a fault

	snap  *snapshot
	flows []liveFlow // flows of snap acting on this direction of c, in install order

	srcRaw, dstRaw syscall.RawConn
	pipe           *kernelPipe // splice(2) buffer, created on first use
	noSplice       bool        // splice unavailable: the loop copies instead
	bulk           bool        // no-fault path: splice (bulk) rather than copy (small messages)

	buf          []byte
	cp           copyState             // the small-message loop's (copy.go)
	onReadable   func(fd uintptr) bool // p.readable, bound once: no allocation per Read
	onWritable   func(fd uintptr) bool // p.writable, likewise
	pending      []chunk
	pendingBytes int
	eof          bool // src sent FIN; finish writing pending, then half-close dst
}

type liveFlow struct {
	id uint64
	f  flow
}

func newPump(c *conn, dir Direction, src, dst *net.TCPConn, bytes *atomic.Uint64) (*pump, error) {
	p := &pump{c: c, dir: dir, src: src, dst: dst, bytes: bytes}
	p.onReadable, p.onWritable = p.readable, p.writable
	var err error
	if p.srcRaw, err = src.SyscallConn(); err != nil {
		return nil, fmt.Errorf("relay %s: raw %s source: %w", c.r.cfg.Name, dir, err)
	}
	if p.dstRaw, err = dst.SyscallConn(); err != nil {
		return nil, fmt.Errorf("relay %s: raw %s destination: %w", c.r.cfg.Name, dir, err)
	}
	return p, nil
}

// random is the pump's generator, created on first use; only the pump's
// goroutine calls it.
func (p *pump) random() *rand.Rand {
	if p.rng == nil {
		p.rng = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return p.rng
}

// guardedRead runs read (a non-blocking syscall on src's descriptor)
// only while p.snap is the relay's current fault set, and waits for src
// to become readable when read reports EAGAIN. It reports stale instead
// of reading when the set had changed.
//
// A swap can still land while the syscall runs; the caller must check
// p.current() after a read that returned bytes and, if the set changed,
// hand those bytes to the new set (see the package invariant). No lock
// is held across the syscall, so Apply never waits for a pump.
func (p *pump) guardedRead(read func(fd int) (int, error)) (n int, stale bool, err error) {
	var rerr error
	err = p.srcRaw.Read(func(fd uintptr) bool {
		if !p.current() {
			stale = true
			return true
		}
		for {
			n, rerr = read(int(fd))
			if rerr != syscall.EINTR {
				break
			}
		}
		return rerr != syscall.EAGAIN
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		n = 0
	}
	return n, stale, err
}

// current reports whether p.snap is still the relay's fault set.
func (p *pump) current() bool { return p.c.r.snap.Load() == p.snap }

// announce tells Apply that this pump is about to write bytes under
// p.snap, then checks that p.snap is still current. It returns false
// (and withdraws) when the set changed: the bytes must meet the new set.
// Once it returned true, Apply waits for clearAnnounce before it returns,
// so no byte moves under an old set after an API call answered: Apply
// stores the new set before it looks at the announcements, and the pump
// announces before it loads the set, so (with Go's sequentially
// consistent atomics) either the pump sees the new set or Apply sees the
// announcement. Everything between announce and clearAnnounce is a
// non-blocking syscall or a wait that Apply's kick interrupts.
func (p *pump) announce() bool {
	slot := &p.c.forwarding[p.dirIndex()]
	slot.Store(p.snap)
	if !p.current() {
		slot.Store(nil)
		return false
	}
	if h := testHookAnnounced.Load(); h != nil {
		(*h)(p)
	}
	return true
}

func (p *pump) clearAnnounce() { p.c.forwarding[p.dirIndex()].Store(nil) }

func (p *pump) dirIndex() int {
	if p.dir == Upstream {
		return 0
	}
	return 1
}

// testHookAnnounced, when set, runs after a pump announced a write and
// before it writes: tests use it to land a fault change in that window.
var testHookAnnounced atomic.Pointer[func(p *pump)]

func (p *pump) run() {
	// p.pipe is created lazily by splice: read it when run ends, not now
	// (a plain `defer p.pipe.close()` would close the nil it holds here
	// and leak two descriptors per direction of every connection).
	defer func() {
		p.pipe.close()
		if p.buf != nil {
			readBufs.Put((*[readSize]byte)(p.buf))
		}
	}()
	for !p.c.isDone() {
		// Deadlines first, then the fault set: see the package invariant.
		// This pump owns its source's read deadline and its destination's
		// write deadline; Apply's kick sets both in the past.
		_ = p.src.SetReadDeadline(time.Time{})
		_ = p.dst.SetWriteDeadline(time.Time{})
		p.sync()
		var more bool
		switch {
		case len(p.flows) > 0 || len(p.pending) > 0 || p.eof:
			more = p.step()
		case p.bulk && !p.noSplice:
			more = p.splice()
		default:
			more = p.copyLoop()
		}
		if !more {
			return
		}
	}
}

// sync rebuilds the flows when the fault set changed. A flow survives a
// change that keeps its fault, so its state (bytes left, timers) does too.
func (p *pump) sync() {
	s := p.c.r.snap.Load()
	if s == p.snap {
		return
	}
	p.snap = s
	old := p.flows
	p.flows = nil
	for _, f := range s.faults {
		if !f.Direction.covers(p.dir) {
			continue
		}
		on, since := p.c.affected(f)
		if !on {
			continue
		}
		var fl flow
		for _, o := range old {
			if o.id == f.id {
				fl = o.f
			}
		}
		if fl == nil {
			if fl = f.Toxic.open(since, p.random()); fl == nil {
				continue // connection-level toxic
			}
		}
		p.flows = append(p.flows, liveFlow{id: f.id, f: fl})
	}
	p.c.forget(s)
}

// step does one unit of work of the fault-aware loop: write (part of) the
// oldest pending chunk, or read one chunk, or wait. It returns false when
// the direction is finished.
func (p *pump) step() bool {
	now := time.Now()
	hold, wake, end := false, time.Time{}, false
	for _, f := range p.flows {
		h, w, e := f.f.check(now)
		hold, wake, end = hold || h, earlier(wake, w), end || e
	}
	if end {
		p.c.shutdown(false, false)
		return false
	}
	if !hold && len(p.pending) > 0 {
		c := &p.pending[0]
		allow, retry := len(c.data), time.Time{}
		for _, f := range p.flows {
			a, r := f.f.gate(now, c)
			allow = min(allow, a)
			if a == 0 {
				retry = later(retry, r)
			}
		}
		if allow > 0 {
			return p.write(c, allow)
		}
		wake = earlier(wake, retry)
	}
	if p.eof && len(p.pending) == 0 {
		p.closeWrite()
		return false
	}
	if hold && !p.eof {
		if p.waitHeld(wake) {
			p.release()
			return false
		}
		return true
	}
	if p.eof || p.pendingBytes >= maxPending {
		p.wait(wake)
		return true
	}
	// wake may be zero (no deadline): the only thing to wait for is data
	// or a kick.
	_ = p.src.SetReadDeadline(wake)
	if p.buf == nil {
		p.buf = readBufs.Get().(*[readSize]byte)[:]
	}
	n, stale, err := p.guardedRead(func(fd int) (int, error) { return syscall.Read(fd, p.buf) })
	if stale {
		return true
	}
	if n == 0 && err == nil {
		err = io.EOF
	}
	if n > 0 {
		// Pending bytes are written only after run's next sync, so bytes
		// read across a fault change meet the new set.
		p.hold(append([]byte(nil), p.buf[:n]...))
	}
	switch {
	case err == nil:
	case errors.Is(err, os.ErrDeadlineExceeded):
	case err == io.EOF:
		p.eof = true
		p.sawEOF()
	default:
		p.fail(err)
		return false
	}
	return true
}

// hold queues data just read for the fault-aware loop.
func (p *pump) hold(data []byte) {
	p.pending = append(p.pending, chunk{readAt: time.Now(), seed: 2*p.random().Float64() - 1, data: data})
	p.pendingBytes += len(data)
}

func (p *pump) write(c *chunk, allow int) bool {
	if !p.announce() {
		return true // the set changed since step looked: look again
	}
	n, err := p.dst.Write(c.data[:allow])
	p.bytes.Add(uint64(n))
	p.clearAnnounce()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil // kicked: what is left meets the new set
	}
	now := time.Now()
	end := false
	for _, f := range p.flows {
		end = f.f.wrote(now, n) || end
	}
	c.data = c.data[n:]
	p.pendingBytes -= n
	if len(c.data) == 0 {
		p.pending[0] = chunk{}
		p.pending = p.pending[1:]
	}
	if err != nil {
		p.fail(err)
		return false
	}
	if end {
		p.c.shutdown(false, false)
		return false
	}
	return true
}

// wait blocks until wake (zero: no timer), a fault change, or the end of
// the connection.
func (p *pump) wait(wake time.Time) {
	var timer <-chan time.Time
	if !wake.IsZero() {
		t := time.NewTimer(time.Until(wake))
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-p.snap.changed:
	case <-timer:
	case <-p.c.done:
	}
}

// waitHeld is wait for a direction a fault holds (blackhole, timeout),
// which also watches src for its peer hanging up — without reading, so
// nothing is taken from the held stream. Without the watch a client that
// gave up on a blackholed link kept two goroutines, two relay sockets and
// the upstream connection until the fault was removed. It returns true
// when the peer hung up and the connection may be released (see
// mayRelease); false when the wait ended otherwise (wake, a fault change
// or the end of the connection: the caller looks again).
//
// The wait is the runtime poller's (edge-triggered, so queued bytes do
// not wake it again; a FIN or RST does), interrupted by the read deadline
// set to wake, by Apply's kick after a fault change, and by shutdown
// closing the socket.
func (p *pump) waitHeld(wake time.Time) (release bool) {
	_ = p.src.SetReadDeadline(wake)
	_ = p.srcRaw.Read(func(fd uintptr) bool {
		if !p.current() || p.c.isDone() {
			return true
		}
		if h := testHookHeldCheck.Load(); h != nil {
			(*h)(p, int(fd))
		}
		// The set must still be current once the hang-up was seen, not
		// only before looking: a fault removed (Apply returned) and the
		// client closing right after, between the check above and the
		// poll, would otherwise release the connection and drop bytes
		// the removal had freed (TestFaultActsOnNextByte
		// lost the held byte about once in 150 runs). Apply stores the
		// new set before it returns, and the client closed after that, so
		// a hang-up the poll sees is ordered after the store and this
		// load sees the new set.
		hungUp := peerHungUp(int(fd))
		if !p.current() {
			return true
		}
		if hungUp && p.mayRelease() {
			release = true
			return true
		}
		return false
	})
	return release
}

// testHookHeldCheck, when set, runs in waitHeld between the check that
// the fault set is current and the look for a hang-up: tests use it to
// land a fault change in that window.
var testHookHeldCheck atomic.Pointer[func(p *pump, fd int)]

// mayRelease says whether src hanging up while held ends the connection.
// A client that hangs up is gone: nobody is left to deliver the held
// bytes to. A server's close is hidden from a client that is still
// sending, as a real partition hides it, until the client has finished
// too (its FIN went upstream); then nobody is waiting on anything.
func (p *pump) mayRelease() bool {
	return p.dir == Upstream || p.c.clientEOF.Load()
}

// release ends the connection after src hung up while this direction
// was held. The held bytes are dropped — never forwarded — and the other
// side is reset, not closed, so it cannot take the stream cut short for a
// complete one.
func (p *pump) release() {
	p.c.r.log.Debug("peer hung up while held; connection released", "direction", p.dir, "held_bytes", p.pendingBytes)
	p.c.shutdown(p.dir == Downstream, p.dir == Upstream)
}

// sawEOF notes the client's FIN on the upstream direction and wakes the
// downstream pump, which may be waiting on a held server that has hung
// up (see mayRelease).
func (p *pump) sawEOF() {
	if p.dir != Upstream {
		return
	}
	p.c.clientEOF.Store(true)
	_ = p.c.server.SetReadDeadline(past)
}

// fail ends the connection after an I/O error. A reset seen on one side is
// passed on as a reset to the other, so both peers learn the same thing.
func (p *pump) fail(err error) {
	if isReset(err) {
		p.c.shutdown(true, true)
		return
	}
	p.c.r.log.Debug("connection ended", "direction", p.dir, "err", err)
	p.c.shutdown(false, false)
}
