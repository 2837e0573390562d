package nemesis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
)

// Runner injects and heals faults against one cluster and records them in
// one history. Its methods are safe for concurrent use; fault operations
// are serialized, so the history shows them one at a time.
type Runner struct {
	c   Cluster
	rec *history.Recorder
	log *slog.Logger

	// ResolveTimeout bounds finding the leader for a leader-targeted fault
	// (default 5s); a cluster without a leader that long fails the fault.
	ResolveTimeout time.Duration
	// ActionTimeout bounds one inject or heal (default 30s).
	ActionTimeout time.Duration
	// RecoveryTimeout bounds HealAll: undoing every fault, then a leader
	// and convergence (default 60s).
	RecoveryTimeout time.Duration

	// Quiet, when set, is the workload's gate for new ops, and
	// QuietBeforeCut how long it stays closed before a power cut (see
	// quiet.go); zero or no gate: cuts land on whatever is in flight.
	Quiet          Quieter
	QuietBeforeCut time.Duration

	// members are the slots that held a member when the runner was made;
	// HealAll adds back any of them that churn left removed.
	members []string

	op       sync.Mutex // serializes fault operations
	mu       sync.Mutex // guards active and outcomes
	active   map[Class]*activeFault
	outcomes map[string]*KindOutcome
}

// KindOutcome counts what became of the faults of one kind this runner
// injected: how many took effect, failed (certainly did not happen), or
// ended unconfirmed (may have), how many heals took effect or failed, and
// the last error. The verdict on it is the faults checker's, from the
// history; this is for the progress output and Run's error.
type KindOutcome struct {
	Kind        string
	Invoked     int
	TookEffect  int
	Failed      int
	Unconfirmed int
	Healed      int
	HealFailed  int
	LastError   error
}

func (o KindOutcome) String() string {
	s := fmt.Sprintf("%s: %d invoked, %d took effect, %d healed", o.Kind, o.Invoked, o.TookEffect, o.Healed)
	if o.Failed+o.Unconfirmed > 0 {
		s += fmt.Sprintf(", %d failed, %d unconfirmed", o.Failed, o.Unconfirmed)
	}
	if o.HealFailed > 0 {
		s += fmt.Sprintf(", %d heals failed", o.HealFailed)
	}
	if o.LastError != nil {
		s += fmt.Sprintf(" (last error: %v)", o.LastError)
	}
	return s
}

// activeFault is an injected fault not yet healed. Faults whose inject
// ended info are active too: they may be in effect.
type activeFault struct {
	kind      Kind
	value     history.FaultValue
	step      int // index in the running schedule; -1 when injected directly
	since     time.Time
	confirmed bool // its inject completed ok
}

func (a *activeFault) label() string {
	s := a.kind.Name
	if len(a.value.Targets) > 0 {
		s += " on " + strings.Join(a.value.Targets, ",")
	}
	return s
}

// NewRunner makes a runner for c (see Live) recording into rec.
func NewRunner(c Cluster, rec *history.Recorder, log *slog.Logger) *Runner {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runner{c: c, rec: rec, log: log.With("component", "nemesis"),
		ResolveTimeout: 5 * time.Second, ActionTimeout: 30 * time.Second, RecoveryTimeout: 60 * time.Second,
		active: map[Class]*activeFault{}, outcomes: map[string]*KindOutcome{}}
	for _, n := range c.Names() {
		if c.State(n) != cluster.Removed {
			r.members = append(r.members, n)
		}
	}
	return r
}

// Active describes the faults in effect now ("kill-leader on n2"), for a
// progress line.
func (r *Runner) Active() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, a := range r.active {
		out = append(out, a.label())
	}
	sort.Strings(out)
	return out
}

// Outcomes returns what became of the faults of each kind injected so
// far, by kind name.
func (r *Runner) Outcomes() map[string]KindOutcome {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]KindOutcome, len(r.outcomes))
	for k, o := range r.outcomes {
		out[k] = *o
	}
	return out
}

// count updates the outcome of kind under r.mu.
func (r *Runner) count(kind string, update func(*KindOutcome)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o := r.outcomes[kind]
	if o == nil {
		o = &KindOutcome{Kind: kind}
		r.outcomes[kind] = o
	}
	update(o)
}

func (r *Runner) activeIn(c Class) *activeFault {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.active[c]
}

func (r *Runner) setActive(c Class, a *activeFault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a == nil {
		delete(r.active, c)
	} else {
		r.active[c] = a
	}
}

