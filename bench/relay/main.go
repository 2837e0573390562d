// Command relay-bench measures tcp-relay against direct loopback.
//
// With no mode flag it runs everything in one process and prints a table
// with ratios to direct: 1-byte round trip p50/p99, bulk throughput on one
// connection, connections per second, and the time from a control-API call
// to a fault acting on a busy connection:
//
//	go run ./bench/relay [-duration 2s]
//
// The side-by-side benchmark (`./ci/bench -side-by-side`, see
// bench/README.md) instead runs each part in its own process: the servers
// (-serve), tcp-relay and Toxiproxy with relays created through their HTTP
// APIs, and the measuring client (-measure), which prints JSON:
//
//	relay-bench -serve -echo 127.0.0.1:9001 -sink 127.0.0.1:9002
//	relay-bench -measure -target tcp-relay -echo <relay of 9001> -sink <relay of 9002> -duration 2s
//
// -ab compares tcp-relay builds (and Toxiproxy) phase by phase with the
// relay's CPU time per unit of work (ab.go):
//
//	relay-bench -ab old=/tmp/tcp-relay-old,new=bin/tcp-relay -toxiproxy bin/toxiproxy/server -rounds 5
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/bench/relay/probe"
	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tcp-relay/relay"
)

func main() {
	dur := flag.Duration("duration", 2*time.Second, "how long each measurement runs")
	serveMode := flag.Bool("serve", false, "serve echo on -echo and sink on -sink until SIGTERM")
	measureMode := flag.Bool("measure", false, "measure against -echo and -sink and print JSON")
	echoAddr := flag.String("echo", "127.0.0.1:0", "echo server address (to serve, or to measure through)")
	sinkAddr := flag.String("sink", "127.0.0.1:0", "sink server address (to serve, or to measure through)")
	target := flag.String("target", "direct", "-measure: the name the JSON gives what was measured")
	phases := flag.String("phases", strings.Join(probe.Phases, ","), "-measure, -ab: the measurements to run")
	ab := flag.String("ab", "", "compare relay builds: name=tcp-relay-binary[,name=binary...] (see ab.go)")
	toxiproxy := flag.String("toxiproxy", "", "-ab: also compare Toxiproxy's server binary")
	rounds := flag.Int("rounds", 5, "-ab: rounds, the order of the targets rotating")
	abOut := flag.String("ab-out", "", "-ab: write every run as JSON to this file")
	flag.Parse()
	var err error
	switch {
	case *serveMode:
		err = serveUntilSignal(*echoAddr, *sinkAddr)
	case *ab != "":
		err = runAB(*ab, *toxiproxy, *rounds, *dur, strings.Split(*phases, ","), *abOut)
	case *measureMode:
		var m probe.Measurement
		if m, err = probe.MeasurePhases(*target, *echoAddr, *sinkAddr, *dur, strings.Split(*phases, ",")); err == nil {
			err = json.NewEncoder(os.Stdout).Encode(m)
		}
	default:
		err = inProcess(*dur)
	}
	if err != nil {
		log.Fatal(err)
	}
}

func serveUntilSignal(echoAddr, sinkAddr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e, err := probe.Listen(echoAddr, probe.Echo)
	if err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	defer e.Close()
	s, err := probe.Listen(sinkAddr, probe.Sink)
	if err != nil {
		return fmt.Errorf("sink: %w", err)
	}
	defer s.Close()
	fmt.Printf("echo %s sink %s\n", e.Addr(), s.Addr())
	<-ctx.Done()
	return nil
}

// inProcess is the quick table: servers, relay and client in this process.
func inProcess(d time.Duration) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := probe.Listen("127.0.0.1:0", probe.Echo)
	if err != nil {
		return err
	}
	s, err := probe.Listen("127.0.0.1:0", probe.Sink)
	if err != nil {
		return err
	}
	srv := control.NewServer(quiet)
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go http.Serve(ln, srv.Handler())
	api := control.NewClient(ln.Addr().String(), nil)
	ctx := context.Background()
	echoRelay, err := api.CreateRelay(ctx, control.RelayConfig{Name: "echo", Listen: "127.0.0.1:0", Upstream: e.Addr().String()})
	if err != nil {
		return err
	}
	sinkRelay, err := api.CreateRelay(ctx, control.RelayConfig{Name: "sink", Listen: "127.0.0.1:0", Upstream: s.Addr().String()})
	if err != nil {
		return err
	}
	direct, err := probe.Measure("direct", e.Addr().String(), s.Addr().String(), d)
	if err != nil {
		return err
	}
	relayed, err := probe.Measure("tcp-relay", echoRelay.Listen, sinkRelay.Listen, d)
	if err != nil {
		return err
	}

	fmt.Printf("tcp-relay vs direct loopback, all in one process, %v per measurement\n\n", d)
	fmt.Printf("| %-28s | %12s | %12s | %12s |\n", "measure", "direct", "relay", "relay/direct")
	fmt.Printf("|%s|%s|%s|%s|\n", dashes(30), dashes(14), dashes(14), dashes(14))
	row := func(name string, d, r float64) {
		fmt.Printf("| %-28s | %12.1f | %12.1f | %12.2f |\n", name, d, r, r/d)
	}
	row("bulk, 1 conn (MB/s)", direct.BulkMBps, relayed.BulkMBps)
	row("1-byte round trip p50 (µs)", direct.RTTP50us, relayed.RTTP50us)
	row("1-byte round trip p99 (µs)", direct.RTTP99us, relayed.RTTP99us)
	row("connections/s (dial+echo)", direct.ConnsPerSec, relayed.ConnsPerSec)

	call, act, err := faultLatency(api, echoRelay.Listen)
	if err != nil {
		return err
	}
	fmt.Printf("\nfault on a busy connection (blackhole via HTTP API, 20 tries):\n")
	fmt.Printf("  API call returned after      p50 %v  max %v\n", pct(call, 50), pct(call, 100))
	fmt.Printf("  last echo completed after    p50 %v  max %v (time from the call to the fault acting, bounded above)\n", pct(act, 50), pct(act, 100))
	fmt.Printf("  added round trip at p50: %.1f µs\n", relayed.RTTP50us-direct.RTTP50us)
	return nil
}

func dashes(n int) string { return string(slices.Repeat([]byte{'-'}, n)) }

// faultLatency ping-pongs on one connection and blackholes it through the
// API: call is how long the API call took, act how long after the call
// started the last echo completed (the fault acted no later than that
// echo's request was read, so act bounds the acting time from above).
func faultLatency(api *control.Client, addr string) (call, act []time.Duration, err error) {
	ctx := context.Background()
	for range 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, nil, err
		}
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
		if _, err := api.AddFault(ctx, "echo", relay.Spec{Name: "cut", Type: "blackhole"}); err != nil {
			return nil, nil, err
		}
		call = append(call, time.Since(t0))
		time.Sleep(50 * time.Millisecond)
		act = append(act, max(0, time.Unix(0, last.Load()).Sub(t0)))
		if _, err := api.RemoveFault(ctx, "echo", "cut"); err != nil {
			return nil, nil, err
		}
		c.Close()
		<-done
	}
	return call, act, nil
}

func pct(ds []time.Duration, q int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)*q/100, len(s)-1)
	return s[i].Round(time.Microsecond)
}
