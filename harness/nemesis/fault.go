// Package nemesis injects faults into a running tidal cluster and heals
// them, recording each in the run's history, and generates seeded fault
// schedules that can be saved (schedule.json) and replayed.
//
// A fault kind ("partition-halves", "kill-leader", ...) is one small type
// behind the Fault interface: Resolve fixes whom it acts on, Inject makes
// it happen, Heal undoes it. Kinds compose by running at the same time;
// what keeps them from stepping on each other is the class (see Class):
// at most one fault of a class is active at once. The generator never
// schedules two faults of a class to overlap, and the Runner, given a
// hand-written schedule that does, heals the earlier fault before it
// injects the next. Faults of different classes (a partition and a kill)
// do overlap; they touch different things (relays, processes) and each
// heal undoes only its own.
//
// History. Every fault is recorded as ops of process "nemesis" exactly as
// history.FaultValue describes: invoke once its targets are resolved (the
// request), then ok at the moment it took effect (after the mesh change
// acted on every connection, or after the signal returned), fail when it
// certainly did not happen, info when it may have. Its heal is a
// heal-<f> invoke/ok pair; HealAll records one heal-all pair. Because a
// class holds one fault at a time and the kinds of a history f all share
// one class, a heal-<f> always ends exactly one window in
// checker.FaultWindows.
package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tcp-relay/mesh"
	"github.com/tidaldb/tidal/tcp-relay/relay"
)

// Cluster is what faults act on. *cluster.Cluster provides it through
// Live; tests may provide their own.
type Cluster interface {
	Names() []string
	State(name string) cluster.State
	// Mesh is the relay mesh every peer link crosses (nil: no network faults).
	Mesh() cluster.Network
	Kill(name string) error
	Pause(name string) error
	Resume(name string) error
	Start(name string) error
	Restart(name string) error
	RemoveMember(ctx context.Context, name string) error
	AddMember(ctx context.Context, name string) (uint64, error)
	WaitLeader(ctx context.Context) (string, error)
	WaitConverged(ctx context.Context) error
	// TransferLeader asks the leader from to hand leadership to to, and
	// returns once to leads.
	TransferLeader(ctx context.Context, from, to string) error
}

// Live adapts a running cluster for the nemesis. It returns the concrete
// type, so that a holder that embeds it keeps every method of the
// cluster (the disk and clock faults' DiskCluster and ClockSetter too),
// not only those of the Cluster interface.
func Live(c *cluster.Cluster) LiveCluster { return LiveCluster{c} }

// LiveCluster is a running cluster as the nemesis acts on it: a Cluster,
// a DiskCluster and a ClockSetter.
type LiveCluster struct{ *cluster.Cluster }

var (
	_ Cluster     = LiveCluster{}
	_ ClockSetter = LiveCluster{}
)

func (l LiveCluster) TransferLeader(ctx context.Context, from, to string) error {
	for _, n := range l.Nodes() {
		if n.Name == to {
			return l.AdminClient(from).TransferLeader(ctx, n.ID)
		}
	}
	return fmt.Errorf("transfer leader from %s: expected a node named %q, found none in %v", from, to, l.Names())
}

// Fault is one kind of fault. Implementations are stateless: everything a
// heal needs travels in the FaultValue that is also recorded, so what the
// history says is what was done.
type Fault interface {
	// Resolve fixes the nodes the fault acts on, from the step and the
	// cluster as it is now (the current leader, say), and returns the
	// value the history records. An error means nothing was done.
	Resolve(ctx context.Context, c Cluster, s Step) (history.FaultValue, error)
	// Inject makes the fault happen and returns when it took effect. It
	// may add what only the effect tells (a partition's grudge) to v. An
	// error wrapped by NotApplied means the fault certainly did not take
	// effect; any other error leaves that unknown.
	Inject(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error)
	// Heal undoes Inject and returns when that took effect. Instant
	// faults (restart, leader transfer) are over when Inject returns and
	// are never healed.
	Heal(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error)
}

// notApplied marks an error after which the fault certainly did not take
// effect: the history records fail rather than info.
type notApplied struct{ err error }

func (e notApplied) Error() string { return e.err.Error() }
func (e notApplied) Unwrap() error { return e.err }

// NotApplied wraps err to say the fault did not take effect.
func NotApplied(err error) error { return notApplied{err} }

// IsNotApplied reports whether err says the fault did not take effect.
func IsNotApplied(err error) bool { var na notApplied; return errors.As(err, &na) }

// leader finds the node a majority agrees leads. A leader-targeted fault
// resolved while the cluster has none fails, and the history says why.
func leader(ctx context.Context, c Cluster) (string, error) {
	l, err := c.WaitLeader(ctx)
	if err != nil {
		return "", fmt.Errorf("resolving the leader: %w", err)
	}
	return l, nil
}

// checkTargets verifies that s names want nodes (want < 0: at least one)
// and that each is a node of c.
func checkTargets(c Cluster, s Step, want int) error {
	if want >= 0 && len(s.Targets) != want || want < 0 && len(s.Targets) == 0 {
		return fmt.Errorf("%s: expected %s, found targets %v", s.Kind, plural(want, "target node"), s.Targets)
	}
	names := c.Names()
	for _, t := range s.Targets {
		if !slices.Contains(names, t) {
			return fmt.Errorf("%s: target %q is not a node of the cluster (have %v)", s.Kind, t, names)
		}
	}
	return nil
}

