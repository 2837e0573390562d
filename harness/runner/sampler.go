package runner

import (
	"context"
	"sync"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/report"
)

// lagSampler polls /cluster/status on every running node at a fixed
// interval and appends one checker.LagSample per answer to the store's
// lag.jsonl, stamped on the history's clock so that samples and operations
// share one timeline. A node that does not answer within the interval has
// no sample for that tick: the lag checker treats gaps as gaps, never as
// zero lag. Polls go to nodes directly, not through the mesh, like every
// control-plane call of the harness, as a monitoring system would: on a
// secured cluster with the reader's bearer token.
type lagSampler struct {
	c        *cluster.Cluster
	now      func() int64
	interval time.Duration
	w        *report.LagWriter
	// elections, when set, receives each answer's term and leader with
	// the process that gave it (checker.ElectionSample): the election
	// checker's evidence. A node's first answer after it starts is its
	// start-up sample.
	elections *report.ElectionWriter
}

func (s *lagSampler) run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var wg sync.WaitGroup
		for _, name := range s.c.RunningNames() {
			wg.Add(1)
			go func(name string) {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, s.interval)
				defer cancel()
				pid, _ := s.c.PID(name)
				st, err := s.c.ObserverClient(name).Status(sctx)
				if err != nil {
					return
				}
				// Only an answer the same process gave before and after
				// the request is attributed to it: a restart in between
				// would put the old process's term under the new one.
				if after, _ := s.c.PID(name); s.elections != nil && after == pid && pid != 0 {
					s.elections.Append(checker.ElectionSample{Time: s.now(), Node: name, PID: pid, ID: st.Node, Term: st.Term, Leader: st.Leader})
				}
				sample := checker.LagSample{Time: s.now(), Node: name, ID: st.Node, Leader: st.Leader, Term: st.Term, Commit: st.Commit, Applied: st.Applied}
				for _, m := range st.Members {
					sample.Members = append(sample.Members, checker.MemberMatch{ID: m.ID, Match: m.Match})
				}
				s.w.Append(sample)
			}(name)
		}
		wg.Wait()
		s.w.Flush()
		if s.elections != nil {
			s.elections.Flush()
		}
	}
}