// Inject applies one step now. Heal it with Heal (instant kinds need no
// heal). If a fault of the same class is active, it is healed first.
func (r *Runner) Inject(ctx context.Context, s Step) error {
	r.op.Lock()
	defer r.op.Unlock()
	return r.inject(ctx, s, -1)
}

// Heal heals the active fault of kind.
func (r *Runner) Heal(ctx context.Context, kind string) error {
	k, ok := LookupKind(kind)
	if !ok {
		return fmt.Errorf("nemesis: heal: unknown kind %q; expected one of %v", kind, KindNames())
	}
	r.op.Lock()
	defer r.op.Unlock()
	a := r.activeIn(k.Class)
	if a == nil || a.kind.Name != kind {
		return fmt.Errorf("nemesis: heal %s: expected it active, found active %v", kind, r.Active())
	}
	return r.heal(ctx, a)
}

func (r *Runner) inject(ctx context.Context, s Step, step int) error {
	k, ok := LookupKind(s.Kind)
	if !ok {
		return fmt.Errorf("nemesis: unknown kind %q; expected one of %v", s.Kind, KindNames())
	}
	if prev := r.activeIn(k.Class); prev != nil {
		// Only a hand-written schedule gets here (Generate never overlaps a
		// class). An instant restart heals a pause too: it must not meet a
		// paused or killed node.
		r.log.Info("healing the active fault of the same class first", "active", prev.label(), "next", k.Name)
		if err := r.heal(ctx, prev); err != nil {
			r.log.Warn("heal before inject failed; injecting anyway", "active", prev.label(), "err", err)
		}
	}

	rctx, cancel := context.WithTimeout(ctx, r.ResolveTimeout)
	v, rerr := k.fault.Resolve(rctx, r.c, s)
	cancel()
	v.Instant = k.Instant
	if k.Sub != "" {
		v.Kind = k.Sub
	} else if v.Kind == "" {
		v.Kind = k.Name
	}
	inv := r.rec.Invoke(history.Nemesis, k.F, v, "")
	if rerr != nil {
		r.rec.Complete(inv, history.Fail, nil, rerr, 0, 0)
		r.log.Warn("fault not injected", "kind", k.Name, "err", rerr)
		r.count(k.Name, func(o *KindOutcome) { o.Invoked++; o.Failed++; o.LastError = rerr })
		return fmt.Errorf("nemesis: %s: %w", k.Name, rerr)
	}
	r.log.Info("injecting fault", "kind", k.Name, "targets", v.Targets, "step", step)

	reopen := r.quietBefore(ctx, k)
	actx, cancel := context.WithTimeout(ctx, max(r.ActionTimeout, k.Timeout))
	at, err := k.fault.Inject(actx, r.c, &v)
	cancel()
	reopen()
	if err != nil {
		typ := history.Info
		if IsNotApplied(err) {
			typ = history.Fail
		}
		r.rec.Complete(inv, typ, v, err, 0, 0)
		r.log.Warn("fault injection failed", "kind", k.Name, "targets", v.Targets, "outcome", typ, "err", err)
		r.count(k.Name, func(o *KindOutcome) {
			o.Invoked++
			if typ == history.Fail {
				o.Failed++
			} else {
				o.Unconfirmed++
			}
			o.LastError = err
		})
		if typ == history.Info && !k.Instant {
			r.setActive(k.Class, &activeFault{kind: k, value: v, step: step, since: time.Now()})
		}
		return fmt.Errorf("nemesis: %s on %v: %w", k.Name, v.Targets, err)
	}
	r.rec.Complete(inv, history.OK, v, nil, 0, 0)
	r.count(k.Name, func(o *KindOutcome) {
		o.Invoked++
		o.TookEffect++
		if k.Instant {
			o.Healed++ // over as soon as it took effect
		}
	})
	attrs := []any{"kind", k.Name, "targets", v.Targets, "took", at.Sub(timeOf(r.rec, inv)).Round(time.Microsecond)}
	if v.Grudge != nil {
		attrs = append(attrs, "hears-nothing-from", v.Grudge)
	}
	r.log.Info("fault in effect", attrs...)
	if !k.Instant {
		r.setActive(k.Class, &activeFault{kind: k, value: v, step: step, since: at, confirmed: true})
	}
	return nil
}

// timeOf is the wall-clock instant of a recorded op.
func timeOf(rec *history.Recorder, op history.Op) time.Time {
	return rec.Start().Add(time.Duration(op.Time))
}

