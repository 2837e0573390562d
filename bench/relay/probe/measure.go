package probe

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"time"
)

// Measurement is what one client run measured against one address pair
// (echo, sink): direct, or through a relay.
type Measurement struct {
	Target string `json:"target"` // direct, tcp-relay, toxiproxy
	// 1-byte ping-pong on one connection, warm-up (the first tenth)
	// dropped; microseconds.
	RTTSamples int     `json:"rtt_samples"`
	RTTCount   int     `json:"rtt_count,omitempty"` // round trips made, warm-up included
	RTTP50us   float64 `json:"rtt_p50_us"`
	RTTP99us   float64 `json:"rtt_p99_us"`
	RTTP999us  float64 `json:"rtt_p999_us"`
	// Bulk: one connection, 256 KiB writes, 16 MiB transfers each
	// acknowledged by the sink; MB/s of bytes the sink confirmed.
	BulkMBps  float64 `json:"bulk_mb_per_s"`
	BulkBytes int64   `json:"bulk_bytes,omitempty"` // moved in all, warm-up transfer included
	// Connections: dial, 1-byte echo, close, one after the other.
	ConnsPerSec float64 `json:"conns_per_s"`
	// The same with ParallelClients clients at once (phase conns16), each
	// its own closed loop: the relay's CPU per connection, not its
	// latency, bounds this rate. Conns and ConnErrors count whichever of
	// the two connection phases ran last.
	ParallelConnsPerSec float64 `json:"parallel_conns_per_s,omitempty"`
	Conns               int     `json:"conns,omitempty"` // completed
	ConnErrors          int     `json:"conn_errors"`
	ConnError           string  `json:"conn_error,omitempty"` // the first one
}

// Measure runs the three measurements one after the other, d each (at
// least a minimum of rounds each), against an echo and a sink server,
// direct or through a relay; target names what is measured.
func Measure(target, echoAddr, sinkAddr string, d time.Duration) (Measurement, error) {
	return MeasurePhases(target, echoAddr, sinkAddr, d, Phases)
}

// Phases are the measurements Measure runs, in its order: 1-byte round
// trips, bulk throughput, connections per second.
var Phases = []string{"rtt", "bulk", "conns"}

// ExtraPhases can be asked for by name but are not part of Measure:
// "conns16" is connections/s with 16 clients at once (each a closed loop
// of dial, 1-byte echo, close), where the relay's CPU per connection
// rather than its latency bounds the rate.
var ExtraPhases = []string{"conns16"}

// ParallelClients is the number of clients of the conns16 phase.
const ParallelClients = 16

// MeasurePhases runs only the named phases (of Phases), in the order of
// Phases. One phase at a time lets a caller attribute the relay's CPU time
// to one kind of work (bench/relay -ab).
func MeasurePhases(target, echoAddr, sinkAddr string, d time.Duration, phases []string) (Measurement, error) {
	m := Measurement{Target: target}
	for _, ph := range phases {
		if !slices.Contains(Phases, ph) && !slices.Contains(ExtraPhases, ph) {
			return m, fmt.Errorf("phase: expected one of %v or %v, found %q", Phases, ExtraPhases, ph)
		}
	}
	if slices.Contains(phases, "rtt") {
		lat, total, err := pingPong(echoAddr, d)
		if err != nil {
			return m, fmt.Errorf("%s: ping-pong via %s: %w", target, echoAddr, err)
		}
		m.RTTCount, m.RTTSamples = total, len(lat)
		m.RTTP50us, m.RTTP99us, m.RTTP999us = micros(quantile(lat, 0.50)), micros(quantile(lat, 0.99)), micros(quantile(lat, 0.999))
	}
	if slices.Contains(phases, "bulk") {
		var err error
		if m.BulkMBps, m.BulkBytes, err = bulk(sinkAddr, d); err != nil {
			return m, fmt.Errorf("%s: bulk via %s: %w", target, sinkAddr, err)
		}
	}
	if slices.Contains(phases, "conns") {
		var first error
		m.ConnsPerSec, m.Conns, m.ConnErrors, first = connRate(echoAddr, d)
		if first != nil {
			m.ConnError = first.Error()
		}
		if m.ConnsPerSec == 0 {
			return m, fmt.Errorf("%s: no connection via %s completed an echo: %v", target, echoAddr, first)
		}
	}
	if slices.Contains(phases, "conns16") {
		var first error
		m.ParallelConnsPerSec, m.Conns, m.ConnErrors, first = parallelConnRate(echoAddr, d, ParallelClients)
		if first != nil {
			m.ConnError = first.Error()
		}
		if m.ParallelConnsPerSec == 0 {
			return m, fmt.Errorf("%s: no connection via %s completed an echo: %v", target, echoAddr, first)
		}
	}
	return m, nil
}

