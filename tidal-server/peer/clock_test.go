package peer

import (
	"testing"
	"time"
)

// Each node measures its clock offset to
// each peer. Member 1 runs 3s ahead (the test-only ClockOffset); member 2
// sees +3s and member 1 sees -3s, each within the uncertainty the probe
// itself reports (half its round trip), whatever the machine's speed.
func TestClockOffsetMeasured(t *testing.T) {
	p := newPKI(t)
	view := members([]uint64{1, 2})
	const skew = 3 * time.Second
	n1 := startNode(t, 1, p.secured(t, 1, Options{Membership: view, ClockOffset: skew, ClockInterval: 20 * time.Millisecond}))
	n2 := startNode(t, 2, p.secured(t, 2, Options{Membership: view, ClockInterval: 20 * time.Millisecond}))
	n1.t.SetPeer(2, n2.addr)
	n2.t.SetPeer(1, n1.addr)

	check := func(n *node, peer uint64, want time.Duration) {
		t.Helper()
		var s ClockSample
		eventually(t, "a clock sample", func() bool {
			var ok bool
			s, ok = n.t.ClockOffsets()[peer]
			return ok
		})
		// Rounding: the offset is halved in whole nanoseconds.
		if diff := (s.Offset - want).Abs(); diff > s.Uncertainty+time.Microsecond {
			t.Errorf("member %d sees member %d's clock at %v ± %v; expected %v (off by %v)", n.id, peer, s.Offset, s.Uncertainty, want, diff)
		}
		if s.Uncertainty != s.RTT/2 || s.RTT <= 0 || s.Age < 0 {
			t.Errorf("member %d's sample of member %d is inconsistent: %+v", n.id, peer, s)
		}
		// The gauge holds the best sample when it was set, perhaps not
		// this one; every probe is bounded by the 2s timeout of its call,
		// so its uncertainty is below 1s.
		if got := time.Duration(value(n.t.metrics.clockOffset.WithLabelValues(itoa(peer))) * 1e9); (got - want).Abs() >= time.Second {
			t.Errorf("tidal_clock_offset_seconds{peer=%d} = %v; expected %v within 1s", peer, got.Seconds(), want.Seconds())
		}
	}
	check(n2, 1, skew)
	check(n1, 2, -skew)
	// What the server's clock admission reads is the same estimate.
	if r, ok := n2.t.ClockReadings()[1]; !ok || (r.Offset-skew).Abs() > r.Uncertainty+time.Microsecond || r.Uncertainty >= time.Second || r.Age < 0 {
		t.Errorf("ClockReadings()[1] = %+v (%v); expected the offset %v within its uncertainty (< 1s)", r, ok, skew)
	}

	n1.t.RemovePeer(2)
	if _, ok := n1.t.ClockOffsets()[2]; ok {
		t.Error("a removed peer's clock sample is still reported")
	}
}

// The best of the window is the sample with the smallest round trip.
func TestClockKeepsTightestSample(t *testing.T) {
	var c clocks
	c.peers = map[uint64][]clockProbe{}
	now := time.Now()
	c.add(1, clockProbe{offset: 50 * time.Millisecond, rtt: 80 * time.Millisecond, at: now})
	c.add(1, clockProbe{offset: 2 * time.Millisecond, rtt: 4 * time.Millisecond, at: now})
	b := c.add(1, clockProbe{offset: -30 * time.Millisecond, rtt: 60 * time.Millisecond, at: now})
	if b.rtt != 4*time.Millisecond || b.offset != 2*time.Millisecond {
		t.Errorf("best sample %+v; expected the 4ms round trip", b)
	}
	for i := 0; i < clockWindow; i++ {
		b = c.add(1, clockProbe{offset: time.Duration(i), rtt: 10 * time.Millisecond, at: now})
	}
	if b.rtt != 10*time.Millisecond {
		t.Errorf("best sample %+v after the window moved on; expected the old 4ms sample gone", b)
	}
}

// A clock that steps (a jump, or the clock nemesis
// moving the test offset) makes every earlier probe wrong. The tightest
// probe of the window must not outlive the step: the first probe after it
// that cannot be true of the same offset replaces the window.
func TestClockForgetsProbesBeforeAStep(t *testing.T) {
	var c clocks
	c.peers = map[uint64][]clockProbe{}
	now := time.Now()
	c.add(1, clockProbe{offset: time.Millisecond, rtt: 200 * time.Microsecond, at: now})
	c.add(1, clockProbe{offset: 2 * time.Millisecond, rtt: time.Millisecond, at: now})
	b := c.add(1, clockProbe{offset: -5 * time.Minute, rtt: 40 * time.Millisecond, at: now})
	if b.offset != -5*time.Minute {
		t.Fatalf("best sample %+v after the peer's clock stepped by -5m; expected the probe after the step", b)
	}
	if n := len(c.peers[1]); n != 1 {
		t.Errorf("expected only the probe after the step kept, found %d", n)
	}
	// Probes that agree within their uncertainty (and a few ms of slew)
	// keep the window: the tightest wins again.
	b = c.add(1, clockProbe{offset: -5*time.Minute + 3*time.Millisecond, rtt: 2 * time.Millisecond, at: now})
	if b.rtt != 2*time.Millisecond || len(c.peers[1]) != 2 {
		t.Errorf("best sample %+v of %d; expected the 2ms probe of a window of 2", b, len(c.peers[1]))
	}
}
