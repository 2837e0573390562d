// Command relay-cpu measures where the CPU goes when one TCP connection
// streams through a relay on loopback, with sender, relay and sink each
// in its own process so that each one's CPU time can be told apart.
// It runs the stream direct, through tcp-relay's relay package, and
// through the smallest splice relay Go offers (io.Copy between two
// TCPConns, which splices), and prints MB/s delivered to the sink and CPU
// seconds per GB delivered for every process. This is the evidence for what a relay costs per
// byte on a given machine, independent of how many cores it has.
//
//	go run ./bench/relay/cpu [-duration 3s] [-rounds 3]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/tcp-relay/relay"
)

func main() {
	role := flag.String("role", "", "internal: sink | relay | copy | send")
	up := flag.String("upstream", "", "internal: address to dial")
	dur := flag.Duration("duration", 3*time.Second, "how long each stream runs")
	rounds := flag.Int("rounds", 3, "how many times to run each variant, interleaved")
	flag.Parse()
	switch *role {
	case "":
		fmt.Printf("one connection, 256 KiB writes, 1 MiB reads, %v per run; MB/s = bytes the sink received / (last arrival - window start); CPU s/GB = user+sys seconds per GB delivered\n\n", *dur)
		fmt.Printf("| %-8s | %8s | %13s | %13s | %13s | %11s |\n", "path", "MB/s", "sender s/GB", "relay s/GB", "sink s/GB", "total s/GB")
		fmt.Println("|----------|----------|---------------|---------------|---------------|-------------|")
		for range *rounds {
			for _, v := range []string{"direct", "relay", "copy"} {
				run(v, *dur)
			}
		}
	case "sink":
		// One line per connection once it ends: the bytes that arrived
		// and when the last of them did.
		serve(func(c net.Conn) {
			buf := make([]byte, 1<<20)
			var got sinkReport
			for {
				n, err := c.Read(buf)
				if n > 0 {
					got.Bytes += int64(n)
					got.Last = time.Now()
				}
				if err != nil {
					fmt.Printf("%d %d\n", got.Bytes, got.Last.UnixNano())
					return
				}
			}
		})
	case "copy":
		serve(func(c net.Conn) {
			s, err := net.Dial("tcp", *up)
			if err != nil {
				return
			}
			defer s.Close()
			go func() { io.Copy(c, s); c.Close() }()
			io.Copy(s, c)
		})
	case "relay":
		r, err := relay.Listen(relay.Config{Name: "cpu", Listen: "127.0.0.1:0", Upstream: *up,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		check(err)
		fmt.Println(r.Addr())
		waitInterrupt()
		r.Close()
	case "send":
		c, err := net.Dial("tcp", *up)
		check(err)
		buf := make([]byte, 256<<10)
		for range warmupWrites { // warm up: socket buffers grown, pipes made
			_, err := c.Write(buf)
			check(err)
		}
		start := time.Now()
		for time.Since(start) < *dur {
			_, err := c.Write(buf)
			check(err)
		}
		// The FIN follows the last byte through the path: the sink's
		// report comes once everything written was delivered.
		check(c.(*net.TCPConn).CloseWrite())
		fmt.Println(start.UnixNano())
	}
}

// warmupWrites 256 KiB writes precede the measured window.
const warmupWrites = 20

// sinkReport is what the sink saw on the one connection of a run.
type sinkReport struct {
	Bytes int64     // every byte that arrived, warm-up included
	Last  time.Time // when the last one did
}

// delivered is the throughput of a run: the bytes the sink received after
// the warm-up's, over the time from the start of the sender's measured
// window to the last byte's arrival — what went through the path, not
// what the sender managed to write into its socket buffer. Warm-up bytes
// still in flight when the window opens make it err low, never high.
func delivered(start time.Time, sink sinkReport, warmup int64) (bytes int64, rate float64) {
	bytes = sink.Bytes - warmup
	if secs := sink.Last.Sub(start).Seconds(); bytes > 0 && secs > 0 {
		rate = float64(bytes) / secs
	}
	return max(bytes, 0), rate
}

// run streams once along path v and prints a table row.
func run(v string, d time.Duration) {
	sink, sinkAddr, sinkOut := start("-role", "sink")
	target, relayProc := sinkAddr, (*exec.Cmd)(nil)
	if v != "direct" {
		relayProc, target, _ = start("-role", v, "-upstream", sinkAddr)
	}
	send := exec.Command(os.Args[0], "-role", "send", "-upstream", target, "-duration", d.String())
	send.Stderr = os.Stderr
	out, err := send.Output()
	check(err)
	startNS, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	check(err)
	line, err := sinkOut.ReadString('\n')
	check(err)
	var got sinkReport
	var lastNS int64
	_, err = fmt.Sscan(line, &got.Bytes, &lastNS)
	check(err)
	got.Last = time.Unix(0, lastNS)
	_, rate := delivered(time.Unix(0, startNS), got, warmupWrites*256<<10)
	// CPU per GB of everything the sink received: the processes' CPU
	// covers the warm-up too.
	gb := float64(got.Bytes) / 1e9
	perGB := func(c *exec.Cmd) float64 { return cpu(c) / gb }
	relayCPU := 0.0
	if relayProc != nil {
		relayCPU = stop(relayProc) / gb
	}
	sinkCPU := stop(sink) / gb
	fmt.Printf("| %-8s | %8.0f | %13.2f | %13.2f | %13.2f | %11.2f |\n", v, rate/1e6, perGB(send), relayCPU, sinkCPU, perGB(send)+relayCPU+sinkCPU)
}

// start runs this binary in a role and returns it with the address it
// printed and the rest of its output.
func start(args ...string) (*exec.Cmd, string, *bufio.Reader) {
	c := exec.Command(os.Args[0], args...)
	c.Stderr = os.Stderr
	out, err := c.StdoutPipe()
	check(err)
	check(c.Start())
	rd := bufio.NewReader(out)
	addr, err := rd.ReadString('\n')
	check(err)
	return c, strings.TrimSpace(addr), rd
}

// stop interrupts c, waits for it and returns its CPU seconds.
func stop(c *exec.Cmd) float64 {
	_ = c.Process.Signal(os.Interrupt)
	_ = c.Wait()
	return cpu(c)
}

func cpu(c *exec.Cmd) float64 {
	u := c.ProcessState.SysUsage().(*syscall.Rusage)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano()).Seconds()
}

// serve accepts on a fresh loopback port, prints it, and handles each
// connection with h until interrupted.
func serve(h func(net.Conn)) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	fmt.Println(ln.Addr())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); h(c) }()
		}
	}()
	waitInterrupt()
	ln.Close()
}

func waitInterrupt() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt)
	<-ch
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
