package peer

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/tidaldb/tidal/tidal-server/server"
)

// ClockSample is this node's best recent estimate of a peer's clock.
//
// Offset is the peer's clock minus this node's (positive: the peer is
// ahead), measured NTP-style: this node notes t1 and t4 around a call,
// the peer t2 on arrival and t3 on reply, and
//
//	Offset = ((t2 - t1) + (t3 - t4)) / 2,  RTT = (t4 - t1) - (t3 - t2).
//
// Whatever the delays on the way out and back, the true offset lies
// within Offset ± Uncertainty (= RTT/2), as long as neither clock jumps
// during the call. Of the last clockWindow samples, the one with the
// smallest RTT is kept: a queued call widens the bound, it does not move
// the truth.
type ClockSample struct {
	Offset      time.Duration
	Uncertainty time.Duration // RTT/2: |true offset - Offset| <= Uncertainty
	RTT         time.Duration
	Age         time.Duration // since the sample was taken (this node's monotonic clock)
}

const (
	// clockWindow samples are kept per peer (at ClockInterval each).
	clockWindow = 8
	// clockProbeTimeout bounds a probe, and so its uncertainty (< 1s): a
	// probe slower than that says too little to be worth keeping.
	clockProbeTimeout = 2 * time.Second
)

type clockProbe struct {
	offset, rtt time.Duration
	at          time.Time // local monotonic
}

// clocks holds the probes of every peer.
type clocks struct {
	mu    sync.Mutex
	peers map[uint64][]clockProbe
}

func (c *clocks) add(id uint64, p clockProbe) clockProbe {
	c.mu.Lock()
	defer c.mu.Unlock()
	ps := c.peers[id]
	if len(ps) > 0 && !consistent(best(ps), p) {
		// One of the two clocks stepped since the best probe: the older
		// probes measured a clock that is gone. Keeping the one with the
		// smallest round trip would report the old offset for up to
		// clockWindow probes after a jump.
		ps = nil
	}
	ps = append(ps, p)
	if len(ps) > clockWindow {
		ps = ps[len(ps)-clockWindow:]
	}
	c.peers[id] = ps
	return best(ps)
}

// clockStepSlack is added to two probes' uncertainties before they count
// as inconsistent: clocks slewed by NTP drift apart by up to a few
// milliseconds over a window, which is no step worth forgetting probes for.
const clockStepSlack = 10 * time.Millisecond

// consistent reports whether two probes can both be true of one offset:
// each puts the true offset within offset ± rtt/2, so two whose intervals
// do not meet (less clockStepSlack) cannot measure the same pair of clocks.
func consistent(a, b clockProbe) bool {
	d := a.offset - b.offset
	if d < 0 {
		d = -d
	}
	return d <= (a.rtt+b.rtt)/2+clockStepSlack
}

func best(ps []clockProbe) clockProbe {
	b := ps[0]
	for _, p := range ps[1:] {
		if p.rtt <= b.rtt {
			b = p
		}
	}
	return b
}

func (c *clocks) forget(id uint64) {
	c.mu.Lock()
	delete(c.peers, id)
	c.mu.Unlock()
}

// ClockOffsets returns the current estimate for every peer measured at
// least once (peers removed since are forgotten). A peer that stopped
// answering keeps its last estimate, with a growing Age.
func (t *Transport) ClockOffsets() map[uint64]ClockSample {
	now := time.Now()
	t.clocks.mu.Lock()
	defer t.clocks.mu.Unlock()
	out := make(map[uint64]ClockSample, len(t.clocks.peers))
	for id, ps := range t.clocks.peers {
		if len(ps) == 0 {
			continue
		}
		b := best(ps)
		out[id] = ClockSample{Offset: b.offset, Uncertainty: b.rtt / 2, RTT: b.rtt, Age: now.Sub(b.at)}
	}
	return out
}

// ClockReadings is ClockOffsets as the server's clock admission reads it
// (server.ClockMeter).
func (t *Transport) ClockReadings() map[uint64]server.ClockReading {
	offsets := t.ClockOffsets()
	out := make(map[uint64]server.ClockReading, len(offsets))
	for id, s := range offsets {
		out[id] = server.ClockReading{Offset: s.Offset, Uncertainty: s.Uncertainty, Age: s.Age}
	}
	return out
}

var _ server.ClockMeter = (*Transport)(nil)

// now is this node's clock as it reports it to peers and reads it for
// offsets: the wall clock plus the test-only Options.ClockOffset, or the
// test-only Options.Now.
func (t *Transport) now() time.Time {
	if t.opts.Now != nil {
		return t.opts.Now()
	}
	return time.Now().Add(t.opts.ClockOffset)
}

// serveClock answers a clock probe: t2 when the call arrived, t3 as it
// leaves, both in unix nanoseconds of this node's clock.
func (t *Transport) serveClock(t2 time.Time) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, uint64(t2.UnixNano()))
	binary.BigEndian.PutUint64(b[8:], uint64(t.now().UnixNano()))
	return b
}

// probeClock measures the offset to the sender's peer once.
func (s *sender) probeClock(ctx context.Context) (clockProbe, error) {
	t1 := s.t.now()
	req, resp := []byte{}, []byte(nil)
	if err := s.conn.Invoke(ctx, "/"+serviceName+"/"+methodClock, &req, &resp); err != nil {
		return clockProbe{}, err
	}
	t4 := s.t.now()
	if step := t4.Round(0).Sub(t1.Round(0)) - t4.Sub(t1); step > time.Millisecond || step < -time.Millisecond {
		// This node's clock stepped during the call: t1 and t4 are on
		// different clocks and the offset would be neither.
		return clockProbe{}, fmt.Errorf("clock probe of member %d: this node's clock stepped by %v during the call", s.id, step)
	}
	if len(resp) != 16 {
		return clockProbe{}, fmt.Errorf("clock answer from member %d: expected 16 bytes, found %d", s.id, len(resp))
	}
	t2 := int64(binary.BigEndian.Uint64(resp))
	t3 := int64(binary.BigEndian.Uint64(resp[8:]))
	// t4 - t1 on the monotonic clock; the rest on wall clocks, as NTP.
	rtt := t4.Sub(t1) - time.Duration(t3-t2)
	if rtt < 0 {
		// The peer's clock ran backwards (or stepped) during the call:
		// no bound can be given.
		return clockProbe{}, fmt.Errorf("clock answer from member %d: peer's reply time %d precedes its arrival time %d by more than the round trip", s.id, t3, t2)
	}
	offset := (time.Duration(t2-t1.UnixNano()) + time.Duration(t3-t4.UnixNano())) / 2
	return clockProbe{offset: offset, rtt: rtt, at: time.Now()}, nil
}

// clockLoop probes the peer every ClockInterval until the sender stops.
func (s *sender) clockLoop() {
	tick := time.NewTicker(s.t.opts.ClockInterval)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(s.ctx, clockProbeTimeout)
		p, err := s.probeClock(ctx)
		cancel()
		if s.ctx.Err() != nil {
			return
		}
		if err == nil {
			b := s.t.clocks.add(s.id, p)
			s.t.metrics.clockOffset.WithLabelValues(s.label).Set(b.offset.Seconds())
			s.t.metrics.clockUncertainty.WithLabelValues(s.label).Set((b.rtt / 2).Seconds())
		}
		select {
		case <-tick.C:
		case <-s.ctx.Done():
			return
		}
	}
}
