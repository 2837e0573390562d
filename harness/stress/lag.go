package stress

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/tidaldb/tidal/tidal-server/client"
)

// LagReport is the follower lag seen while sampling.
//
// Lag in entries is the leader's commit index minus the follower's applied
// index, both read in the same poll round. Lag in time is the age of the
// oldest entry the follower has not applied: the time since the leader was
// first seen with a commit index beyond the follower's applied one. Both
// are sampled, so time lag is resolved to about one Interval (plus the
// poll's own latency) and a shorter spike between polls goes unseen.
type LagReport struct {
	Interval  time.Duration `json:"interval_ns"`
	Rounds    int           `json:"rounds"`    // poll rounds that found a leader
	NoLeader  int           `json:"no_leader"` // poll rounds that did not
	Failed    int           `json:"failed"`    // status requests that failed
	Elections int           `json:"leader_changes"`
	Followers []FollowerLag `json:"followers"`
	All       FollowerLag   `json:"all"` // every follower's samples together
}

// FollowerLag summarises one follower's samples (Node 0 in LagReport.All).
type FollowerLag struct {
	Node        uint64        `json:"node"`
	Samples     int           `json:"samples"`
	EntriesP50  uint64        `json:"entries_p50"`
	EntriesP99  uint64        `json:"entries_p99"`
	EntriesMax  uint64        `json:"entries_max"`
	TimeP50     time.Duration `json:"time_p50_ns"`
	TimeP99     time.Duration `json:"time_p99_ns"`
	TimeMax     time.Duration `json:"time_max_ns"`
	entries     []uint64
	durations   []time.Duration
	lastApplied uint64
}

func (f *FollowerLag) add(entries uint64, d time.Duration) {
	f.Samples++
	f.entries = append(f.entries, entries)
	f.durations = append(f.durations, d)
}

func (f *FollowerLag) summarize() {
	if f.Samples == 0 {
		return
	}
	slices.Sort(f.entries)
	slices.Sort(f.durations)
	at := func(n int, q float64) int { return min(n-1, int(q*float64(n))) }
	f.EntriesP50, f.EntriesP99, f.EntriesMax = f.entries[at(len(f.entries), 0.50)], f.entries[at(len(f.entries), 0.99)], f.entries[len(f.entries)-1]
	f.TimeP50, f.TimeP99, f.TimeMax = f.durations[at(len(f.durations), 0.50)], f.durations[at(len(f.durations), 0.99)], f.durations[len(f.durations)-1]
}

// commitSeen is the leader's commit index as one poll saw it.
type commitSeen struct {
	at     time.Time
	commit uint64
}

// SampleLag polls every target's /cluster/status each interval until ctx
// ends and returns the follower lag it saw. Targets should be every node
// of the cluster: a follower that is not polled is not reported. opts
// carry the credentials of a secured cluster (client.WithTLS, WithToken).
func SampleLag(ctx context.Context, targets []string, every time.Duration, opts ...client.Option) *LagReport {
	if every <= 0 {
		every = 10 * time.Millisecond
	}
	clients := make([]*client.Client, len(targets))
	for i, t := range targets {
		// One attempt per poll: a retried poll would report an older past
		// as the present.
		clients[i] = client.New(t, append(append([]client.Option{}, opts...), client.WithRetries(0), client.WithTimeout(max(time.Second, 10*every)))...)
	}
	defer func() {
		for _, c := range clients {
			c.CloseIdleConnections()
		}
	}()
	rep := &LagReport{Interval: every}
	followers := map[uint64]*FollowerLag{}
	var history []commitSeen // the leader's commit index over time, ascending
	var leader uint64

	type polled struct {
		st  *client.Status
		at  time.Time
		err error
	}
	round := make([]polled, len(clients))
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			all := &rep.All
			for _, id := range sortedKeys(followers) {
				f := followers[id]
				all.Samples += f.Samples
				all.entries = append(all.entries, f.entries...)
				all.durations = append(all.durations, f.durations...)
				f.summarize()
				rep.Followers = append(rep.Followers, *f)
			}
			all.summarize()
			return rep
		case <-tick.C:
		}
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := c.Status(ctx)
				round[i] = polled{st, time.Now(), err}
			}()
		}
		wg.Wait()
		if ctx.Err() != nil {
			continue // the round was cut short; the next select returns
		}
		var lead *polled
		for i := range round {
			p := &round[i]
			if p.err != nil {
				rep.Failed++
				continue
			}
			if p.st.Leader != 0 && p.st.Leader == p.st.Node {
				lead = p
			}
		}
		if lead == nil {
			rep.NoLeader++
			continue
		}
		rep.Rounds++
		if lead.st.Node != leader {
			if leader != 0 {
				rep.Elections++
			}
			// Commit indexes seen on another leader are not comparable in
			// time with this one's; start the history afresh.
			leader, history = lead.st.Node, history[:0]
		}
		if n := len(history); n == 0 || lead.st.Commit > history[n-1].commit {
			history = append(history, commitSeen{lead.at, lead.st.Commit})
		}
		for i := range round {
			p := &round[i]
			if p.err != nil || p == lead {
				continue
			}
			f := followers[p.st.Node]
			if f == nil {
				f = &FollowerLag{Node: p.st.Node}
				followers[p.st.Node] = f
			}
			f.lastApplied = p.st.Applied
			var entries uint64
			if lead.st.Commit > p.st.Applied {
				entries = lead.st.Commit - p.st.Applied
			}
			f.add(entries, timeLag(history, p.st.Applied, p.at))
		}
		// Applied indexes only grow, so commits at or below every follower's
		// applied index can no longer answer a search: drop them.
		minApplied := uint64(0)
		for i, id := range sortedKeys(followers) {
			if a := followers[id].lastApplied; i == 0 || a < minApplied {
				minApplied = a
			}
		}
		drop := sort.Search(len(history), func(i int) bool { return history[i].commit > minApplied })
		history = history[drop:]
	}
}

// timeLag is how long ago the leader was first seen with a commit index
// beyond applied (0 if never: the follower is caught up with what was seen).
func timeLag(history []commitSeen, applied uint64, at time.Time) time.Duration {
	i := sort.Search(len(history), func(i int) bool { return history[i].commit > applied })
	if i == len(history) {
		return 0
	}
	return max(0, at.Sub(history[i].at))
}

func sortedKeys(m map[uint64]*FollowerLag) []uint64 {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// WriteTable prints the lag per follower.
func (r *LagReport) WriteTable(out io.Writer) {
	fmt.Fprintf(out, "follower lag (sampled every %s, %d rounds, %d without leader, %d failed polls, %d leader changes):\n",
		r.Interval, r.Rounds, r.NoLeader, r.Failed, r.Elections)
	for _, f := range append(r.Followers, r.All) {
		name := fmt.Sprintf("node %d", f.Node)
		if f.Node == 0 {
			name = "all"
		}
		fmt.Fprintf(out, "  %-8s entries p50 %d p99 %d max %d   time p50 %s p99 %s max %s\n",
			name, f.EntriesP50, f.EntriesP99, f.EntriesMax, fmtDur(f.TimeP50), fmtDur(f.TimeP99), fmtDur(f.TimeMax))
	}
}
