package main

import (
	"syscall"
	"testing"
)

// TestPingPongThreadsEchoesAndEnds: the thread ping-pong completes its
// round trips (each byte comes back) and the echo side ends when its
// input is closed, so the measurement neither hangs nor leaks a thread.
func TestPingPongThreadsEchoesAndEnds(t *testing.T) {
	var a, b [2]int
	if err := syscall.Pipe(a[:]); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Pipe(b[:]); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { echo(a[0], b[1]); close(done) }()
	if d := ping(b[0], a[1], 100); d <= 0 {
		t.Fatalf("round trip %v", d)
	}
	syscall.Close(a[1])
	<-done
	for _, fd := range []int{a[0], b[0], b[1]} {
		syscall.Close(fd)
	}
}
