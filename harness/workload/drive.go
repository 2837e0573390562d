package workload

import (
	"context"
	"sync"
	"time"
)

// Drive runs one goroutine per step, each calling its step over and over,
// until issue ends, and returns once every step has returned. It is the
// worker loop of every workload (this package's and harness/db/etcd's).
//
// With rate 0 it is a closed loop: each worker calls its step again as
// soon as the last one returned, while issue lasts. With rate > 0 it is an
// open loop: an op is offered to an idle worker every 1/rate, and one that
// finds every worker busy is shed (shed is called), never queued; see
// schedule.
func Drive(issue context.Context, rate float64, steps []func(), shed func()) {
	var jobs chan struct{}
	if rate > 0 {
		jobs = make(chan struct{}) // unbuffered: a send succeeds only when a worker is idle
	}
	var wg sync.WaitGroup
	for _, step := range steps {
		wg.Go(func() {
			if jobs == nil {
				for issue.Err() == nil {
					step()
				}
				return
			}
			for range jobs {
				step()
			}
		})
	}
	if jobs != nil {
		schedule(issue, jobs, rate, shed)
		close(jobs)
	}
	wg.Wait()
}

// schedule offers ops to the workers at rate until issue ends. Op i is
// due at i/rate after the start, computed from i so a long run does not
// drift; one that finds every worker busy is shed, never queued, so the
// offered load stays what the schedule says however slow the cluster is.
//
// No op due at or past issue's deadline is offered. The loop must not
// rely on issue.Err() for that: a context's deadline is enforced by a
// runtime timer, and a loaded machine runs that timer late, while a
// generator that woke late itself finds every op due since "ready" and
// offers them in a burst. That is how TestOpenLoopSheds saw 104 ops
// offered in a 500ms run at 200/s (flake).
func schedule(issue context.Context, jobs chan<- struct{}, rate float64, shed func()) {
	start := time.Now()
	end, bounded := issue.Deadline()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for i := int64(0); ; i++ {
		due := start.Add(time.Duration(float64(i) * float64(time.Second) / rate))
		if bounded && !due.Before(end) {
			return
		}
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-issue.Done():
				return
			case <-timer.C:
			}
		} else if issue.Err() != nil {
			return
		}
		select {
		case jobs <- struct{}{}:
		default:
			shed()
		}
	}
}
