// Command relay-cpu measures where the CPU goes when one TCP connection
// streams through a relay on loopback, with sender, relay and sink each
// in its own process so that each one's CPU time can be told apart.
// It runs the stream direct, through tcp-relay's relay package, and
// through the smallest splice relay Go offers (io.Copy between two
// TCPConns, which splices), and prints MB/s and CPU seconds per GB moved
// for every process. This is the evidence for what a relay costs per
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
		fmt.Printf("one connection, 256 KiB writes, 1 MiB reads, %v per run; CPU s/GB = user+sys seconds per GB delivered\n\n", *dur)
		fmt.Printf("| %-8s | %8s | %13s | %13s | %13s | %11s |\n", "path", "MB/s", "sender s/GB", "relay s/GB", "sink s/GB", "total s/GB")
		fmt.Println("|----------|----------|---------------|---------------|---------------|-------------|")
		for range *rounds {
			for _, v := range []string{"direct", "relay", "copy"} {
				run(v, *dur)
			}
		}
	case "sink":
		serve(func(c net.Conn) {
			buf := make([]byte, 1<<20)
			for {
				if _, err := c.Read(buf); err != nil {
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
		for range 20 { // warm up: socket buffers grown, pipes made
			_, err := c.Write(buf)
			check(err)
		}
		var n int64
		start := time.Now()
		for time.Since(start) < *dur {
			m, err := c.Write(buf)
			n += int64(m)
			check(err)
		}
		fmt.Println(float64(n) / time.Since(start).Seconds())
	}
}

// run streams once along path v and prints a table row.
func run(v string, d time.Duration) {
	sink, sinkAddr := start("-role", "sink")
	target, relayProc := sinkAddr, (*exec.Cmd)(nil)
	if v != "direct" {
		relayProc, target = start("-role", v, "-upstream", sinkAddr)
	}
	send := exec.Command(os.Args[0], "-role", "send", "-upstream", target, "-duration", d.String())
	send.Stderr = os.Stderr
	out, err := send.Output()
	check(err)
	rate, err := strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	check(err)
	// Bytes delivered over the measured window; the warm-up's CPU is
	// included, so s/GB errs high by the warm-up's share (5 MiB).
	gb := rate * d.Seconds() / 1e9
	perGB := func(c *exec.Cmd) float64 { return cpu(c) / gb }
	relayCPU := 0.0
	if relayProc != nil {
		relayCPU = stop(relayProc) / gb
	}
	sinkCPU := stop(sink) / gb
	fmt.Printf("| %-8s | %8.0f | %13.2f | %13.2f | %13.2f | %11.2f |\n", v, rate/1e6, perGB(send), relayCPU, sinkCPU, perGB(send)+relayCPU+sinkCPU)
}

// start runs this binary in a role and returns it with the address it
// printed.
func start(args ...string) (*exec.Cmd, string) {
	c := exec.Command(os.Args[0], args...)
	c.Stderr = os.Stderr
	out, err := c.StdoutPipe()
	check(err)
	check(c.Start())
	addr, err := bufio.NewReader(out).ReadString('\n')
	check(err)
	return c, strings.TrimSpace(addr)
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
