package etcd

import (
	"context"
	"sync"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/report"
)

// Observe implements db.Cluster: the lag sampler. Every SampleInterval it
// asks each running member for its maintenance status, directly (control
// plane, not through the mesh, as a monitoring system would), and appends
// one checker.LagSample per answer to the store's lag.jsonl on the
// history's clock: the member's id, the leader it names, its raft term,
// its commit index (raftIndex) and applied index (raftAppliedIndex). The
// lag checker reads etcd's samples as it reads tidal's: a follower's lag
// is the leader's commit index at the nearest sample minus the follower's
// applied index. A member that does not answer within the interval (paused,
// killed, removed) has no sample for that tick.
func (c *Cluster) Observe(run *report.Run, now func() int64) (func(), error) {
	w, err := run.LagWriter()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.sampleLag(ctx, now, time.Duration(c.cfg.SampleInterval), w)
	}()
	return func() {
		cancel()
		<-done
		w.Close()
	}, nil
}

func (c *Cluster) sampleLag(ctx context.Context, now func() int64, interval time.Duration, w *report.LagWriter) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var wg sync.WaitGroup
		for _, name := range c.RunningNames() {
			wg.Go(func() {
				sctx, cancel := context.WithTimeout(ctx, interval)
				defer cancel()
				st, err := c.status(sctx, name)
				if err != nil {
					return
				}
				w.Append(lagSample(now(), name, st))
			})
		}
		wg.Wait()
		w.Flush()
	}
}

// lagSample is one status answer as the lag checker reads it. etcd before
// 3.4 has no raftAppliedIndex: its commit index stands in (an upper bound
// of what it applied).
func lagSample(at int64, name string, st *statusResponse) checker.LagSample {
	applied := uint64(st.RaftAppliedIndex)
	if applied == 0 {
		applied = uint64(st.RaftIndex)
	}
	return checker.LagSample{Time: at, Node: name, ID: uint64(st.Header.MemberID), Leader: uint64(st.Leader),
		Term: uint64(st.RaftTerm), Commit: uint64(st.RaftIndex), Applied: applied}
}
