package runbook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/workload"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// History fault names of a runbook run (process "nemesis"): the injected
// scenario, the runbook as a whole, and each executed block (instant).
const (
	FSetup   = "setup"
	FRunbook = "runbook"
	FStep    = "runbook-step"
)

// WorkloadPrefix starts every event id the default workload writes. The
// ledger checker judges those ids only: events a page writes itself (a
// marker before a backup, a write that checks the cluster takes writes)
// are the page's to verify, and must not start with it.
const WorkloadPrefix = "wl-"

// Config is one execution of one page.
type Config struct {
	Page *Page
	// Store is the run store root; the run goes to <Store>/<Test>/<time>/.
	// Test defaults to "runbook-" + the page's name.
	Store, Test string
	// Script is runbooks/local-cluster.sh; Bin the directory holding
	// tidal-server.
	Script, Bin string
	// OldRelease is the directory of the tidal-server release the
	// cluster starts on ($TIDAL_RELEASE_OLD; "": Bin). Bin is then the
	// release a page upgrades to ($TIDAL_RELEASE_NEW).
	OldRelease string
	// Nodes (default 3) start; Slots (default 5) have addresses.
	Nodes, Slots int
	// ServerFlags are extra flags for every node.
	ServerFlags []string
	// Insecure runs the cluster in plaintext (local-cluster.sh
	// --insecure); by default it is secured, as production runs.
	Insecure bool
	// Scenario is injected before the first block; zero for none.
	Scenario Scenario
	// Workload defaults to a light open-loop ledger load (40 writes/s,
	// round-robin over the members).
	Workload workload.Config
	// Warmup is how many acknowledged writes the workload makes before the
	// scenario and the first block (default 50).
	Warmup int
	// BlockTimeout bounds each block (default DefaultBlockTimeout).
	BlockTimeout time.Duration
	// SLO bounds follower lag; zero fields take checker.DefaultSLO's.
	SLO checker.SLO
	// SampleInterval is how often every member's status is polled (250ms).
	SampleInterval time.Duration
	// Progress gets a line per phase and per block; nil discards.
	Progress io.Writer
}

// storedConfig is config.json: what the run was, in plain data.
type storedConfig struct {
	Page        string          `json:"page"`
	Title       string          `json:"title"`
	Budget      string          `json:"availability_budget"`
	Scenario    string          `json:"scenario,omitempty"`
	Nodes       int             `json:"nodes"`
	Slots       int             `json:"slots"`
	ServerFlags []string        `json:"server_flags"`
	Secured     bool            `json:"secured"`
	Workload    workload.Config `json:"workload"`
	SLO         checker.SLO     `json:"slo"`
}

// Outcome is what one execution produced.
type Outcome struct {
	Run     *report.Run
	Results checker.Results
	// Steps are the executed blocks' results, in order, up to and
	// including the first that failed; Failed points at that one.
	Steps  []StepResult
	Failed *StepResult
	// Manual are the blocks shown to people only, never executed.
	Manual []Block
	// Target is the slot the scenario acted on ("" for none).
	Target string
	// Loss is the loss the scenario says the page may cause, measured
	// (nil: none may be lost).
	Loss *LossBound
	// Cluster is the (by now stopped) cluster the page ran on: its slots
	// name the nodes' directories and logs.
	Cluster *LocalCluster
	// Elapsed is the time from the first block's start to the last's end.
	Elapsed time.Duration
}

// Result returns the checker result called name (ok false if none ran).
func (o *Outcome) Result(name string) (checker.Result, bool) {
	for _, r := range o.Results.Results {
		if r.Name == name {
			return r, true
		}
	}
	return checker.Result{}, false
}

// LongestOutage is what the availability checker measured (-1: unknown).
func (o *Outcome) LongestOutage() time.Duration {
	if r, ok := o.Result("availability"); ok {
		if d, ok := r.Details.(AvailabilityDetails); ok && r.Valid != checker.Unknown {
			return d.Longest
		}
	}
	return -1
}

