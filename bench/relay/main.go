// Command relay-bench measures tcp-relay against direct loopback in one
// run and prints a side-by-side table with ratios to direct:
// single-connection throughput, 1-byte round trip p50/p99, connections
// per second, and the time from a control-API call to a fault acting on a
// busy connection.
//
//	go run ./bench/relay [-duration 2s]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tcp-relay/relay"
)

func main() {
	dur := flag.Duration("duration", 2*time.Second, "how long each measurement runs")
	flag.Parse()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	echo := serve(func(c net.Conn) { io.Copy(c, c) })
	var sunk atomic.Int64
	sink := serve(func(c net.Conn) {
		buf := make([]byte, 1<<20)
		for {
			n, err := c.Read(buf)
			sunk.Add(int64(n))
			if err != nil {
				return
			}
		}
	})

	srv := control.NewServer(quiet)
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	go http.Serve(ln, srv.Handler())
	api := control.NewClient(ln.Addr().String(), nil)
	ctx := context.Background()
	echoRelay, err := api.CreateRelay(ctx, control.RelayConfig{Name: "echo", Listen: "127.0.0.1:0", Upstream: echo})
	check(err)
	sinkRelay, err := api.CreateRelay(ctx, control.RelayConfig{Name: "sink", Listen: "127.0.0.1:0", Upstream: sink})
	check(err)

	fmt.Printf("tcp-relay vs direct loopback, %v per measurement, GOMAXPROCS cores as given\n\n", *dur)
	fmt.Printf("| %-28s | %12s | %12s | %8s |\n", "measure", "direct", "relay", "relay/direct")
	fmt.Printf("|%s|%s|%s|%s|\n", dashes(30), dashes(14), dashes(14), dashes(10))
	row := func(name string, d, r float64, unit string) {
		fmt.Printf("| %-28s | %9.1f %-2s | %9.1f %-2s | %8.2f |\n", name, d, unit, r, unit, r/d)
	}

	td, tr := throughput(sink, &sunk, *dur), throughput(sinkRelay.Listen, &sunk, *dur)
	row("throughput, 1 conn (MB/s)", td, tr, "")
	d50, d99 := rtt(echo, *dur)
	r50, r99 := rtt(echoRelay.Listen, *dur)
	row("1-byte round trip p50 (µs)", d50, r50, "")
	row("1-byte round trip p99 (µs)", d99, r99, "")
	row("connections/s (dial+echo)", connRate(echo, *dur), connRate(echoRelay.Listen, *dur), "")

	call, act := faultLatency(api, echoRelay.Listen)
	fmt.Printf("\nfault on a busy connection (blackhole via HTTP API, 20 tries):\n")
	fmt.Printf("  API call returned after      p50 %v  max %v\n", pct(call, 50), pct(call, 100))
	fmt.Printf("  last echo completed after    p50 %v  max %v (time from the call to the fault acting, bounded above)\n", pct(act, 50), pct(act, 100))
	fmt.Printf("  added round trip at p50: %.1f µs\n", r50-d50)
}

func dashes(n int) string { return string(slices.Repeat([]byte{'-'}, n)) }

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

func serve(h func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { h(c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

// throughput streams into the sink for d and returns MB/s received.
func throughput(addr string, sunk *atomic.Int64, d time.Duration) float64 {
	c, err := net.Dial("tcp", addr)
	check(err)
	defer c.Close()
	buf := make([]byte, 256<<10)
	c.Write(buf) // warm up
	time.Sleep(50 * time.Millisecond)
	start, from := time.Now(), sunk.Load()
	for time.Since(start) < d {
		if _, err := c.Write(buf); err != nil {
			check(err)
		}
	}
	return float64(sunk.Load()-from) / time.Since(start).Seconds() / 1e6
}

func rtt(addr string, d time.Duration) (p50, p99 float64) {
	c, err := net.Dial("tcp", addr)
	check(err)
	defer c.Close()
	one := []byte{1}
	var lat []time.Duration
	for start := time.Now(); time.Since(start) < d; {
		t := time.Now()
		c.Write(one)
		_, err := io.ReadFull(c, one)
		check(err)
		lat = append(lat, time.Since(t))
	}
	lat = lat[len(lat)/10:] // drop warm-up
	slices.Sort(lat)
	us := func(q int) float64 { return float64(lat[len(lat)*q/100].Nanoseconds()) / 1e3 }
	return us(50), us(99)
}

func connRate(addr string, d time.Duration) float64 {
	n := 0
	one := []byte{1}
	start := time.Now()
	for time.Since(start) < d {
		c, err := net.Dial("tcp", addr)
		check(err)
		c.Write(one)
		_, err = io.ReadFull(c, one)
		check(err)
		c.Close()
		n++
	}
	return float64(n) / time.Since(start).Seconds()
}

// faultLatency ping-pongs on one connection and blackholes it through the
// API: call is how long the API call took, act how long after the call
// started the last echo completed (the fault acted no later than that
// echo's request was read, so act bounds the acting time from above).
func faultLatency(api *control.Client, addr string) (call, act []time.Duration) {
	ctx := context.Background()
	for range 20 {
		c, err := net.Dial("tcp", addr)
		check(err)
		var last atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			one := []byte{1}
			for {
				if _, err := c.Write(one); err != nil {
					return
				}
				if _, err := io.ReadFull(c, one); err != nil {
					return
				}
				last.Store(time.Now().UnixNano())
			}
		}()
		time.Sleep(20 * time.Millisecond)
		t0 := time.Now()
		_, err = api.AddFault(ctx, "echo", relay.Spec{Name: "cut", Type: "blackhole"})
		check(err)
		call = append(call, time.Since(t0))
		time.Sleep(50 * time.Millisecond)
		act = append(act, max(0, time.Unix(0, last.Load()).Sub(t0)))
		_, err = api.RemoveFault(ctx, "echo", "cut")
		check(err)
		c.Close()
		<-done
	}
	return call, act
}

func pct(ds []time.Duration, q int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)*q/100, len(s)-1)
	return s[i].Round(time.Microsecond)
}

func init() { log.SetOutput(os.Stderr) }
