// Command switchcost measures what a hop costs on this machine without
// any relay code: a null system call, and a 1-byte ping-pong over pipes
// between two threads of one process and between two processes (blocking
// reads, so every round trip is two sleeps and two wake-ups). The
// difference between the two ping-pongs is what putting a hop in another
// process costs (bench/results/history-2026-12.md, "tcp-relay on a quiet
// machine").
//
//	go run ./bench/relay/switchcost [-n 20000]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

func main() {
	n := flag.Int("n", 20000, "round trips per measurement")
	child := flag.Bool("child", false, "internal: echo on fds 3 -> 4")
	flag.Parse()
	if *child {
		echo(3, 4)
		return
	}
	runtime.LockOSThread()
	start, cpu0 := time.Now(), threadCPU()
	for range *n * 10 {
		syscall.RawSyscall(syscall.SYS_GETPPID, 0, 0, 0)
	}
	fmt.Printf("null syscall (getppid): %.2f µs wall, %.2f µs CPU\n",
		us(time.Since(start))/float64(*n*10), us(threadCPU()-cpu0)/float64(*n*10))
	runtime.UnlockOSThread()

	var a, b [2]int
	must(syscall.Pipe(a[:]))
	must(syscall.Pipe(b[:]))
	go echo(a[0], b[1])
	fmt.Printf("ping-pong, two threads of one process: %.1f µs per round trip\n", us(ping(b[0], a[1], *n)))
	syscall.Close(a[1])

	var c, d [2]int
	must(syscall.Pipe(c[:]))
	must(syscall.Pipe(d[:]))
	self, err := os.Executable()
	must(err)
	cmd := exec.Command(self, "-child")
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(c[0]), "r"), os.NewFile(uintptr(d[1]), "w")}
	must(cmd.Start())
	fmt.Printf("ping-pong, two processes: %.1f µs per round trip\n", us(ping(d[0], c[1], *n)))
	syscall.Close(c[1])
	_ = cmd.Wait()
}

func echo(r, w int) {
	runtime.LockOSThread()
	buf := make([]byte, 1)
	for {
		if k, _ := syscall.Read(r, buf); k <= 0 {
			return
		}
		_, _ = syscall.Write(w, buf)
	}
}

func ping(r, w, n int) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := make([]byte, 1)
	t := time.Now()
	for range n {
		_, _ = syscall.Write(w, buf)
		_, _ = syscall.Read(r, buf)
	}
	return time.Since(t) / time.Duration(n)
}

func threadCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
