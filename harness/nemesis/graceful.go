package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/history"
)

// Graceful process faults stop nodes the way an operator or an
// orchestrator does: SIGTERM, then wait for the process to drain and
// exit. What a node does on that path (hand off leadership, drain
// in-flight requests, sync and close its WAL) is code a SIGKILL never
// runs, so the kill faults cannot test it.
//
//   - stop (history f "stop", kind "one"): SIGTERM one node and wait for
//     its exit; heal starts it again.
//   - restart-graceful (f "restart", kind "graceful", instant): SIGTERM,
//     wait for the exit, start again at once.
//   - rolling-restart (f "restart", kind "rolling", instant): every member
//     in turn — SIGTERM, wait for the exit, start, wait until it is ready
//     (has a leader and has caught up) — before the next; the current
//     leader goes first or last, as the schedule drew (Step.Rolling).
//   - stop-then-power-cut (f "stop-power-cut", kind "one"; class process,
//     so no other stop or kill of its node runs meanwhile, and an f of its
//     own, so its heal never ends a disk power cut's window):
//     SIGTERM, and the moment the process has exited, cut its disk: what
//     the shutdown path left unsynced is lost, as on a machine powered off
//     right after its service stopped.
//
// Each records every stopped node's exit status in its value's params
// ("exits"), and the runner's exit watch marks those exits graceful, so
// the nodes checker holds them to exit status 0.

// GracefulCluster is a Cluster whose nodes can be stopped gracefully.
type GracefulCluster interface {
	Cluster
	// StopStatus sends SIGTERM and waits for the exit (ctx bounds the
	// drain); it returns the exit code (-1 for a signal) and status text
	// (cluster.Cluster.StopStatus).
	StopStatus(ctx context.Context, name string) (code int, text string, err error)
	// WaitNodeReady waits until name is ready: it has a leader and has
	// caught up with it.
	WaitNodeReady(ctx context.Context, name string) error
}

var _ GracefulCluster = LiveCluster{}

// needsGraceful returns c as a GracefulCluster, or an error naming kind.
func needsGraceful(c Cluster, kind string) (GracefulCluster, error) {
	gc, ok := c.(GracefulCluster)
	if !ok {
		return nil, fmt.Errorf("%s needs graceful stops (SIGTERM and the exit status), which this cluster does not provide", kind)
	}
	return gc, nil
}

// Exit is one graceful stop's outcome as the history records it.
type Exit struct {
	Code int    `json:"code"`
	Text string `json:"text"`
}

// gracefulParams is what a graceful fault records: each stopped node's
// exit status, in stop order for a rolling restart, and for
// stop-then-power-cut what the cut did to the disk.
type gracefulParams struct {
	Exits map[string]Exit `json:"exits,omitempty"`
	// Order is the order a rolling restart took, leader included.
	Order []string `json:"order,omitempty"`
	// LeaderFirst is the rolling restart's draw.
	LeaderFirst *bool `json:"leader_first,omitempty"`
	// PowerCut shapes stop-then-power-cut's cut; Reports is what each
	// disk lost.
	PowerCut *faultfs.PowerCutOptions          `json:"power_cut,omitempty"`
	Reports  map[string]faultfs.PowerCutReport `json:"reports,omitempty"`
}

// RollingSpec is what a rolling restart drew at generation time.
type RollingSpec struct {
	// LeaderFirst restarts the leader found at inject time first; else last.
	LeaderFirst bool `json:"leader_first"`
}

func rollingSpec(kind string, r *rand.Rand) *RollingSpec {
	if kind != "rolling-restart" {
		return nil // drawn only for this kind: other schedules stay as they were
	}
	return &RollingSpec{LeaderFirst: r.IntN(2) == 0}
}

