package probe

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

func TestQuantileNearestRank(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		ds = append(ds, time.Duration(i)*time.Microsecond)
	}
	for q, want := range map[float64]time.Duration{0.5: 50 * time.Microsecond, 0.99: 99 * time.Microsecond, 0.999: 100 * time.Microsecond, 0: time.Microsecond} {
		if got := quantile(ds, q); got != want {
			t.Errorf("quantile(1..100 µs, %g): expected %s, found %s", q, want, got)
		}
	}
	if ds[0] != 100*time.Microsecond {
		t.Errorf("expected quantile to leave its input unsorted, found it reordered")
	}
	if got := quantile(nil, 0.5); got != 0 {
		t.Errorf("expected 0 for no samples, found %s", got)
	}
}

// TestSinkAcknowledgesEachTransfer: the sink answers one byte per framed
// transfer, only once all of its bytes arrived.
func TestSinkAcknowledgesEachTransfer(t *testing.T) {
	ln, err := Listen("127.0.0.1:0", Sink)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, size := range []int{1, 3 << 20} {
		var hdr [8]byte
		binary.BigEndian.PutUint64(hdr[:], uint64(size))
		c.Write(hdr[:])
		body := make([]byte, size)
		c.Write(body[:size-1])
		// One byte short: no answer may come yet.
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		var ack [1]byte
		if n, err := c.Read(ack[:]); n != 0 || err == nil {
			t.Fatalf("transfer of %d bytes: expected no acknowledgement before the last byte, found %d bytes (%v)", size, n, err)
		}
		c.SetReadDeadline(time.Time{})
		c.Write(body[size-1:])
		if _, err := io.ReadFull(c, ack[:]); err != nil || ack[0] != 1 {
			t.Fatalf("transfer of %d bytes: expected the acknowledgement byte, found %v %v", size, ack, err)
		}
	}
}

// TestMeasureDirect runs every measurement against in-process servers with
// no time to spend: each still does its minimum, so the figures exist
// whatever the machine's load (their size is not checked).
func TestMeasureDirect(t *testing.T) {
	e, err := Listen("127.0.0.1:0", Echo)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := Listen("127.0.0.1:0", Sink)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := Measure("direct", e.Addr().String(), s.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if m.Target != "direct" || m.RTTSamples != MinRounds-MinRounds/10 {
		t.Errorf("expected %d ping-pong samples kept of %d, found %d (%+v)", MinRounds-MinRounds/10, MinRounds, m.RTTSamples, m)
	}
	if !(m.RTTP50us > 0 && m.RTTP50us <= m.RTTP99us && m.RTTP99us <= m.RTTP999us) {
		t.Errorf("expected 0 < p50 ≤ p99 ≤ p99.9, found %+v", m)
	}
	if m.BulkMBps <= 0 || m.ConnsPerSec <= 0 || m.ConnErrors != 0 {
		t.Errorf("expected bulk and connection rates with no failures, found %+v", m)
	}
}

// TestMeasureFailsWithoutAServer: a dead address is an error, not zeros.
func TestMeasureFailsWithoutAServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if _, err := Measure("gone", addr, addr, 0); err == nil {
		t.Fatalf("expected measuring against a closed port to fail")
	}
}