// AckedLost is how many acknowledged writes the ledger checker found lost,
// plus the stated loss it judged absent (-1: it could not tell).
func (o *Outcome) AckedLost() int {
	stated := 0
	if r, ok := o.Result("loss"); ok {
		d, ok := r.Details.(LossDetails)
		if !ok || r.Valid == checker.Unknown {
			return -1
		}
		stated = d.Lost
	}
	if r, ok := o.Result("ledger"); ok {
		if d, ok := r.Details.(checker.LedgerDetails); ok && len(d.Nodes) > 0 {
			return d.Lost.Count + stated
		}
	}
	return -1
}

func (c *Config) setDefaults() error {
	if c.Page == nil {
		return errors.New("runbook: no page")
	}
	if c.Test == "" {
		c.Test = "runbook-" + c.Page.Name
	}
	if c.Store == "" {
		c.Store = "store"
	}
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Slots == 0 {
		c.Slots = 5
	}
	if c.Workload.Kind == "" {
		// Open loop, round-robin over the members, with far more workers
		// than the rate needs: requests hung on a stalled or stopping node
		// (up to Attempts × Timeout each) must not starve the writes to the
		// healthy ones, or the load generator's limit would read as the
		// cluster's unavailability.
		c.Workload = workload.Config{Kind: workload.Ledger, Rate: 40, Concurrency: 64, MaxBatch: 4, IDPrefix: WorkloadPrefix}
	}
	if c.Warmup == 0 {
		c.Warmup = 50
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = 250 * time.Millisecond
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	def := checker.DefaultSLO()
	if c.SLO.P99 <= 0 {
		c.SLO.P99 = def.P99
	}
	if c.SLO.CatchUp <= 0 {
		c.SLO.CatchUp = def.CatchUp
	}
	if c.SLO.CaughtUpEntries == 0 {
		c.SLO.CaughtUpEntries = def.CaughtUpEntries
	}
	if c.SLO.CaughtUpLag <= 0 {
		c.SLO.CaughtUpLag = def.CaughtUpLag
	}
	var err error
	c.Workload, err = c.Workload.WithDefaults()
	return err
}

// Run executes cfg.Page against a fresh local cluster under load, then
// judges the run. The error is for runs that could not be carried out (no
// cluster); a page whose block failed, or whose run the checkers reject,
// returns a nil error and an invalid verdict, with everything in the store.
func Run(ctx context.Context, cfg Config) (*Outcome, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	out := cfg.Progress
	run, err := report.NewRun(cfg.Store, cfg.Test, time.Now())
	if err != nil {
		return nil, err
	}
	o := &Outcome{Run: run, Manual: cfg.Page.Manual()}
	if err := run.WriteConfig(storedConfig{Page: cfg.Page.Path, Title: cfg.Page.Title, Budget: cfg.Page.Budget.String(),
		Scenario: cfg.Scenario.Name, Nodes: cfg.Nodes, Slots: cfg.Slots, ServerFlags: cfg.ServerFlags, Secured: !cfg.Insecure, Workload: cfg.Workload, SLO: cfg.SLO}); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "runbook %s (%s): %d nodes, budget %s, scenario %q\n  store %s\n", cfg.Page.Name, cfg.Page.Title, cfg.Nodes, cfg.Page.Budget, cfg.Scenario.Name, run.Dir())

	lc, err := NewLocalCluster(ctx, LocalConfig{Script: cfg.Script, Dir: run.NodesDir(), Bin: cfg.Bin, OldRelease: cfg.OldRelease, Nodes: cfg.Nodes, Slots: cfg.Slots, Flags: cfg.ServerFlags, Insecure: cfg.Insecure})
	if err != nil {
		return nil, err
	}
	defer lc.Close()
	o.Cluster = lc
	if err := lc.Up(ctx); err != nil {
		return nil, err
	}
	rec, err := history.Create(run.HistoryPath())
	if err != nil {
		return nil, err
	}
	defer rec.Close()
	lagw, err := run.LagWriter()
	if err != nil {
		return nil, err
	}
	obs := newObserver(lc, rec.Now, cfg.SampleInterval, lagw)
	obsCtx, stopObserving := context.WithCancel(context.WithoutCancel(ctx))
	obsDone := make(chan struct{})
	go func() {
		defer close(obsDone)
		obs.run(obsCtx)
	}()
	stopObserver := func() {
		stopObserving()
		<-obsDone
		lagw.Close()
	}
	defer func() {
		select {
		case <-obsDone:
		default:
			stopObserver()
		}
	}()

	w, err := workload.New(cfg.Workload, obs, rec)
	if err != nil {
		return nil, err
	}
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	var workErr error
	workDone := make(chan struct{})
	go func() {
		defer close(workDone)
		workErr = w.Run(workCtx)
	}()
	// On an early return, the workload stops before the history closes.
	defer func() {
		stopWork()
		<-workDone
	}()

	// Warm up: the runbook starts on a cluster that is taking writes.
	if err := waitFor(ctx, time.Minute, func() bool { return w.Progress().Total().OK >= int64(cfg.Warmup) }); err != nil {
		return nil, fmt.Errorf("runbook: the workload made %d acknowledged writes in a minute; expected %d before starting: %w",
			w.Progress().Total().OK, cfg.Warmup, err)
	}

	// The page starts on a healthy cluster: a leader, and every initial
	// node a member that has applied what was committed by now. A node
	// that bootstrapped wrong must not be blamed on the page.
	var target uint64 // the commit index every member must reach
	if err := waitFor(ctx, time.Minute, func() bool {
		members := obs.Members()
		for _, s := range lc.Slots()[:lc.Initial()] {
			if _, ok := members[s.Name]; !ok {
				return false
			}
		}
		if target == 0 {
			target = obs.Commit()
		}
		return obs.Leader(ctx) != "" && target > 0 && obs.caughtUpTo(target)
	}); err != nil {
		return nil, fmt.Errorf("runbook: the cluster was not healthy after the warm-up (leader %q, members %v, commit %d): %w",
			obs.Leader(ctx), obs.Members(), obs.Commit(), err)
	}

	if cfg.Scenario.Inject != nil {
		leader := obs.Leader(ctx)
		inv := rec.Invoke(history.Nemesis, FSetup, history.FaultValue{Kind: cfg.Scenario.Name}, "")
		injected, err := cfg.Scenario.Inject(ctx, lc, leader, obs.Names())
		if err != nil {
			rec.Complete(inv, history.Info, nil, err, 0, 0)
			return nil, fmt.Errorf("runbook: scenario %s: %w", cfg.Scenario.Name, err)
		}
		o.Target, o.Loss = injected.Target, injected.Loss
		rec.Complete(inv, history.OK, history.FaultValue{Kind: cfg.Scenario.Name, Targets: []string{injected.Target}}, nil, 0, 0)
		fmt.Fprintf(out, "  scenario %s on %s\n", cfg.Scenario.Name, injected.Target)
		if injected.Loss != nil {
			fmt.Fprintf(out, "  stated loss: writes acknowledged at log indexes above %d (%s's %s)\n", injected.Loss.Applied, injected.Loss.Survivor, injected.Loss.basis())
		}
	}

	steps, err := os.Create(run.Path("steps.log"))
	if err != nil {
		return nil, err
	}
	defer steps.Close()
	sh := &Shell{EnvFile: lc.EnvFile(), StateDir: run.Path("shell"), Timeout: cfg.BlockTimeout}
	began := time.Now()
	rinv := rec.Invoke(history.Nemesis, FRunbook, history.FaultValue{Kind: cfg.Page.Name}, "")
	rec.Complete(rinv, history.OK, nil, nil, 0, 0)
	for _, b := range cfg.Page.Executed() {
		fmt.Fprintf(out, "  block %s\n", b.Label())
		inv := rec.Invoke(history.Nemesis, FStep, history.FaultValue{Kind: b.Label(), Instant: true}, "")
		res := sh.Run(ctx, b)
		if res.Err != nil {
			rec.Complete(inv, history.Info, nil, res.Err, 0, 0)
		} else {
			rec.Complete(inv, history.OK, nil, nil, 0, 0)
		}
		fmt.Fprintf(steps, "=== %s (%s, exit %d)\n%s--- output\n%s\n", b.Label(), res.Duration.Round(time.Millisecond), res.ExitCode, b.Code, res.Output)
		o.Steps = append(o.Steps, res)
		if res.Err != nil {
			o.Failed = &o.Steps[len(o.Steps)-1]
			fmt.Fprintf(out, "  FAILED: %v\n", res.Err)
			break
		}
	}
	o.Elapsed = time.Since(began)
	hinv := rec.Invoke(history.Nemesis, history.HealAll, nil, "")
	rec.Complete(hinv, history.OK, nil, nil, 0, 0)

	// After the last step: writes go on until every member has applied
	// what was committed when the page ended (the catch-up the lag checker
	// times) and a few more writes were acknowledged, bounded by the SLO.
	slo := cfg.SLO
	endCommit, okAtEnd := obs.Commit(), w.Progress().Total().OK
	if err := waitFor(ctx, slo.CatchUp+10*time.Second, func() bool {
		return obs.caughtUpTo(endCommit) && w.Progress().Total().OK >= okAtEnd+20 || deadMember(lc, obs) != ""
	}); err != nil {
		fmt.Fprintf(out, "  members not all caught up to index %d after the last step: %v\n", endCommit, err)
	}
	stopWork()
	<-workDone
	if workErr != nil && !errors.Is(workErr, context.Canceled) {
		fmt.Fprintf(out, "  workload ended with: %v\n", workErr)
	}
	if err := quiesce(ctx, lc, obs, time.Minute); err != nil {
		fmt.Fprintf(out, "  warning: %v\n", err)
	}
	// Two more samples of the quiet cluster, then stop observing.
	obs.poll(ctx)
	obs.poll(ctx)
	stopObserver()

	ev, err := nodeEvidence(ctx, lc, obs, rec.Start(), cfg.SampleInterval)
	if err != nil {
		return nil, err
	}
	digests := collect(ctx, lc, run, obs.Members(), &ev, out)
	if err := run.WriteDigests(digests); err != nil {
		return nil, err
	}
	if err := run.WriteNodeEvidence(ev.NodeEvidence); err != nil {
		return nil, err
	}
	if err := rec.Close(); err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	res, err := analyze(run, cfg, slo, o, ev, rec.Start())
	if err != nil {
		return nil, err
	}
	o.Results = res
	return o, nil
}