// stopOne stops t gracefully and records its exit in p. An error means
// the drain did not end (the process was then killed) or the stop could
// not be sent; the exit status, if any, is recorded either way.
func stopOne(ctx context.Context, gc GracefulCluster, t string, p *gracefulParams) error {
	code, text, err := gc.StopStatus(ctx, t)
	if p.Exits == nil {
		p.Exits = map[string]Exit{}
	}
	if text != "" {
		p.Exits[t] = Exit{Code: code, Text: text}
	}
	if err != nil {
		return fmt.Errorf("%s: graceful stop: %w", t, err)
	}
	return nil
}

// gracefulStop is stop and restart-graceful.
type gracefulStop struct {
	restart bool // start again at once (instant)
}

func (g gracefulStop) Resolve(_ context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: "one", Targets: slices.Clone(s.Targets)}
	if g.restart {
		v.Kind = "graceful"
	}
	if _, err := needsGraceful(c, s.Kind); err != nil {
		return v, err
	}
	return v, checkTargets(c, s, 1)
}

func (g gracefulStop) Inject(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	gc, err := needsGraceful(c, "stop")
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	t := v.Targets[0]
	if st := c.State(t); st != cluster.Running {
		return time.Time{}, NotApplied(fmt.Errorf("%s: expected node running, found %s", t, st))
	}
	var p gracefulParams
	err = stopOne(ctx, gc, t, &p)
	v.Params, _ = json.Marshal(p)
	if err != nil {
		return time.Time{}, err
	}
	at := time.Now()
	if g.restart {
		if err := c.Start(t); err != nil {
			return time.Time{}, fmt.Errorf("%s: start after the graceful stop: %w", t, err)
		}
		at = time.Now()
	}
	return at, nil
}

// Heal starts the stopped node again; one something else brought back
// needs nothing.
func (g gracefulStop) Heal(_ context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	var errs []error
	for _, t := range v.Targets {
		if st := c.State(t); st == cluster.Stopped || st == cluster.Killed {
			if err := c.Start(t); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", t, err))
			}
		}
	}
	return time.Now(), errors.Join(errs...)
}

// rolling restarts every member in turn.
type rolling struct{}

func (rolling) Resolve(ctx context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: "rolling"}
	if _, err := needsGraceful(c, s.Kind); err != nil {
		return v, err
	}
	var members []string
	for _, n := range c.Names() {
		if c.State(n) != cluster.Removed {
			members = append(members, n)
		}
	}
	// The step's order (drawn at generation) first, then any member it
	// does not name.
	order := slices.DeleteFunc(slices.Clone(s.Targets), func(n string) bool { return !slices.Contains(members, n) })
	for _, n := range members {
		if !slices.Contains(order, n) {
			order = append(order, n)
		}
	}
	first := s.Rolling != nil && s.Rolling.LeaderFirst
	l, err := leader(ctx, c)
	if err != nil {
		return v, err
	}
	order = slices.DeleteFunc(order, func(n string) bool { return n == l })
	if first {
		order = append([]string{l}, order...)
	} else {
		order = append(order, l)
	}
	v.Targets = order
	v.Params, err = json.Marshal(gracefulParams{Order: order, LeaderFirst: &first})
	return v, err
}

func (rolling) Inject(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	gc, err := needsGraceful(c, "rolling-restart")
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	var p gracefulParams
	if err := json.Unmarshal(v.Params, &p); err != nil {
		return time.Time{}, NotApplied(fmt.Errorf("rolling restart params %s: %w", v.Params, err))
	}
	for _, t := range v.Targets {
		if st := c.State(t); st != cluster.Running {
			return time.Time{}, NotApplied(fmt.Errorf("%s: expected every member running, found %s %s", "rolling-restart", t, st))
		}
	}
	defer func() { v.Params, _ = json.Marshal(p) }()
	for i, t := range v.Targets {
		if err := stopOne(ctx, gc, t, &p); err != nil {
			if i == 0 && len(p.Exits) == 0 {
				return time.Time{}, NotApplied(err)
			}
			return time.Time{}, err
		}
		if err := c.Start(t); err != nil {
			return time.Time{}, fmt.Errorf("%s: start after the graceful stop: %w", t, err)
		}
		// The next node stops only once this one serves again: a rolling
		// restart never takes two members down at once.
		if err := gc.WaitNodeReady(ctx, t); err != nil {
			return time.Time{}, fmt.Errorf("rolling restart: %s did not become ready after its restart: %w", t, err)
		}
	}
	return time.Now(), nil
}

