package main

import (
	"testing"
	"time"
)

// Regression: relay-cpu reported the sender's write
// rate — bytes accepted into its socket buffer over its own write loop —
// as the path's throughput, so bytes still queued in the sender's, the
// relay's and the sink's buffers when the loop ended counted as moved.
// The throughput is what reached the sink, over the time until the last
// byte arrived.
func TestThroughputIsWhatTheSinkReceived(t *testing.T) {
	const warmup = 5 << 20
	start := time.Unix(1000, 0)
	// The sender wrote for 3s; draining the buffers along the path took
	// another second, and the sink received 3 GB after the warm-up.
	sink := sinkReport{Bytes: warmup + 3e9, Last: start.Add(4 * time.Second)}
	bytes, rate := delivered(start, sink, warmup)
	if bytes != 3e9 {
		t.Errorf("expected the 3 GB the sink received after the warm-up, found %d bytes", bytes)
	}
	if rate != 0.75e9 {
		t.Errorf("expected 3 GB over the 4s until the last byte arrived (750 MB/s), found %.0f B/s", rate)
	}
	// Nothing beyond the warm-up arrived: no throughput, not a negative one.
	if bytes, rate := delivered(start, sinkReport{Bytes: warmup / 2, Last: start.Add(time.Second)}, warmup); bytes != 0 || rate != 0 {
		t.Errorf("expected nothing delivered, found %d bytes at %.0f B/s", bytes, rate)
	}
}