// waitFor polls cond every 100ms until it holds or limit passes.
func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// quiesce waits, with no writes in flight, until every member slot has
// applied the leader's commit index.
func quiesce(ctx context.Context, lc *LocalCluster, obs *observer, limit time.Duration) error {
	var last string
	err := waitFor(ctx, limit, func() bool {
		obs.poll(ctx)
		// Nothing restarts a node once the page is done: a member with no
		// process will not converge, and the checkers will say why.
		if dead := deadMember(lc, obs); dead != "" {
			last = dead + " has no running process"
			return true
		}
		members := obs.Members()
		leader := obs.Leader(ctx)
		if leader == "" {
			last = "no leader"
			return false
		}
		ls, _ := lc.Slot(leader)
		st, err := statusOf(ctx, lc, ls)
		if err != nil || st.Leader != st.Node {
			last = fmt.Sprintf("%s does not answer as leader (%v)", leader, err)
			return false
		}
		var behind []string
		for name := range members {
			s, _ := lc.Slot(name)
			ms, err := statusOf(ctx, lc, s)
			if err != nil || ms.Applied < st.Commit {
				applied := "no answer"
				if err == nil {
					applied = fmt.Sprint(ms.Applied)
				}
				behind = append(behind, fmt.Sprintf("%s applied %s", name, applied))
			}
		}
		sort.Strings(behind)
		last = fmt.Sprintf("leader %s commit %d; behind: %s", leader, st.Commit, strings.Join(behind, ", "))
		return len(behind) == 0
	})
	if err != nil {
		return fmt.Errorf("the members did not converge after the workload stopped (%s): %w", last, err)
	}
	if dead := deadMember(lc, obs); dead != "" {
		return fmt.Errorf("not waiting for the members to converge: %s", last)
	}
	return nil
}

