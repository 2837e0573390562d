package relay

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync/atomic"
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

// pump moves one direction of one connection, src -> dst.
type pump struct {
	c        *conn
	dir      Direction
	src, dst *net.TCPConn
	bytes    *atomic.Uint64
	rng      *rand.Rand

	snap  *snapshot
	flows []liveFlow // flows of snap acting on this direction of c, in install order

	buf          []byte
	pending      []chunk
	pendingBytes int
	eof          bool // src sent FIN; finish writing pending, then half-close dst
}

type liveFlow struct {
	id uint64
	f  flow
}

func newPump(c *conn, dir Direction, src, dst *net.TCPConn, bytes *atomic.Uint64) *pump {
	return &pump{c: c, dir: dir, src: src, dst: dst, bytes: bytes,
		rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

func (p *pump) run() {
	for !p.c.isDone() {
		// Deadline first, then the fault set: see the package invariant.
		_ = p.src.SetReadDeadline(time.Time{})
		p.sync()
		var more bool
		if len(p.flows) == 0 && len(p.pending) == 0 && !p.eof {
			more = p.splice()
		} else {
			more = p.step()
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
			if fl = f.Toxic.open(since, p.rng); fl == nil {
				continue // connection-level toxic
			}
		}
		p.flows = append(p.flows, liveFlow{id: f.id, f: fl})
	}
	p.c.forget(s)
}

// splice copies with no fault active. It returns false when the direction
// is finished.
func (p *pump) splice() bool {
	lr := io.LimitedReader{R: p.src, N: spliceRound}
	n, err := p.dst.ReadFrom(&lr)
	p.bytes.Add(uint64(n))
	switch {
	case err == nil && lr.N > 0: // src at EOF
		_ = p.dst.CloseWrite()
		return false
	case err == nil:
		return true
	case errors.Is(err, os.ErrDeadlineExceeded):
		return true // kicked: reload the fault set
	}
	p.fail(err)
	return false
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
		_ = p.dst.CloseWrite()
		return false
	}
	if hold || p.eof || p.pendingBytes >= maxPending {
		p.wait(wake)
		return true
	}
	// wake may be zero (no deadline): the only thing to wait for is data
	// or a kick.
	_ = p.src.SetReadDeadline(wake)
	if p.c.r.snap.Load() != p.snap {
		return true // changed between sync and the deadline: re-sync first
	}
	if p.buf == nil {
		p.buf = make([]byte, readSize)
	}
	n, err := p.src.Read(p.buf)
	if n > 0 {
		p.pending = append(p.pending, chunk{readAt: time.Now(), seed: 2*p.rng.Float64() - 1, data: append([]byte(nil), p.buf[:n]...)})
		p.pendingBytes += n
	}
	switch {
	case err == nil:
	case errors.Is(err, os.ErrDeadlineExceeded):
	case errors.Is(err, io.EOF):
		p.eof = true
	default:
		p.fail(err)
		return false
	}
	return true
}

func (p *pump) write(c *chunk, allow int) bool {
	n, err := p.dst.Write(c.data[:allow])
	p.bytes.Add(uint64(n))
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
