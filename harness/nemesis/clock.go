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
	"github.com/tidaldb/tidal/harness/history"
)

// Clock faults move nodes' clocks through the test-only
// clock offset of tidal-server (--test-clock-offset-file, written by
// cluster.SetClockOffset): stamping, the future-ts bound and the clock
// probes all see the moved clock, as they would a real one that is off.
//
//   - clock-skew: a random minority each gets a steady offset, all either
//     within --max-clock-skew (±20s: they keep taking writes, stamped up to
//     20s off, and the aggregates checker must allow exactly that) or
//     beyond it (±3m: they must refuse writes, 503, while the majority
//     takes them). Which, and each node's sign, is drawn per step.
//   - clock-jump: one random node's clock steps by ±2h, more than the
//     1h window, so a single write stamped with it would visibly prune
//     that key's window; the node must refuse writes from the step on.
//
// Heal sets the targets' clocks back (a step back: the guard re-measures
// before taking writes again). The magnitudes assume the default
// --max-clock-skew of 1m; the fault records the bound the runner says the
// nodes run with (Runner.ClockBound), and checkers judge by that.
const (
	// Clock faults move node clocks; one clock fault at a time.
	Clock Class = "clock"

	skewWithin = 20 * time.Second
	skewBeyond = 3 * time.Minute
	jumpBy     = 2 * time.Hour
	// DefaultClockBound is tidal-server's default --max-clock-skew.
	DefaultClockBound = time.Minute
)

// ClockSetter is a cluster whose nodes' clocks can be moved:
// *cluster.Cluster started with ClockControl (Live passes it through).
type ClockSetter interface {
	// SetClockOffset moves node's clock and returns when the node runs
	// with it; cluster.ErrClockDeferred when the node is not running.
	SetClockOffset(ctx context.Context, node string, offset time.Duration) (time.Time, error)
}

// UsesClock reports whether any of kinds is a clock fault: the cluster
// must then be started with cluster.Config.ClockControl.
func UsesClock(kinds []string) bool {
	return slices.ContainsFunc(kinds, func(name string) bool {
		k, ok := LookupKind(name)
		return ok && k.Class == Clock
	})
}

// clockOffsets draws a clock step's offsets for its targets; nil for other
// kinds, which draw nothing (so adding clock kinds changed no other
// schedule).
func clockOffsets(r *rand.Rand, kind string, targets []string) map[string]time.Duration {
	sign := func() time.Duration {
		if r.IntN(2) == 0 {
			return -1
		}
		return 1
	}
	out := map[string]time.Duration{}
	switch kind {
	case "clock-skew":
		size := skewWithin
		if r.IntN(2) == 0 {
			size = skewBeyond
		}
		for _, t := range targets {
			out[t] = sign() * size
		}
	case "clock-jump":
		for _, t := range targets {
			out[t] = sign() * jumpBy
		}
	default:
		return nil
	}
	return out
}

// validateClockStep checks that a clock step gives every target an offset.
func validateClockStep(st Step) error {
	k, ok := LookupKind(st.Kind)
	if !ok || k.Class != Clock {
		return nil
	}
	for _, t := range st.Targets {
		if _, ok := st.Offsets[t]; !ok {
			return fmt.Errorf("offsets: expected one for target %s, found %v", t, st.Offsets)
		}
	}
	return nil
}

// clockShift moves its targets' clocks by the step's offsets.
type clockShift struct {
	sub string // "skew", "jump"
}

func (f clockShift) Resolve(_ context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: f.sub, Targets: slices.Clone(s.Targets)}
	if _, ok := c.(ClockSetter); !ok {
		return v, fmt.Errorf("%s: expected a cluster whose clocks can be moved (cluster.Config.ClockControl), found %T", s.Kind, c)
	}
	want := 1
	if f.sub == "skew" {
		want = -1
		if n := len(c.Names()); 2*len(s.Targets) >= n {
			return v, fmt.Errorf("%s: expected a minority of %d nodes, found targets %v", s.Kind, n, s.Targets)
		}
	}
	if err := checkTargets(c, s, want); err != nil {
		return v, err
	}
	if err := validateClockStep(s); err != nil {
		return v, fmt.Errorf("%s: %w", s.Kind, err)
	}
	p := history.ClockParams{OffsetsMS: map[string]int64{}, BoundMS: DefaultClockBound.Milliseconds()}
	if b, ok := c.(interface{ ClockBound() time.Duration }); ok && b.ClockBound() > 0 {
		p.BoundMS = b.ClockBound().Milliseconds()
	}
	for _, t := range s.Targets {
		p.OffsetsMS[t] = s.Offsets[t].Milliseconds()
	}
	var err error
	v.Params, err = json.Marshal(p)
	return v, err
}

func clockParams(v *history.FaultValue) (history.ClockParams, error) {
	var p history.ClockParams
	if err := json.Unmarshal(v.Params, &p); err != nil {
		return p, fmt.Errorf("clock fault params %s: %w", v.Params, err)
	}
	return p, nil
}

func (f clockShift) Inject(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	p, err := clockParams(v)
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	for _, t := range v.Targets {
		if st := c.State(t); st != cluster.Running {
			return time.Time{}, NotApplied(fmt.Errorf("%s: expected node running, found %s", t, st))
		}
	}
	var at time.Time
	for _, t := range v.Targets {
		at, err = c.(ClockSetter).SetClockOffset(ctx, t, time.Duration(p.OffsetsMS[t])*time.Millisecond)
		if errors.Is(err, cluster.ErrNoClockControl) {
			return time.Time{}, NotApplied(fmt.Errorf("%s: %w", t, err))
		}
		if err != nil {
			// The file may have been written: the fault may be in effect.
			return time.Time{}, fmt.Errorf("%s: %w", t, err)
		}
	}
	return at, nil
}

func (f clockShift) Heal(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	return resetClocks(ctx, c, v.Targets)
}

// resetClocks sets nodes' clocks back to the true one. A node not running
// takes it when it runs again, which is what a heal of it needs.
func resetClocks(ctx context.Context, c Cluster, nodes []string) (time.Time, error) {
	setter, ok := c.(ClockSetter)
	if !ok {
		return time.Time{}, fmt.Errorf("clock heal: expected a cluster whose clocks can be moved, found %T", c)
	}
	var errs []error
	for _, t := range nodes {
		if _, err := setter.SetClockOffset(ctx, t, 0); err != nil && !errors.Is(err, cluster.ErrClockDeferred) {
			errs = append(errs, fmt.Errorf("%s: %w", t, err))
		}
	}
	return time.Now(), errors.Join(errs...)
}

// healClocks is HealAll's part for clocks: the targets of the clock fault
// still active (a heal that failed, or none yet) are set back.
func (r *Runner) healClocks(ctx context.Context) error {
	for _, a := range r.activeFaults() {
		if a.kind.Class != Clock {
			continue
		}
		if _, err := resetClocks(ctx, r.c, a.value.Targets); err != nil {
			return fmt.Errorf("clocks: %w", err)
		}
	}
	return nil
}