// deadMember names a member slot whose process is not running ("" if none).
func deadMember(lc *LocalCluster, obs *observer) string {
	for _, name := range obs.Names() {
		if s, err := lc.Slot(name); err == nil && !lc.Alive(s) {
			return name
		}
	}
	return ""
}

func statusOf(ctx context.Context, lc *LocalCluster, s Slot) (*client.Status, error) {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c := lc.AdminClient(s, client.WithRetries(0), client.WithTimeout(2*time.Second))
	defer c.CloseIdleConnections()
	return c.Status(sctx)
}

// evidence is the nodes checker's evidence plus what the runbook run
// leaves out of it.
type evidence struct {
	checker.NodeEvidence
	// RemovedExits are exits of processes whose member had been removed
	// (a removed node stops itself): not crashes, unless they panicked.
	RemovedExits []NodeExit
	// ForeignExits are exits on slots that were never members (another
	// cluster, e.g. a restored backup, the page ran on spare slots).
	ForeignExits []NodeExit
	// CausedExits are exits the injected fault was to cause, with the
	// status it was to cause (a node fenced by its full disk): the
	// trouble the page is for, not a crash, unless they panicked.
	CausedExits []NodeExit
}

// serveWait bounds how long a member may take to answer /cluster/status
// after the run before it counts as not serving.
const serveWait = 30 * time.Second

