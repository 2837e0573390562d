package shrink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
)

// Verdict is what one run of a candidate found.
type Verdict struct {
	Valid     checker.Validity
	Signature Signature
	// Dir is the run's directory in the store ("" for a fake oracle).
	Dir string
}

// Oracle runs a candidate once. An error is a run that could not be
// carried out (no binary, a cluster that never came up): the shrink
// stops with it, since every later candidate would fail alike.
type Oracle interface {
	Run(ctx context.Context, c Candidate) (Verdict, error)
}

// OracleFunc adapts a function to Oracle.
type OracleFunc func(ctx context.Context, c Candidate) (Verdict, error)

func (f OracleFunc) Run(ctx context.Context, c Candidate) (Verdict, error) { return f(ctx, c) }

// Options configure a search. Zero fields take the defaults named.
type Options struct {
	Oracle Oracle
	// Primary is the anomaly a candidate must show to fail the same way.
	Primary Anomaly
	// Budget bounds the search's wall-clock time (0: none). Once spent,
	// no further run starts and the best candidate so far is the result.
	Budget time.Duration
	// MaxRuns is k's upper bound: how many runs of the unchanged schedule
	// the reproduction takes, and how many passing runs reject a
	// candidate when the failure is flaky. Default 3.
	MaxRuns int
	// Settle is what the run-length pass leaves after the last heal.
	// Default 5s.
	Settle time.Duration
	// MinFault is the shortest fault the duration pass makes. Default
	// 500ms.
	MinFault time.Duration
	// MinStart is the earliest offset the offset pass moves a fault to,
	// so the workload has begun. Default 2s.
	MinStart time.Duration
	// Granularity is how close the offset pass's bisection gets. Default
	// 1s.
	Granularity time.Duration
	// Now is the clock the budget is measured on. Default time.Now.
	Now func() time.Time
	// Progress gets one line per run. Nil: discard.
	Progress io.Writer
	// Record is called after every run with the search so far (to keep
	// shrink.json current). Nil: nothing.
	Record func(*Report) error
}

