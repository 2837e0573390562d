package runbook

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// observer watches a local cluster from outside, as a monitoring system
// would: it polls /cluster/status of every member at a fixed interval,
// appends each answer to the run's lag samples (on the history clock), and
// follows the membership as the leader reports it, so that the workload
// writes to the members of the moment and the checkers know which slots
// were members and which were removed. Nodes of other clusters on spare
// slots (a restored backup) are never members here and never polled.
type observer struct {
	c        *LocalCluster
	now      func() int64
	interval time.Duration
	lag      *report.LagWriter

	mu       sync.Mutex
	members  map[string]uint64 // slot name -> member id, as the leader last said
	ever     map[string]bool   // slots that were ever members
	lastSeen map[uint64]int64  // member id -> last time it was in the membership
	leader   string
	commit   uint64 // the leader's commit index at its last answer
	applied  map[string]uint64
	clients  map[string]*client.Client
}

func newObserver(c *LocalCluster, now func() int64, interval time.Duration, lag *report.LagWriter) *observer {
	o := &observer{c: c, now: now, interval: interval, lag: lag, members: map[string]uint64{}, ever: map[string]bool{},
		lastSeen: map[uint64]int64{}, applied: map[string]uint64{}, clients: map[string]*client.Client{}}
	for _, s := range c.Slots()[:c.Initial()] {
		o.members[s.Name] = uint64(s.Index)
		o.ever[s.Name] = true
	}
	return o
}

func (o *observer) statusClient(name string) *client.Client {
	o.mu.Lock()
	defer o.mu.Unlock()
	cl := o.clients[name]
	if cl == nil {
		s, _ := o.c.Slot(name)
		cl = o.c.AdminClient(s, client.WithRetries(0), client.WithTimeout(o.timeout()))
		o.clients[name] = cl
	}
	return cl
}

// timeout bounds one status request: at least a second, so that a node
// slowed by a loaded machine still counts as answering (a poll that takes
// longer only delays the next one).
func (o *observer) timeout() time.Duration { return max(o.interval, time.Second) }

// run polls until ctx ends.
func (o *observer) run(ctx context.Context) {
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		o.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll asks every member once, concurrently.
func (o *observer) poll(ctx context.Context) {
	names := o.Names()
	type answer struct {
		name string
		st   *client.Status
	}
	answers := make(chan answer, len(names))
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		go func(n string) {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, o.timeout())
			defer cancel()
			st, err := o.statusClient(n).Status(pctx)
			if err == nil {
				answers <- answer{n, st}
			}
		}(n)
	}
	wg.Wait()
	close(answers)
	// Only this poll's answers count as applied: a node that stopped
	// answering is not caught up on the strength of what it said before.
	o.mu.Lock()
	o.applied = map[string]uint64{}
	o.mu.Unlock()
	for a := range answers {
		st := a.st
		sample := checker.LagSample{Time: o.now(), Node: a.name, ID: st.Node, Leader: st.Leader, Term: st.Term, Commit: st.Commit, Applied: st.Applied}
		for _, m := range st.Members {
			sample.Members = append(sample.Members, checker.MemberMatch{ID: m.ID, Match: m.Match})
		}
		if o.lag != nil {
			o.lag.Append(sample)
		}
		o.mu.Lock()
		o.applied[a.name] = st.Applied
		if st.Leader != 0 && st.Leader == st.Node && o.members[a.name] == st.Node {
			o.learn(a.name, st)
		}
		o.mu.Unlock()
	}
	if o.lag != nil {
		o.lag.Flush()
	}
}

// learn takes the leader's membership (under o.mu).
func (o *observer) learn(leader string, st *client.Status) {
	members := map[string]uint64{}
	now := o.now()
	for _, m := range st.Members {
		s, ok := o.c.SlotByPeer(m.PeerAddr)
		if !ok {
			continue // a member on an address no slot has: not ours to write to
		}
		members[s.Name] = m.ID
		o.ever[s.Name] = true
		o.lastSeen[m.ID] = now
	}
	if len(members) > 0 {
		o.members = members
	}
	o.leader, o.commit = leader, st.Commit
}

// Names lists the member slots of the moment, sorted: where the workload
// writes and what the observer polls.
func (o *observer) Names() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, 0, len(o.members))
	for n := range o.members {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Client returns a workload client for a slot, presenting the writer's
// certificate on a secured cluster.
func (o *observer) Client(name string, opts ...client.Option) *client.Client {
	s, err := o.c.Slot(name)
	if err != nil {
		return client.New("127.0.0.1:1")
	}
	return o.c.WriterClient(s, opts...)
}

// Leader is the slot that last answered as leader.
func (o *observer) Leader(context.Context) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.leader
}

// Members returns the membership the leader last reported.
func (o *observer) Members() map[string]uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]uint64, len(o.members))
	for k, v := range o.members {
		out[k] = v
	}
	return out
}

// Ever lists every slot that was a member at some point, sorted.
func (o *observer) Ever() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, 0, len(o.ever))
	for n := range o.ever {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// LastSeen is the last history time member id was in the membership.
func (o *observer) LastSeen(id uint64) (int64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.lastSeen[id]
	return t, ok
}

// caughtUpTo reports whether every member has applied at least index.
func (o *observer) caughtUpTo(index uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for n := range o.members {
		if o.applied[n] < index {
			return false
		}
	}
	return true
}

// Commit is the leader's commit index at its last answer.
func (o *observer) Commit() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.commit
}