func nodeEvidence(ctx context.Context, lc *LocalCluster, obs *observer, start time.Time, interval time.Duration) (evidence, error) {
	ev := evidence{NodeEvidence: checker.NodeEvidence{Nodes: obs.Ever()}}
	members := obs.Members()
	exits, err := lc.Exits(start)
	if err != nil {
		return ev, err
	}
	for _, e := range exits {
		if !slices.Contains(ev.Nodes, e.Node) {
			ev.ForeignExits = append(ev.ForeignExits, e)
			continue
		}
		if e.Caused && !logsPanic(e.Logs) {
			ev.CausedExits = append(ev.CausedExits, e)
			continue
		}
		stillMember := members[e.Node] == e.ID
		seen, ok := obs.LastSeen(e.ID)
		afterRemoval := ok && e.Time >= seen-2*int64(interval)
		// A removed node stops itself, with its own exit status, possibly
		// while the page is stopping it too.
		if !stillMember && afterRemoval && !logsPanic(e.Logs) {
			ev.RemovedExits = append(ev.RemovedExits, e)
			continue
		}
		ev.Exits = append(ev.Exits, e.ProcessExit)
	}
	for _, name := range ev.Nodes {
		s, _ := lc.Slot(name)
		f := checker.NodeFinal{Node: name, Alive: lc.Alive(s)}
		if _, member := members[name]; !member {
			f.State = checker.NodeRemoved
			ev.Final = append(ev.Final, f)
			continue
		}
		f.State = "stopped"
		if f.Alive {
			f.State = "running"
			deadline := time.Now().Add(serveWait)
			for {
				_, err := statusOf(ctx, lc, s)
				if err == nil {
					f.Serving, f.Error = true, ""
					break
				}
				f.Error = fmt.Sprintf("GET /cluster/status: %v", err)
				if time.Now().After(deadline) || !lc.Alive(s) || ctx.Err() != nil {
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
		} else {
			f.Error = "its process is not running"
		}
		if !f.Serving {
			segs := stdoutSegments(filepath.Join(s.Dir, "stdout.log"))
			if len(segs) > 0 {
				f.Logs = []checker.LogTail{{Path: filepath.Join(s.Dir, "stdout.log"), Lines: segs[len(segs)-1]}}
			}
		}
		ev.Final = append(ev.Final, f)
	}
	return ev, nil
}

func logsPanic(logs []checker.LogTail) bool {
	for _, l := range logs {
		for _, line := range l.Lines {
			if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") {
				return true
			}
		}
	}
	return false
}

// collect saves every serving member's audit, digest and metrics; what
// cannot be read goes into ev.
func collect(ctx context.Context, lc *LocalCluster, run *report.Run, members map[string]uint64, ev *evidence, out io.Writer) map[string]checker.DigestSample {
	digests := map[string]checker.DigestSample{}
	ev.AuditErrors, ev.DigestErrors = map[string]string{}, map[string]string{}
	for name := range members {
		s, _ := lc.Slot(name)
		hc := lc.HTTPClient(s, time.Minute)
		defer hc.CloseIdleConnections()
		if !lc.Alive(s) {
			why := "its process is not running"
			ev.AuditErrors[name], ev.DigestErrors[name] = why, why
			continue
		}
		if err := report.Retry(ctx, func() error {
			return report.Fetch(ctx, hc, lc.URL(s)+"/v1/audit/events", func(r io.Reader) error { return run.WriteAudit(name, r) })
		}); err != nil {
			ev.AuditErrors[name] = err.Error()
			fmt.Fprintf(out, "  warning: audit of %s: %v\n", name, err)
		}
		if err := report.Retry(ctx, func() error {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			dc := lc.AdminClient(s, client.WithRetries(0))
			defer dc.CloseIdleConnections()
			d, err := dc.Digest(dctx)
			if err == nil {
				digests[name] = checker.DigestSample{AppliedIndex: d.AppliedIndex, Digest: d.Digest}
			}
			return err
		}); err != nil {
			ev.DigestErrors[name] = fmt.Sprintf("GET /v1/audit/digest: %v", err)
		}
		report.Fetch(ctx, hc, lc.URL(s)+"/metrics", func(r io.Reader) error {
			f, err := os.Create(filepath.Join(s.Dir, "metrics.txt"))
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(f, r)
			return err
		})
	}
	return digests
}

// analyze runs every checker over what the run stored and writes
// results.json and report.html.
func analyze(run *report.Run, cfg Config, slo checker.SLO, o *Outcome, ev evidence, start time.Time) (checker.Results, error) {
	ops, err := run.ReadHistory()
	if err != nil {
		return checker.Results{}, fmt.Errorf("read history: %w", err)
	}
	rs := []checker.Result{stepsResult(cfg.Page, o), checker.Stats(ops)}
	// The ledger judges the stated loss (if any) as certainly absent, and
	// every other acknowledged write as present: see applyStatedLoss.
	ledgerOps := ops
	if o.Loss != nil {
		var loss checker.Result
		ledgerOps, loss = applyStatedLoss(ops, *o.Loss, start)
		rs = append(rs, loss)
	}
	nodes := checker.Nodes(ops, ev.NodeEvidence)
	var notJudged []string
	if n := len(ev.RemovedExits); n > 0 {
		notJudged = append(notJudged, fmt.Sprintf("%d exits of removed members", n))
	}
	if n := len(ev.ForeignExits); n > 0 {
		notJudged = append(notJudged, fmt.Sprintf("%d exits on slots outside the cluster", n))
	}
	for _, e := range ev.CausedExits {
		notJudged = append(notJudged, fmt.Sprintf("%s's %s, which the injected fault was to cause", e.Node, e.Status.Text))
	}
	if len(notJudged) > 0 {
		nodes.Summary += " (not judged: " + strings.Join(notJudged, "; ") + ")"
	}
	rs = append(rs, nodes)
	var crashed []string
	if d, ok := nodes.Details.(checker.NodesDetails); ok {
		crashed = d.Crashed
	}
	cov := checker.Coverage{Nodes: ev.Nodes, Removed: ev.RemovedNodes(), Crashed: crashed, Why: ev.AuditErrors}
	digests, derr := run.ReadDigests()
	audits, err := run.ReadAudits()
	if err != nil {
		rs = append(rs, checker.Result{Name: "ledger", Valid: checker.Unknown, Summary: "audits unreadable: " + err.Error()})
	} else {
		applied := map[string]uint64{}
		for n, d := range digests {
			applied[n] = d.AppliedIndex
		}
		others := 0
		if prefix := cfg.Workload.IDPrefix; prefix != "" {
			for n, entries := range audits {
				kept := entries[:0]
				for _, e := range entries {
					if strings.HasPrefix(e.ID, prefix) {
						kept = append(kept, e)
					} else {
						others++
					}
				}
				audits[n] = kept
			}
		}
		ledger := checker.LedgerCovering(ledgerOps, audits, applied, cov)
		if others > 0 {
			ledger.Summary += fmt.Sprintf(" (left out: %d audit entries of ids not starting with the workload's %q, written by the page)", others, cfg.Workload.IDPrefix)
		}
		rs = append(rs, ledger)
	}
	if derr != nil {
		rs = append(rs, checker.Result{Name: "convergence", Valid: checker.Unknown, Summary: "digests unreadable: " + derr.Error()})
	} else {
		dcov := cov
		dcov.Why = ev.DigestErrors
		rs = append(rs, checker.ConvergenceCovering(digests, dcov))
	}
	windows, werr := checker.FaultWindows(ops)
	samples, err := run.ReadLag()
	switch {
	case err != nil:
		rs = append(rs, checker.Result{Name: "lag", Valid: checker.Unknown, Summary: "lag samples unreadable: " + err.Error()})
	case werr != nil:
		rs = append(rs, checker.Result{Name: "lag", Valid: checker.Unknown, Summary: "windows: " + werr.Error()})
	default:
		rs = append(rs, checker.Lag(samples, windows, slo))
	}
	var stepWindows []checker.FaultWindow
	for _, w := range windows {
		if w.F == FStep || w.F == FSetup {
			stepWindows = append(stepWindows, w)
		}
	}
	rs = append(rs, Availability(ops, cfg.Page.Budget, stepWindows))
	res := checker.NewResults(rs...)
	rr := run.NewResults(res, time.Now())
	if err := run.WriteResults(rr); err != nil {
		return res, err
	}
	if err := run.WriteReport(rr); err != nil {
		return res, fmt.Errorf("report.html: %w", err)
	}
	return res, nil
}

// StepsDetails is the Details of the steps result.
type StepsDetails struct {
	Executed int      `json:"executed"`
	Blocks   int      `json:"blocks"`
	Failed   string   `json:"failed,omitempty"`
	Manual   []string `json:"manual,omitempty"`
}

// stepsResult says whether every executed block exited 0, and lists the
// manual blocks, which were not executed.
func stepsResult(p *Page, o *Outcome) checker.Result {
	d := StepsDetails{Executed: len(o.Steps), Blocks: len(p.Executed())}
	for _, b := range o.Manual {
		d.Manual = append(d.Manual, b.Label())
	}
	manual := ""
	if len(d.Manual) > 0 {
		manual = fmt.Sprintf("; %d manual blocks not executed: %s", len(d.Manual), strings.Join(d.Manual, "; "))
	}
	if o.Failed != nil {
		d.Failed = o.Failed.Block.Label()
		return checker.Result{Name: "steps", Valid: checker.Invalid, Details: d, Summary: fmt.Sprintf(
			"block %s failed: %v; %d of %d blocks executed%s", o.Failed.Block.Label(), o.Failed.Err, d.Executed, d.Blocks, manual)}
	}
	return checker.Result{Name: "steps", Valid: checker.Valid, Details: d, Summary: fmt.Sprintf(
		"all %d blocks exited 0 in %s%s", d.Executed, o.Elapsed.Round(time.Millisecond), manual)}
}