// parallelConnRate runs connRate in k clients at once and sums them.
func parallelConnRate(addr string, d time.Duration, k int) (perSec float64, n, failed int, first error) {
	type result struct {
		rate      float64
		n, failed int
		first     error
	}
	results := make(chan result, k)
	for range k {
		go func() {
			var r result
			r.rate, r.n, r.failed, r.first = connRate(addr, d)
			results <- r
		}()
	}
	for range k {
		r := <-results
		perSec += r.rate
		n += r.n
		failed += r.failed
		if first == nil {
			first = r.first
		}
	}
	return perSec, n, failed, first
}

// MinRounds is the least each measurement does however short d is, so
// that a stalled machine yields a poor figure rather than none.
const MinRounds = 10

// pingPong sends one byte and waits for its echo, over and over, on one
// connection for d (and at least MinRounds times), and returns the round
// trips after the first tenth, and how many it made.
func pingPong(addr string, d time.Duration) ([]time.Duration, int, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	one := []byte{1}
	var lat []time.Duration
	for start := time.Now(); len(lat) < MinRounds || time.Since(start) < d; {
		t := time.Now()
		if _, err := c.Write(one); err != nil {
			return nil, 0, err
		}
		if _, err := io.ReadFull(c, one); err != nil {
			return nil, 0, err
		}
		lat = append(lat, time.Since(t))
	}
	return lat[len(lat)/10:], len(lat), nil
}

// transferSize is one acknowledged bulk transfer: large enough that the
// acknowledging round trip is noise (16 MiB at 1 GB/s is 16 ms against a
// round trip of tens of µs).
const transferSize = 16 << 20

// bulk streams transfers to the sink for about d (at least one) after one
// warm-up transfer, and returns MB/s of the bytes the sink acknowledged
// after the warm-up, and the bytes moved in all.
func bulk(addr string, d time.Duration) (float64, int64, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	transfer := func() error {
		var hdr [8]byte
		binary.BigEndian.PutUint64(hdr[:], transferSize)
		if _, err := c.Write(hdr[:]); err != nil {
			return err
		}
		for left := transferSize; left > 0; left -= len(buf) {
			if _, err := c.Write(buf[:min(len(buf), left)]); err != nil {
				return err
			}
		}
		var ack [1]byte
		_, err := io.ReadFull(c, ack[:])
		return err
	}
	if err := transfer(); err != nil {
		return 0, 0, err
	}
	var bytes int64
	start := time.Now()
	for bytes == 0 || time.Since(start) < d {
		if err := transfer(); err != nil {
			return 0, 0, err
		}
		bytes += transferSize
	}
	return float64(bytes) / time.Since(start).Seconds() / 1e6, bytes + transferSize, nil
}

// connRate opens a connection, echoes one byte and closes it, over and
// over for d (at least MinRounds times), and returns completed connections
// per second, how many completed, how many failed and the first failure.
func connRate(addr string, d time.Duration) (perSec float64, n, failed int, first error) {
	one := []byte{1}
	start := time.Now()
	for n+failed < MinRounds || time.Since(start) < d {
		err := func() error {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(one); err != nil {
				return err
			}
			_, err = io.ReadFull(c, one)
			return err
		}()
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
			continue
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), n, failed, first
}

// quantile is the q-quantile (0..1) of ds by the nearest-rank rule.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(q * float64(len(s))))
	return s[min(max(rank-1, 0), len(s)-1)]
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