func (rolling) Heal(context.Context, Cluster, *history.FaultValue) (time.Time, error) {
	return time.Now(), nil
}

// stopThenCut is stop-then-power-cut: a graceful stop, then a power cut
// of the stopped node's disk the moment its process has exited.
type stopThenCut struct{}

func (stopThenCut) Resolve(_ context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: "one", Targets: slices.Clone(s.Targets)}
	if _, err := needsGraceful(c, s.Kind); err != nil {
		return v, err
	}
	if _, err := needsDisks(c, s.Kind); err != nil {
		return v, err
	}
	var o faultfs.PowerCutOptions
	if s.Disk != nil && s.Disk.PowerCut != nil {
		o = *s.Disk.PowerCut
	}
	var err error
	if v.Params, err = json.Marshal(gracefulParams{PowerCut: &o}); err != nil {
		return v, err
	}
	return v, checkTargets(c, s, 1)
}

func (stopThenCut) Inject(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	gc, err := needsGraceful(c, "stop-then-power-cut")
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	dc, err := needsDisks(c, "stop-then-power-cut")
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	var p gracefulParams
	if err := json.Unmarshal(v.Params, &p); err != nil || p.PowerCut == nil {
		return time.Time{}, NotApplied(fmt.Errorf("stop-then-power-cut params %s: expected a power cut spec (%v)", v.Params, err))
	}
	t := v.Targets[0]
	if st := c.State(t); st != cluster.Running {
		return time.Time{}, NotApplied(fmt.Errorf("%s: expected node running, found %s", t, st))
	}
	if _, err := dc.Disk(t); err != nil {
		return time.Time{}, NotApplied(err)
	}
	defer func() { v.Params, _ = json.Marshal(p) }()
	stopErr := stopOne(ctx, gc, t, &p)
	// Cut even after a failed drain (the process is gone either way: the
	// stop kills what does not exit in time), so the fault still happens.
	reports, err := dc.PowerCut([]string{t}, *p.PowerCut)
	p.Reports = reports
	if err := errors.Join(stopErr, err); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

// Heal starts the node on what its disk kept.
func (stopThenCut) Heal(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	return powerCut{}.Heal(ctx, c, v)
}

var gracefulKinds = []Kind{
	{Name: "stop", F: FStop, Sub: "one", Class: Process, MinNodes: 2, pick: one, fault: gracefulStop{},
		Needs: []Capability{CapStop},
		Doc:   "SIGTERM one random node and wait for it to exit (status 0 expected); heal starts it again"},
	{Name: "restart-graceful", F: history.FRestart, Sub: "graceful", Class: Process, MinNodes: 2, Instant: true, pick: one, fault: gracefulStop{restart: true},
		Needs: []Capability{CapStop},
		Doc:   "SIGTERM one random node, wait for its exit (status 0 expected), start it again at once (instant)"},
	{Name: "rolling-restart", F: history.FRestart, Sub: "rolling", Class: Process, MinNodes: 2, Instant: true, Leader: true, pick: shuffled, fault: rolling{},
		Needs: []Capability{CapStop, CapLeader}, Timeout: 3 * time.Minute,
		Doc: "every member in turn: SIGTERM, wait for the exit, start, wait until ready; the leader first or last, as drawn (instant)"},
	{Name: "stop-then-power-cut", F: history.FStopPowerCut, Sub: "one", Class: Process, MinNodes: 2, pick: one, fault: stopThenCut{},
		Needs: []Capability{CapStop, CapDisk},
		Doc:   "SIGTERM one random node and cut its disk the moment it exits: what its shutdown left unsynced is lost; heal starts it on what survived"},
}

// FStop is the history f of a graceful stop (kind stop).
const FStop = history.FStop
