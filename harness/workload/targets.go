package workload

import (
	"context"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// Targets is the cluster as the workload sees it.
type Targets interface {
	// Names lists the nodes clients may talk to. It may change during a
	// run (membership churn); it is asked again for every op.
	Names() []string
	// Client returns a client for name; the workload calls it once per
	// node and run, and passes its timeout and retry settings as opts.
	Client(name string, opts ...client.Option) *client.Client
	// Leader names the node currently leading, or "" if unknown. It is
	// called with a short deadline.
	Leader(ctx context.Context) string
}

// FromCluster targets a cluster's member slots through its relay mesh.
// Slots holding no member (spares not yet added, removed members) are
// left out: a client of the real system would not be configured with them.
func FromCluster(c *cluster.Cluster) Targets { return clusterTargets{c} }

type clusterTargets struct{ c *cluster.Cluster }

func (t clusterTargets) Names() []string {
	var out []string
	for _, n := range t.c.Names() {
		if t.c.State(n) != cluster.Removed {
			out = append(out, n)
		}
	}
	return out
}

func (t clusterTargets) Client(name string, opts ...client.Option) *client.Client {
	return t.c.Client(name, opts...)
}

func (t clusterTargets) Leader(ctx context.Context) string { return t.c.LeaderName(ctx) }

// Addrs targets nodes at fixed client addresses, name -> host:port; for a
// single node, or a cluster the harness did not start.
type Addrs map[string]string

// Names returns the node names, sorted.
func (a Addrs) Names() []string {
	out := make([]string, 0, len(a))
	for n := range a {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Client returns a client for the node's address.
func (a Addrs) Client(name string, opts ...client.Option) *client.Client {
	return client.New(a[name], opts...)
}

// Leader asks the nodes for /cluster/status, in name order, and maps the
// first leader one names back to a node by its client address.
func (a Addrs) Leader(ctx context.Context) string {
	for _, name := range a.Names() {
		c := client.New(a[name], client.WithRetries(0))
		st, err := c.Status(ctx)
		c.CloseIdleConnections()
		if err != nil || st.Leader == 0 {
			continue
		}
		for _, m := range st.Members {
			if m.ID != st.Leader {
				continue
			}
			for n, addr := range a {
				if sameAddr(addr, m.ClientAddr) {
					return n
				}
			}
		}
	}
	return ""
}

func sameAddr(a, b string) bool {
	trim := func(s string) string {
		if i := strings.Index(s, "://"); i >= 0 {
			s = s[i+3:]
		}
		return strings.TrimRight(s, "/")
	}
	return trim(a) == trim(b)
}

// picker chooses the node for each op and holds one client per node, so
// every worker shares its connections.
type picker struct {
	targets Targets
	sel     Selection
	opts    []client.Option

	mu      sync.Mutex
	clients map[string]*client.Client

	rr     atomic.Uint64
	leader atomic.Pointer[string]
	kick   chan struct{} // buffered 1: a refresh of the leader hint is wanted
}

func newPicker(t Targets, cfg Config) *picker {
	return &picker{
		targets: t,
		sel:     cfg.Select,
		opts: []client.Option{
			client.WithTimeout(cfg.Timeout),
			client.WithRetries(cfg.Attempts - 1),
			client.WithBackoff(minBackoff, maxBackoff),
		},
		clients: map[string]*client.Client{},
		kick:    make(chan struct{}, 1),
	}
}

func (p *picker) client(name string) *client.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.clients[name]
	if c == nil {
		c = p.targets.Client(name, p.opts...)
		p.clients[name] = c
	}
	return c
}

func (p *picker) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.clients {
		c.CloseIdleConnections()
	}
}

// pick returns the node for the next op, "" when there is none.
func (p *picker) pick(rng *rand.Rand) string {
	names := p.targets.Names()
	if len(names) == 0 {
		return ""
	}
	switch p.sel {
	case Random:
		return names[rng.IntN(len(names))]
	case LeaderOnly:
		if l := p.leader.Load(); l != nil && *l != "" {
			return *l
		}
	}
	return names[(p.rr.Add(1)-1)%uint64(len(names))]
}

// failed notes that an op sent to node did not come back ok; in
// LeaderOnly mode that asks for a fresh leader hint.
func (p *picker) failed(node string) {
	if p.sel != LeaderOnly {
		return
	}
	if l := p.leader.Load(); l == nil || *l == node {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

const (
	leaderRefresh      = time.Second
	leaderQueryTimeout = 2 * time.Second
	// leaderKickGap spaces refreshes asked for by failures: during an
	// election every op fails, and one status sweep per gap is plenty.
	leaderKickGap = 200 * time.Millisecond
)

func (p *picker) refreshLeader(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, leaderQueryTimeout)
	defer cancel()
	if name := p.targets.Leader(lctx); name != "" {
		p.leader.Store(&name)
	}
}

// watchLeader keeps the leader hint fresh until ctx ends.
func (p *picker) watchLeader(ctx context.Context) {
	t := time.NewTicker(leaderRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.kick:
		}
		p.refreshLeader(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(leaderKickGap):
		}
	}
}
