package workload

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A closed loop calls every worker's step back to back until issue ends,
// and no step runs after Drive returns.
func TestDriveClosedLoop(t *testing.T) {
	issue, cancel := context.WithCancel(context.Background())
	defer cancel()
	var total, after atomic.Int64
	var returned atomic.Bool
	steps := make([]func(), 3)
	for i := range steps {
		steps[i] = func() {
			if returned.Load() {
				after.Add(1)
			}
			if total.Add(1) == 300 {
				cancel()
			}
		}
	}
	Drive(issue, 0, steps, func() { t.Error("a closed loop sheds nothing") })
	returned.Store(true)
	if n := total.Load(); n < 300 {
		t.Fatalf("expected steps called until issue ended (300 calls), found %d", n)
	}
	// Which workers ran is the scheduler's business: one may have made
	// all 300 calls before the others started.
	if after.Load() != 0 {
		t.Errorf("expected no step after Drive returned, found %d", after.Load())
	}
}

// An open loop offers at most rate·span ops before issue's deadline, and
// never queues: with every worker busy until the end, an op offered is
// either taken by an idle worker or shed.
func TestDriveOpenLoopBounded(t *testing.T) {
	const rate, workers = 1000.0, 2
	span := 100 * time.Millisecond
	issue, cancel := context.WithTimeout(context.Background(), span)
	defer cancel()
	var calls, shed atomic.Int64
	steps := make([]func(), workers)
	for i := range steps {
		steps[i] = func() {
			calls.Add(1)
			<-issue.Done() // busy until the end
		}
	}
	Drive(issue, rate, steps, func() { shed.Add(1) })
	if offered, most := calls.Load()+shed.Load(), int64(span.Seconds()*rate); offered > most {
		t.Errorf("expected at most %d ops offered in %s at %g/s, found %d", most, span, rate, offered)
	}
	// Each worker takes one op and is busy to the end; after the end the
	// scheduler offers at most one more.
	if most := int64(workers + 1); calls.Load() > most {
		t.Errorf("expected at most %d ops taken by %d busy workers, found %d (ops queued, not shed)", most, workers, calls.Load())
	}
}