func (o *Options) defaults() {
	if o.MaxRuns <= 0 {
		o.MaxRuns = 3
	}
	if o.Settle <= 0 {
		o.Settle = 5 * time.Second
	}
	if o.MinFault <= 0 {
		o.MinFault = 500 * time.Millisecond
	}
	if o.MinStart <= 0 {
		o.MinStart = 2 * time.Second
	}
	if o.Granularity <= 0 {
		o.Granularity = time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

// Outcomes of a trial.
const (
	Fails     = "fails"     // some run failed the same way
	Passes    = "passes"    // k runs, none failed the same way
	Undecided = "undecided" // the budget ran out first
)

// Run is one run of a trial.
type Run struct {
	Dir       string           `json:"dir,omitempty"`
	Valid     checker.Validity `json:"valid"`
	Signature Signature        `json:"signature"`
	Same      bool             `json:"same_way"`
	Elapsed   string           `json:"elapsed"`
}

// Trial is one candidate and every run of it: shrink.json lists them.
type Trial struct {
	Hash     string    `json:"hash"`
	Phase    string    `json:"phase"`
	Episodes []int     `json:"episodes"`
	Schedule string    `json:"schedule"`
	Duration string    `json:"duration"`
	Runs     []Run     `json:"runs"`
	Outcome  string    `json:"outcome"`
	c        Candidate // what was run
}

func (t *Trial) failures() int {
	n := 0
	for _, r := range t.Runs {
		if r.Same {
			n++
		}
	}
	return n
}

// Report is a search's record: what it kept and everything it tried.
type Report struct {
	Primary Anomaly `json:"primary"`
	// Reproduced: the unchanged schedule failed the same way in at least
	// one of OriginalRuns runs. Without that there is nothing to shrink.
	Reproduced       bool `json:"reproduced"`
	OriginalRuns     int  `json:"original_runs"`
	OriginalFailures int  `json:"original_failures"`
	// Flaky: the unchanged schedule failed the same way in some of its
	// runs, not all: a candidate is kept at its first same-way failure and
	// rejected after MaxRuns passing runs (see Search).
	Flaky           bool      `json:"flaky"`
	Original        Candidate `json:"original"`
	OriginalLength  string    `json:"original_duration"`
	Minimal         Candidate `json:"minimal"`
	MinimalLength   string    `json:"minimal_duration"`
	Runs            int       `json:"runs"`
	CacheHits       int       `json:"cache_hits"`
	BudgetExhausted bool      `json:"budget_exhausted"`
	Elapsed         string    `json:"elapsed"`
	Trials          []*Trial  `json:"trials"`
	// Confirm are the runs of the minimum after the search.
	Confirm []Run `json:"confirm,omitempty"`
}

// ConfirmFailures counts the confirmation runs that failed the same way.
func (r *Report) ConfirmFailures() int {
	n := 0
	for _, c := range r.Confirm {
		if c.Same {
			n++
		}
	}
	return n
}

// errBudget stops a search whose budget is spent.
var errBudget = errors.New("shrink: budget spent")

type search struct {
	o      Options
	start  time.Time
	rep    *Report
	cache  map[string]*Trial
	best   Candidate
	err    error // first oracle error or errBudget; every later test answers false
	phase  string
	trials int
}

// Search shrinks original: it checks that the unchanged schedule fails
// the same way, then runs ddmin over its episodes and the shortening
// passes (fewer targets, shorter faults, earlier offsets, a shorter run).
// The error is an oracle's or the context's; a spent budget is not an
// error (Report.BudgetExhausted).
//
// How many runs a candidate gets adapts to the failure. The unchanged
// schedule is run MaxRuns times first, all of them. If it failed in every
// one, the failure looks deterministic, and a candidate must look as
// reliable: it is rejected at its first passing run (one run rejects
// fast) and kept after two runs that both failed the same way (a
// confirming run before keeping it), so the shortening passes cannot
// trade a reliable failure for a flaky one. If it failed in only some,
// the failure is flaky, and a candidate is kept as soon as one of up to
// MaxRuns runs fails the same way and rejected only after MaxRuns
// passing runs, so a minimum that fails one time in two is still kept.
func Search(ctx context.Context, original Candidate, o Options) (*Report, error) {
	o.defaults()
	s := &search{o: o, start: o.Now(), cache: map[string]*Trial{}, best: original,
		rep: &Report{Primary: o.Primary, Original: original, OriginalLength: original.Duration.String()}}
	defer s.finish()

	// Reproduce: MaxRuns runs of the unchanged schedule, all of them,
	// which also measure how flaky the failure is.
	s.phase = "original"
	t := s.trial(original)
	for len(t.Runs) < o.MaxRuns && s.err == nil {
		s.runOnce(ctx, t)
	}
	s.rep.OriginalRuns, s.rep.OriginalFailures = len(t.Runs), t.failures()
	s.rep.Reproduced = t.failures() > 0
	s.rep.Flaky = t.failures() > 0 && t.failures() < len(t.Runs)
	s.decide(t)
	if s.rep.Flaky {
		fmt.Fprintf(s.o.Progress, "shrink: the original failed the same way in %d of %d runs: flaky; a candidate is kept at its first same-way failure, rejected after %d passing runs\n", t.failures(), len(t.Runs), s.o.MaxRuns)
	} else if s.rep.Reproduced {
		fmt.Fprintf(s.o.Progress, "shrink: the original failed the same way in %d of %d runs; a candidate is rejected at its first passing run, kept after 2 same-way failures\n", t.failures(), len(t.Runs))
	}
	if !s.rep.Reproduced {
		return s.rep, s.fatal()
	}

	s.phase = "ddmin"
	keep := ddmin(original.IDs(), func(ids []int) bool { return s.test(ctx, s.best.Keep(ids)) })
	s.best = s.best.Keep(keep)

	s.targetsPass(ctx)
	s.durationsPass(ctx)
	s.offsetsPass(ctx)
	s.lengthPass(ctx)
	return s.rep, s.fatal()
}

func (s *search) finish() {
	s.rep.Minimal = s.best
	s.rep.MinimalLength = s.best.Duration.String()
	s.rep.BudgetExhausted = errors.Is(s.err, errBudget)
	s.rep.Elapsed = s.o.Now().Sub(s.start).Round(time.Second).String()
	s.record()
}

func (s *search) fatal() error {
	if s.err == nil || errors.Is(s.err, errBudget) {
		return nil
	}
	return s.err
}

func (s *search) record() {
	if s.o.Record != nil {
		if err := s.o.Record(s.rep); err != nil && s.err == nil {
			s.err = err
		}
	}
}

// trial is c's cached trial, made on first sight.
func (s *search) trial(c Candidate) *Trial {
	h := c.Hash()
	if t, ok := s.cache[h]; ok {
		s.rep.CacheHits++
		return t
	}
	t := &Trial{Hash: h, Phase: s.phase, Episodes: c.IDs(), Schedule: c.String(), Duration: c.Duration.String(), c: c}
	s.cache[h] = t
	s.rep.Trials = append(s.rep.Trials, t)
	return t
}

// decide sets t's outcome from its runs: see Search for the rule.
func (s *search) decide(t *Trial) {
	f, n := t.failures(), len(t.Runs)
	switch {
	case s.rep.Flaky && f > 0, !s.rep.Flaky && n >= 2 && f == n:
		t.Outcome = Fails
	case s.rep.Flaky && n >= s.o.MaxRuns, !s.rep.Flaky && f < n, n >= s.o.MaxRuns && f == 0:
		t.Outcome = Passes
	default:
		t.Outcome = Undecided
	}
}

// test says whether c fails the same way, running it as often as the
// rule asks and no more than the cache already knows.
func (s *search) test(ctx context.Context, c Candidate) bool {
	t := s.trial(c)
	for t.Outcome == "" || t.Outcome == Undecided {
		if s.err != nil {
			break
		}
		s.runOnce(ctx, t)
	}
	return t.Outcome == Fails
}

// runOnce runs t's candidate once, unless the budget is spent.
func (s *search) runOnce(ctx context.Context, t *Trial) {
	if s.err != nil {
		return
	}
	if err := ctx.Err(); err != nil {
		s.err = err
		return
	}
	if s.o.Budget > 0 && s.o.Now().Sub(s.start) >= s.o.Budget {
		s.err = errBudget
		fmt.Fprintf(s.o.Progress, "shrink: budget %s spent after %d runs; keeping the best so far\n", s.o.Budget, s.rep.Runs)
		return
	}
	if t.Runs == nil {
		s.trials++
	}
	v, err := s.o.Oracle.Run(ctx, t.c)
	if err != nil {
		s.err = fmt.Errorf("shrink: running candidate %s (%s): %w", t.Hash, t.Schedule, err)
		return
	}
	s.rep.Runs++
	r := Run{Dir: v.Dir, Valid: v.Valid, Signature: v.Signature, Same: SameWay(s.o.Primary, v.Signature),
		Elapsed: s.o.Now().Sub(s.start).Round(time.Second).String()}
	t.Runs = append(t.Runs, r)
	s.decide(t)
	same := "other"
	if r.Same {
		same = "same way"
	} else if v.Valid != checker.Invalid {
		same = "no anomaly"
	}
	fmt.Fprintf(s.o.Progress, "shrink %6s  %-9s %s  %2d episodes  run %d  %-7s %s (%s)  [%s]\n",
		r.Elapsed, s.phase, t.Hash, len(t.Episodes), len(t.Runs), verdictWord(v.Valid), v.Signature, same, t.Schedule)
	s.record()
}

func verdictWord(v checker.Validity) string {
	switch v {
	case checker.Valid:
		return "VALID"
	case checker.Invalid:
		return "INVALID"
	}
	return "UNKNOWN"
}

// ddmin is Zeller's delta debugging minimization: the smallest subset of
// items it finds for which fails holds, given that it holds for items. It
// tries each of n chunks, then each complement, and doubles n when
// neither fails. The result is 1-minimal when fails is deterministic:
// removing any single item makes it pass.
func ddmin(items []int, fails func([]int) bool) []int {
	n := 2
	for len(items) >= 2 {
		chunks := split(items, n)
		reduced := false
		for _, c := range chunks {
			if fails(c) {
				items, n, reduced = c, 2, true
				break
			}
		}
		if !reduced && n > 2 {
			for i := range chunks {
				comp := complement(chunks, i)
				if fails(comp) {
					items, n, reduced = comp, max(n-1, 2), true
					break
				}
			}
		}
		if !reduced {
			if n >= len(items) {
				break
			}
			n = min(2*n, len(items))
		}
	}
	return items
}

// split cuts items into n chunks of near-equal size, in order.
func split(items []int, n int) [][]int {
	out := make([][]int, 0, n)
	start := 0
	for i := range n {
		end := start + (len(items)-start)/(n-i)
		out = append(out, items[start:end:end])
		start = end
	}
	return out
}

func complement(chunks [][]int, skip int) []int {
	var out []int
	for i, c := range chunks {
		if i != skip {
			out = append(out, c...)
		}
	}
	return out
}

// targetsPass drops targets of the episodes whose kind allows fewer, one
// at a time, while the candidate still fails.
func (s *search) targetsPass(ctx context.Context) {
	s.phase = "targets"
	for i := range s.best.Episodes {
		for changed := true; changed; {
			changed = false
			e := s.best.Episodes[i]
			if !fewerTargets(e.Step.Kind) || len(e.Step.Targets) < 2 {
				break
			}
			for _, t := range e.Step.Targets {
				c := s.best.with(i, Episode{ID: e.ID, Step: withoutTarget(e.Step, t)})
				if s.test(ctx, c) {
					s.best, changed = c, true
					break
				}
			}
		}
	}
}

// durationsPass halves each lasting fault while the candidate still
// fails, down to MinFault.
func (s *search) durationsPass(ctx context.Context) {
	s.phase = "durations"
	for i := range s.best.Episodes {
		for {
			e := s.best.Episodes[i]
			d := (e.Step.Duration / 2).Truncate(time.Millisecond)
			if e.Step.Duration == 0 || d < s.o.MinFault {
				break
			}
			e.Step.Duration = d
			c := s.best.with(i, e)
			if !s.test(ctx, c) {
				break
			}
			s.best = c
		}
	}
}

// offsetsPass moves each fault earlier while the candidate still fails:
// first to the earliest start that keeps the order of the episodes and
// keeps faults of one class from overlapping (as generated schedules
// never do), else by bisection between there and where it is, to within
// Granularity.
func (s *search) offsetsPass(ctx context.Context) {
	s.phase = "offsets"
	for i := range s.best.Episodes {
		e := s.best.Episodes[i]
		lower := s.o.MinStart
		if i > 0 {
			lower = max(lower, s.best.Episodes[i-1].Step.At)
		}
		for _, p := range s.best.Episodes[:i] {
			if classOf(p.Step.Kind) == classOf(e.Step.Kind) {
				lower = max(lower, p.End())
			}
		}
		at := func(d time.Duration) (Candidate, bool) {
			e := s.best.Episodes[i]
			e.Step.At = d
			c := s.best.with(i, e)
			return c, s.test(ctx, c)
		}
		if e.Step.At-lower < s.o.Granularity {
			continue
		}
		if c, ok := at(lower); ok {
			s.best = c
			continue
		}
		// lo passes, hi fails.
		lo, hi := lower, e.Step.At
		for hi-lo > s.o.Granularity && s.err == nil {
			mid := lo + ((hi - lo) / 2).Truncate(s.o.Granularity)
			if mid <= lo {
				mid = lo + s.o.Granularity
			}
			if c, ok := at(mid); ok {
				s.best, hi = c, mid
			} else {
				lo = mid
			}
		}
	}
}

// lengthPass ends the run Settle after the last heal, rounded up to the
// second, when that is shorter than it is.
func (s *search) lengthPass(ctx context.Context) {
	s.phase = "length"
	d := (s.best.End() + s.o.Settle + time.Second - 1).Truncate(time.Second)
	if d >= s.best.Duration {
		return
	}
	c := s.best
	c.Duration = d
	if s.test(ctx, c) {
		s.best = c
	}
}

// Confirm runs the minimum n more times with oracle (uncached: these runs
// are the evidence the shrink ends with) and records them in the report.
func Confirm(ctx context.Context, rep *Report, oracle Oracle, n int, progress io.Writer) error {
	if progress == nil {
		progress = io.Discard
	}
	for i := range n {
		v, err := oracle.Run(ctx, rep.Minimal)
		if err != nil {
			return fmt.Errorf("shrink: confirming the minimum: %w", err)
		}
		r := Run{Dir: v.Dir, Valid: v.Valid, Signature: v.Signature, Same: SameWay(rep.Primary, v.Signature)}
		rep.Confirm = append(rep.Confirm, r)
		fmt.Fprintf(progress, "shrink: confirm %d/%d  %-7s %s  %s\n", i+1, n, verdictWord(v.Valid), v.Signature, v.Dir)
	}
	return nil
}