// activeFaults returns the faults in effect now.
func (r *Runner) activeFaults() []*activeFault {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*activeFault, 0, len(r.active))
	for _, a := range r.active {
		out = append(out, a)
	}
	return out
}

// countHealed counts a's heal, if a had taken effect (a fault whose
// inject ended unconfirmed is active, but was never counted in effect).
func (r *Runner) countHealed(a *activeFault) {
	if a.confirmed {
		r.count(a.kind.Name, func(o *KindOutcome) { o.Healed++ })
	}
}

// heal undoes a and records heal-<f>. A heal that fails leaves a active:
// HealAll tries again from the cluster's state.
func (r *Runner) heal(ctx context.Context, a *activeFault) error {
	v := a.value
	inv := r.rec.Invoke(history.Nemesis, history.HealOf(a.kind.F), v, "")
	actx, cancel := context.WithTimeout(ctx, r.ActionTimeout)
	_, err := a.kind.fault.Heal(actx, r.c, &v)
	cancel()
	if err != nil {
		r.rec.Complete(inv, history.Info, v, err, 0, 0)
		r.log.Warn("heal failed", "fault", a.label(), "err", err)
		r.count(a.kind.Name, func(o *KindOutcome) { o.HealFailed++; o.LastError = err })
		return fmt.Errorf("nemesis: heal %s: %w", a.label(), err)
	}
	r.rec.Complete(inv, history.OK, v, nil, 0, 0)
	r.setActive(a.kind.Class, nil)
	r.countHealed(a)
	r.log.Info("fault healed", "fault", a.label(), "lasted", time.Since(a.since).Round(time.Millisecond))
	return nil
}

// Run executes s against the cluster: each step at its time from now,
// each heal when the step's duration is over, until s.End(); then HealAll.
// Steps run one at a time, in time order (heals before injects at the same
// instant); a step that runs late is logged, not skipped. A failed step is
// recorded and logged and the run goes on.
//
// When ctx ends early the remaining steps are dropped, but HealAll still
// runs (on a context detached from ctx, bounded by RecoveryTimeout): a
// cancelled run must not leave the cluster partitioned. Run then returns
// ctx's error joined with HealAll's.
//
// A fault that never took effect is not a fault: Run's error also names
// every kind of the schedule none of whose faults took effect and was
// healed (ErrNotExercised), so a caller cannot mistake a run that
// injected nothing for one that survived its faults.
func (r *Runner) Run(ctx context.Context, s Schedule) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("nemesis: run: %w", err)
	}
	type event struct {
		at   time.Duration
		heal bool
		step int
	}
	var events []event
	for i, st := range s.Steps {
		events = append(events, event{st.At, false, i})
		if k, _ := LookupKind(st.Kind); !k.Instant {
			events = append(events, event{st.At + st.Duration, true, i})
		}
	}
	sort.SliceStable(events, func(i, j int) bool {
		a, b := events[i], events[j]
		if a.at != b.at {
			return a.at < b.at
		}
		return a.heal && !b.heal
	})
	start := time.Now()
	r.log.Info("nemesis schedule starting", "seed", s.Seed, "steps", len(s.Steps), "end", s.End())
	wait := func(at time.Duration) bool {
		t := time.NewTimer(time.Until(start.Add(at)))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for _, ev := range events {
		if !wait(ev.at) {
			break
		}
		if late := time.Since(start) - ev.at; late > time.Second {
			r.log.Warn("nemesis step running late", "step", ev.step, "heal", ev.heal, "late", late.Round(time.Millisecond))
		}
		r.op.Lock()
		if ev.heal {
			k, _ := LookupKind(s.Steps[ev.step].Kind)
			if a := r.activeIn(k.Class); a != nil && a.step == ev.step {
				r.heal(ctx, a) // recorded and logged; HealAll retries
			}
		} else {
			r.inject(ctx, s.Steps[ev.step], ev.step)
		}
		r.op.Unlock()
	}
	if ctx.Err() == nil {
		wait(s.End())
	}
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.RecoveryTimeout)
	defer cancel()
	healErr := r.HealAll(hctx)
	var unexercised []string
	outcomes := r.Outcomes()
	for _, kind := range s.Kinds() {
		if o := outcomes[kind]; o.Healed == 0 {
			if o.Invoked == 0 {
				o.Kind = kind
			}
			unexercised = append(unexercised, o.String())
		}
	}
	var notExercised error
	if len(unexercised) > 0 {
		notExercised = fmt.Errorf("%w: %s", ErrNotExercised, strings.Join(unexercised, "; "))
	}
	return errors.Join(ctx.Err(), healErr, notExercised)
}

