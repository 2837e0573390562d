package ledger

import (
	"syscall"
	"testing"
	"time"
)

// processCPU is the user + system CPU time this process has used. On the
// shared 2-core machine wall-clock ns/op swings by 3× with other
// engineers' load; CPU time per op (which also counts the garbage
// collector's work on other threads) moves far less.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process CPU per unit since start (call it where
// the timer starts; StopTimer regions are counted too, so keep them
// rare).
func reportCPU(b *testing.B, start time.Duration, units int, unit string) {
	b.ReportMetric(float64((processCPU()-start).Nanoseconds())/float64(units), "cpu-ns/"+unit)
}
