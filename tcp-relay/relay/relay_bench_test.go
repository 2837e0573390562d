package relay

import (
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// target returns the address to dial for a benchmark: the server itself
// ("direct") or a relay in front of it.
func target(b *testing.B, mode string, s *server) string {
	if mode == "direct" {
		return s.addr()
	}
	return startRelay(b, s.addr()).Addr().String()
}

func BenchmarkThroughput(b *testing.B) {
	for _, mode := range []string{"direct", "relay"} {
		b.Run(mode, func(b *testing.B) {
			s := startServer(b, true)
			c, err := net.Dial("tcp", target(b, mode, s))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, 256<<10)
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			want := int64(b.N) * int64(len(buf))
			for s.received.Load() < want {
				time.Sleep(100 * time.Microsecond)
			}
		})
	}
}

func BenchmarkRoundTrip1B(b *testing.B) {
	for _, mode := range []string{"direct", "relay"} {
		b.Run(mode, func(b *testing.B) {
			s := startServer(b, false)
			c, err := net.Dial("tcp", target(b, mode, s))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			one := []byte{1}
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				c.Write(one)
				if _, err := io.ReadFull(c, one); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

func BenchmarkConnect(b *testing.B) {
	for _, mode := range []string{"direct", "relay"} {
		b.Run(mode, func(b *testing.B) {
			s := startServer(b, false)
			addr := target(b, mode, s)
			one := []byte{1}
			for b.Loop() {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					b.Fatal(err)
				}
				c.Write(one)
				if _, err := io.ReadFull(c, one); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
		})
	}
}

// BenchmarkFaultOnBusyConnection times AddFault+RemoveFault of a
// blackhole while one connection ping-pongs as fast as it can.
func BenchmarkFaultOnBusyConnection(b *testing.B) {
	s := startServer(b, false)
	r := startRelay(b, s.addr())
	c, err := net.Dial("tcp", r.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		one := []byte{1}
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.Write(one)
			io.ReadFull(c, one)
		}
	}()
	f, _ := Spec{Name: "bh", Type: "blackhole"}.Fault()
	for b.Loop() {
		if _, err := r.AddFault(f); err != nil {
			b.Fatal(err)
		}
		if _, err := r.RemoveFault("bh"); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	close(stop)
	c.Close()
	<-done
}