func plural(n int, what string) string {
	switch {
	case n < 0:
		return "at least one " + what
	case n == 1:
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// ---- partitions ----

// partition cuts peer links through the mesh. Every shape replaces the
// whole grudge, and heal removes it; the network class holds one at a time.
type partition struct{ shape string }

func (p partition) Resolve(ctx context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: p.shape}
	if c.Mesh() == nil {
		return v, fmt.Errorf("%s: the cluster has no relay mesh (a single node cannot be partitioned)", s.Kind)
	}
	var err error
	switch p.shape {
	case "isolate-leader":
		var l string
		l, err = leader(ctx, c)
		v.Targets = []string{l}
	case "isolate-one":
		err = checkTargets(c, s, 1)
	case "one-way":
		err = checkTargets(c, s, 2)
		if err == nil && s.Targets[0] == s.Targets[1] {
			err = fmt.Errorf("%s: expected two different nodes, found %v", s.Kind, s.Targets)
		}
	default:
		// halves, bridge and majorities-ring take an order of the nodes;
		// the mesh checks the shape (bridge and ring want every mesh node).
		err = checkTargets(c, s, -1)
	}
	if v.Targets == nil {
		v.Targets = slices.Clone(s.Targets)
	}
	return v, err
}

func (p partition) Inject(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	m := c.Mesh()
	var ch mesh.Change
	var err error
	switch p.shape {
	case "halves":
		k := len(v.Targets) / 2
		groups := [][]string{v.Targets[:k], v.Targets[k:]}
		// Mesh slots outside the cluster's nodes (none today) sit apart.
		if rest := outside(m.Nodes(), v.Targets); len(rest) > 0 {
			groups = append(groups, rest)
		}
		ch, err = m.Partition(groups...)
	case "isolate-one", "isolate-leader":
		ch, err = m.Isolate(v.Targets[0])
	case "one-way":
		ch, err = m.OneWay(v.Targets[0], v.Targets[1])
	case "bridge":
		ch, err = m.Bridge(v.Targets...)
	case "majorities-ring":
		ch, err = m.MajoritiesRing(v.Targets...)
	default:
		return time.Time{}, NotApplied(fmt.Errorf("partition: unknown shape %q", p.shape))
	}
	if errors.Is(err, mesh.ErrBadShape) || errors.Is(err, mesh.ErrUnknownNode) {
		// Rejected before any relay was touched.
		return time.Time{}, NotApplied(err)
	}
	if err != nil {
		return time.Time{}, err
	}
	v.Grudge = hears(ch.Grudge)
	return ch.At, nil
}

func (partition) Heal(_ context.Context, c Cluster, _ *history.FaultValue) (time.Time, error) {
	ch, err := c.Mesh().Heal()
	return ch.At, err
}

func outside(all, in []string) []string {
	var out []string
	for _, n := range all {
		if !slices.Contains(in, n) {
			out = append(out, n)
		}
	}
	return out
}

// hears turns the mesh's grudge (a -> nodes a cannot send to) into the
// history's (a -> nodes a can no longer hear from).
func hears(g mesh.Grudge) map[string][]string {
	if len(g) == 0 {
		return nil
	}
	out := map[string][]string{}
	for from, tos := range g {
		for _, to := range tos {
			out[to] = append(out[to], from)
		}
	}
	for k := range out {
		slices.Sort(out[k])
	}
	return out
}

// ---- processes ----

// signal sends a signal to its targets (SIGKILL, SIGSTOP) and heals by
// undoing it (start again, SIGCONT). Targets are fixed at generation time
// ("one", "minority") or resolved to the leader now.
type signal struct {
	sub     string // "one", "leader", "minority"
	do      func(Cluster, string) error
	undo    func(Cluster, string) error // nil for instant faults
	undoing cluster.State               // the state undo applies to
}

func (p signal) Resolve(ctx context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: p.sub}
	if p.sub == "leader" {
		l, err := leader(ctx, c)
		v.Targets = []string{l}
		return v, err
	}
	v.Targets = slices.Clone(s.Targets)
	want := 1
	if p.sub == "minority" {
		want = -1
		if n := len(c.Names()); 2*len(s.Targets) >= n {
			return v, fmt.Errorf("%s: expected a minority of %d nodes, found targets %v", s.Kind, n, s.Targets)
		}
	}
	return v, checkTargets(c, s, want)
}

func (p signal) Inject(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	for _, t := range v.Targets {
		if st := c.State(t); st != cluster.Running {
			return time.Time{}, NotApplied(fmt.Errorf("%s: expected node running, found %s", t, st))
		}
	}
	for i, t := range v.Targets {
		if err := p.do(c, t); err != nil {
			if i == 0 {
				err = NotApplied(err)
			}
			return time.Time{}, err
		}
	}
	return time.Now(), nil
}