// ErrNotExercised says that some fault kind of a schedule never once took
// effect and was healed.
var ErrNotExercised = errors.New("nemesis: fault kinds never exercised")

// HealAll undoes everything: removes every partition and link fault from
// the mesh, clears every disk fault (before any node starts), resumes
// paused nodes, starts killed and stopped ones and those a disk fault made
// exit on their own, and adds back members that churn removed; records one heal-all op; then waits,
// within RecoveryTimeout, for a leader and for every node to converge. It
// works from the cluster's state, not only from the faults the runner
// injected, so it also clears what a failed heal or a test left behind.
//
// The heal-all op completes ok when every fault is undone (that is when
// fault windows end and catch-up time starts); the recovery wait after it
// is not part of any window. Its error, if any, is returned.
func (r *Runner) HealAll(ctx context.Context) error {
	r.op.Lock()
	defer r.op.Unlock()
	ctx, cancel := context.WithTimeout(ctx, r.RecoveryTimeout)
	defer cancel()
	active := r.Active()
	inv := r.rec.Invoke(history.Nemesis, history.HealAll, history.FaultValue{Kind: "all", Targets: r.c.Names()}, "")
	r.log.Info("healing everything", "active", active)

	var errs []error
	if err := r.healClocks(ctx); err != nil {
		errs = append(errs, err)
	}
	if m := r.c.Mesh(); m != nil {
		if _, err := m.Reset(); err != nil {
			errs = append(errs, fmt.Errorf("relay mesh: %w", err))
		}
	}
	// Disks first, before any node starts again: a node must not come
	// back onto a disk that still fails.
	if err := clearDisks(r.c); err != nil {
		errs = append(errs, fmt.Errorf("disks: %w", err))
	}
	for _, n := range r.c.Names() {
		var err error
		switch r.c.State(n) {
		case cluster.Paused:
			err = r.c.Resume(n)
		case cluster.Killed, cluster.Stopped:
			err = r.c.Start(n)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n, err))
		}
	}
	// A node a disk fault made exit on its own (fenced, or refusing a
	// corrupt log) comes back too, on the cleared disk.
	if err := reviveDisks(r.c); err != nil {
		errs = append(errs, err)
	}
	if err := r.readd(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		// Not ok: the history keeps every fault window open until a heal
		// is confirmed, and the active faults stay for the next HealAll.
		r.rec.Complete(inv, history.Info, nil, err, 0, 0)
		r.log.Warn("heal-all incomplete", "err", err)
		for _, a := range r.activeFaults() {
			r.count(a.kind.Name, func(o *KindOutcome) { o.HealFailed++; o.LastError = err })
		}
		return fmt.Errorf("nemesis: heal all: %w", err)
	}
	r.rec.Complete(inv, history.OK, nil, nil, 0, 0)
	for _, a := range r.activeFaults() {
		r.countHealed(a)
	}
	r.mu.Lock()
	clear(r.active)
	r.mu.Unlock()

	begin := time.Now()
	if err := r.c.WaitConverged(ctx); err != nil {
		return fmt.Errorf("nemesis: after heal-all, expected a leader and converged nodes within %s: %w", r.RecoveryTimeout, err)
	}
	r.log.Info("cluster recovered", "took", time.Since(begin).Round(time.Millisecond))
	return nil
}

// readd adds back every original member slot churn left removed, once a
// leader can take the change; it retries until ctx ends, because the
// cluster may still be electing after the other heals.
func (r *Runner) readd(ctx context.Context) error {
	for _, n := range r.members {
		for {
			var err error
			switch r.c.State(n) {
			case cluster.Removed:
				if _, err = r.c.WaitLeader(ctx); err == nil {
					_, err = r.c.AddMember(ctx, n)
				}
			case cluster.Stopped, cluster.Killed:
				err = r.c.Start(n)
			}
			if err == nil {
				break
			}
			r.log.Info("re-adding member failed; retrying", "node", n, "err", err)
			select {
			case <-ctx.Done():
				return fmt.Errorf("re-adding %s: %w (last error: %v)", n, ctx.Err(), err)
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// Kinds returns the names of the kinds s uses, sorted (for reports).
func (s Schedule) Kinds() []string {
	var out []string
	for _, st := range s.Steps {
		if !slices.Contains(out, st.Kind) {
			out = append(out, st.Kind)
		}
	}
	slices.Sort(out)
	return out
}