func (p signal) Heal(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	var errs []error
	for _, t := range v.Targets {
		// A target the harness already brought back needs nothing.
		if c.State(t) != p.undoing {
			continue
		}
		if err := p.undo(c, t); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t, err))
		}
	}
	return time.Now(), errors.Join(errs...)
}

// ---- slow links ----

// links installs a relay fault (latency, bandwidth) on peer links: every
// peer link when the fault has no targets, else every link to and from
// each target.
type links struct {
	name string // the relay fault's name; one per kind, so heal removes only its own
}

func (l links) Resolve(_ context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Targets: slices.Clone(s.Targets)}
	if c.Mesh() == nil {
		return v, fmt.Errorf("%s: the cluster has no relay mesh", s.Kind)
	}
	if s.Link == nil {
		return v, fmt.Errorf("%s: expected a link fault spec, found none", s.Kind)
	}
	f, err := s.Link.Fault()
	if err != nil {
		return v, fmt.Errorf("%s: link fault: %w", s.Kind, err)
	}
	v.Kind = f.Toxic.Type()
	v.Params, err = json.Marshal(s.Link)
	if err != nil {
		return v, err
	}
	if len(s.Targets) > 0 {
		err = checkTargets(c, s, -1)
	}
	return v, err
}

func (l links) fault(v *history.FaultValue) (relay.Fault, error) {
	var spec relay.Spec
	if err := json.Unmarshal(v.Params, &spec); err != nil {
		return relay.Fault{}, fmt.Errorf("link fault params %s: %w", v.Params, err)
	}
	spec.Name = l.name
	return spec.Fault()
}

// pairs lists the directed peer links the fault covers.
func (l links) pairs(m cluster.Network, targets []string) [][2]string {
	nodes := m.Nodes()
	var out [][2]string
	for _, a := range nodes {
		for _, b := range nodes {
			if a != b && (len(targets) == 0 || slices.Contains(targets, a) || slices.Contains(targets, b)) {
				out = append(out, [2]string{a, b})
			}
		}
	}
	return out
}

func (l links) Inject(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	f, err := l.fault(v)
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	var at time.Time
	for i, p := range l.pairs(c.Mesh(), v.Targets) {
		ch, err := c.Mesh().AddLinkFault(p[0], p[1], f)
		if err != nil {
			if i == 0 {
				err = NotApplied(err)
			}
			return time.Time{}, err
		}
		at = ch.At
	}
	return at, nil
}

func (l links) Heal(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	var errs []error
	at := time.Now()
	for _, p := range l.pairs(c.Mesh(), v.Targets) {
		ch, err := c.Mesh().RemoveLinkFault(p[0], p[1], l.name)
		if errors.Is(err, relay.ErrNoFault) {
			continue // an inject that failed half-way never reached this link
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		at = ch.At
	}
	return at, errors.Join(errs...)
}

// ---- leadership ----

// transfer hands leadership from the current leader to the first running
// node of the step's candidate order that is not the leader. Instant.
type transfer struct{}

type transferParams struct {
	From string `json:"from"`
	To   string `json:"to"`
}

func (transfer) Resolve(ctx context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: "leader"}
	l, err := leader(ctx, c)
	if err != nil {
		return v, err
	}
	candidates := append(slices.Clone(s.Targets), c.Names()...)
	for _, n := range candidates {
		if n != l && c.State(n) == cluster.Running {
			v.Targets = []string{l, n}
			v.Params, err = json.Marshal(transferParams{From: l, To: n})
			return v, err
		}
	}
	return v, fmt.Errorf("%s: expected a running node other than the leader %s, found none", s.Kind, l)
}

func (transfer) Inject(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	if err := c.TransferLeader(ctx, v.Targets[0], v.Targets[1]); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

func (transfer) Heal(context.Context, Cluster, *history.FaultValue) (time.Time, error) {
	return time.Now(), nil
}

// ---- membership ----

// churn removes a node's member from the raft membership (the slot is
// stopped and wiped, its id gone for good) and heals by adding the slot
// back as a brand-new member that catches up from the others.
type churn struct{}

type churnParams struct {
	NewID uint64 `json:"new_id"`
}

func (churn) Resolve(_ context.Context, c Cluster, s Step) (history.FaultValue, error) {
	return history.FaultValue{Kind: "one", Targets: slices.Clone(s.Targets)}, checkTargets(c, s, 1)
}

func (churn) Inject(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	if st := c.State(v.Targets[0]); st != cluster.Running {
		return time.Time{}, NotApplied(fmt.Errorf("%s: expected node running, found %s", v.Targets[0], st))
	}
	if err := c.RemoveMember(ctx, v.Targets[0]); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

func (churn) Heal(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	name := v.Targets[0]
	switch st := c.State(name); st {
	case cluster.Removed:
		id, err := c.AddMember(ctx, name)
		if err != nil {
			return time.Time{}, err
		}
		v.Params, _ = json.Marshal(churnParams{NewID: id})
	case cluster.Stopped, cluster.Killed: // added, but its start failed
		if err := c.Start(name); err != nil {
			return time.Time{}, err
		}
	}
	return time.Now(), nil
}
