// Package runner runs one chaos test end to end, Jepsen style: a cluster
// of real tidal-server processes behind the relay mesh, a workload
// recording every operation, a seeded nemesis schedule, a lag sampler;
// then heal, quiesce, collect each node's audit and digest, run every
// checker and leave a run store a person can open. The CLI tidal-chaos
// and the chaos suite are thin layers over Run and Analyze.
package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/db"
	"github.com/tidaldb/tidal/harness/db/etcd"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/process"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/workload"
)

// Config is one chaos run. It is written to the store as config.json, and
// `tidal-chaos repro` reads it back, so every field is plain data.
type Config struct {
	Test      string   `json:"test"`
	Nodes     int      `json:"nodes"`
	Duration  Duration `json:"duration"`
	Seed      int64    `json:"seed"`
	Store     string   `json:"store"`
	ServerBin string   `json:"server_bin"`
	// RelayBinary, when set, runs the relay mesh in a standalone tcp-relay
	// process driven over its control API; empty keeps it in process.
	RelayBinary string          `json:"relay_bin,omitempty"`
	Workload    workload.Config `json:"workload"`
	// Nemesis lists fault kinds and groups (see nemesis.Help); empty runs
	// the workload without faults.
	Nemesis       []string `json:"nemesis"`
	Interval      Duration `json:"interval"`
	FaultDuration Duration `json:"fault_duration"`
	// QuietBeforeCut holds the workload's new ops this long before each
	// power cut (nemesis.Runner.QuietBeforeCut); 0 = off. tidal-chaos
	// defaults it to DefaultQuietBeforeCut.
	QuietBeforeCut Duration `json:"quiet_before_cut,omitempty"`
	// ServerFlags are passed to every tidal-server.
	ServerFlags []string `json:"server_flags"`
	// WALSegmentSize is every node's --wal-segment-size in bytes (default
	// cluster.DefaultWALSegmentSize, 4 MiB: the server's 64 MiB,
	// preallocated, made every run leave hundreds of MB).
	WALSegmentSize int64 `json:"wal_segment_size"`
	// SLO for the lag checker.
	LagP99     Duration `json:"lag_p99"`
	LagCatchUp Duration `json:"lag_catch_up"`
	// Bounds of the availability checker (checker.AvailabilitySLO; zero:
	// its defaults): the longest stretch without an ok client op before
	// any fault, and the fault-free time clients may go without one after
	// a fault began.
	AvailabilityStall    Duration `json:"availability_stall,omitempty"`
	AvailabilityRecovery Duration `json:"availability_recovery,omitempty"`
	// LinearizableTimeout bounds porcupine (past it: unknown).
	LinearizableTimeout Duration `json:"linearizable_timeout"`
	// SampleInterval is how often /cluster/status is polled for lag.
	SampleInterval Duration `json:"sample_interval"`
	// ProgressEvery prints a progress line this often (0: 5s).
	ProgressEvery Duration `json:"progress_every"`
	// Insecure runs the cluster in plaintext without authentication, to
	// compare; by default it is secured (cluster.Config.Insecure).
	Insecure bool `json:"insecure,omitempty"`
	// Backend runs the nodes: "process" (default) or "docker" (containers
	// on a network of the run's own, the relay mesh in a tcp-relay
	// container built from RelayBinary, default the one beside ServerBin).
	Backend string `json:"backend,omitempty"`
	// FaultFS mounts faultfs over every node's data dir: "on", "off", or
	// "auto" (the default: on when the nemesis has a disk kind). The disk
	// kinds (power cuts, fsync errors, ...) need it; see faultfsMode.
	FaultFS string `json:"faultfs,omitempty"`
	// DB is the database under test: "tidal" (default; empty
	// in stores written before the field) or "etcd". The fields above
	// that name tidal-server apply to tidal only.
	DB string `json:"db,omitempty"`
	// Etcd configures the etcd adapter (DB "etcd"); its concurrency, rate
	// and seed default to Workload's and Seed.
	Etcd etcd.Config `json:"etcd,omitzero"`
}

// FaultFS modes (Config.FaultFS).
const (
	FaultFSAuto = "auto"
	FaultFSOn   = "on"
	FaultFSOff  = "off"
)

// ParseFaultFS checks a --faultfs value.
func ParseFaultFS(s string) (string, error) {
	switch s {
	case "", FaultFSAuto:
		return FaultFSAuto, nil
	case FaultFSOn, FaultFSOff:
		return s, nil
	}
	return "", fmt.Errorf("faultfs: expected auto, on or off, found %q", s)
}

// noDisks says why this run cannot have disk faults (nil: it can).
func (c Config) noDisks() error {
	if c.FaultFS == FaultFSOff {
		return errors.New("the run has --faultfs off")
	}
	return nemesis.DiskSupport()
}

// ParseNemesis expands the run's --nemesis list into kinds, for its
// cluster size and whether it can have disk faults.
func (c Config) ParseNemesis() ([]string, error) {
	return nemesis.ParseMixWith(strings.Join(c.Nemesis, ","), c.Nodes, c.noDisks())
}

// mountFaultFS decides whether the run mounts faultfs, given the kinds its
// schedule uses: on when asked for (refused where it cannot mount), off
// when asked not to (refused if a disk kind is scheduled), else on exactly
// when a disk kind is scheduled.
func (c Config) mountFaultFS(kinds []string) (bool, error) {
	disk := nemesis.NeedsDisks(kinds)
	switch c.FaultFS {
	case FaultFSOn:
		if err := c.noDisks(); err != nil {
			return false, fmt.Errorf("--faultfs on: %w", err)
		}
		return true, nil
	case FaultFSOff:
		if disk {
			return false, fmt.Errorf("--faultfs off, but the schedule has disk faults (%s), which need it", strings.Join(kinds, ","))
		}
		return false, nil
	}
	if disk {
		if err := c.noDisks(); err != nil {
			return false, fmt.Errorf("the schedule has disk faults, which need faultfs: %w", err)
		}
	}
	return disk, nil
}

// Duration is a time.Duration that reads and writes as "1m30s" in JSON.
type Duration time.Duration

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n int64
		if err2 := json.Unmarshal(b, &n); err2 != nil {
			return fmt.Errorf("duration: expected a string like \"30s\", found %s", b)
		}
		*d = Duration(n)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// D is the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (c *Config) setDefaults() error {
	if c.Test == "" {
		c.Test = "chaos"
	}
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	if c.Nodes < 1 {
		return fmt.Errorf("nodes: expected at least 1, found %d", c.Nodes)
	}
	if c.Duration == 0 {
		c.Duration = Duration(30 * time.Second)
	}
	if c.Store == "" {
		c.Store = "store"
	}
	if c.Seed == 0 {
		c.Seed = time.Now().UnixNano()
	}
	if c.ServerBin == "" && (c.DB == "" || c.DB == DBTidal) {
		return errors.New("server-bin: required (build it with `make build`)")
	}
	if c.Interval == 0 {
		c.Interval = Duration(8 * time.Second)
	}
	if c.FaultDuration == 0 {
		c.FaultDuration = Duration(4 * time.Second)
	}
	if c.LinearizableTimeout == 0 {
		c.LinearizableTimeout = Duration(60 * time.Second)
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = Duration(200 * time.Millisecond)
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = Duration(5 * time.Second)
	}
	if c.WALSegmentSize == 0 {
		c.WALSegmentSize = cluster.DefaultWALSegmentSize
	}
	var err error
	if c.FaultFS, err = ParseFaultFS(c.FaultFS); err != nil {
		return err
	}
	if c.Workload.Kind == "" {
		c.Workload.Kind = workload.Ledger
	}
	if c.Workload.Seed == 0 {
		c.Workload.Seed = uint64(c.Seed)
	}
	c.Workload, err = c.Workload.WithDefaults()
	return err
}

// electionTimeout is the election timeout of the database under test,
// which leader-pause bursts are sized by: etcd's from its flags; 0 (the
// nemesis default) for tidal-server.
func (c Config) electionTimeout() time.Duration {
	if c.DB == DBEtcd {
		return c.Etcd.ElectionTimeout()
	}
	return 0
}

// DefaultQuietBeforeCut is tidal-chaos's --quiet-before-cut: long enough
// for the clients' writes in flight to be acknowledged (group commits of
// a few ms), short against a fault window.
const DefaultQuietBeforeCut = Duration(300 * time.Millisecond)

// Outcome is what a run produced.
type Outcome struct {
	Run     *report.Run
	Results checker.Results
}

// Options are the parts of a run that are not configuration: where output
// goes, and a schedule to replay instead of generating one.
type Options struct {
	Progress io.Writer // progress lines and the summary; nil = discard
	Logger   *slog.Logger
	Schedule *nemesis.Schedule

	// Backend, when set, wraps the backend that starts the node
	// processes. It is for tests of the harness itself: a wrapper sees
	// every handle, so a test can kill a node behind the harness's back.
	Backend func(cluster.Backend) cluster.Backend
	// Nemesis, when set, wraps what the nemesis acts on. It is for tests
	// of the harness itself, e.g. a relay mesh whose control endpoint is
	// unreachable, so that no fault can take effect.
	Nemesis func(nemesis.Cluster) nemesis.Cluster
}

// Run runs one chaos test. The error is for runs that could not be carried
// out (no binary, cluster never came up); a run whose checkers found
// anomalies returns a nil error and an invalid verdict.
func Run(ctx context.Context, cfg Config, opts Options) (*Outcome, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	out := opts.Progress
	if out == nil {
		out = io.Discard
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d, err := openDB(cfg)
	if err != nil {
		return nil, err
	}
	// A fault the database cannot take is refused before anything starts.
	var mix []string
	if opts.Schedule != nil {
		mix = opts.Schedule.Kinds()
	} else if len(cfg.Nemesis) > 0 {
		if mix, err = cfg.ParseNemesis(); err != nil {
			return nil, err
		}
	}
	// "all" means every kind the database can take; a kind named by
	// itself that it cannot take is still refused.
	var leftOut []string
	if opts.Schedule == nil && slices.Contains(cfg.Nemesis, "all") {
		var cannot []string
		mix, cannot = d.Capabilities().Takeable(mix)
		for _, k := range cannot {
			if slices.Contains(cfg.Nemesis, k) {
				mix = append(mix, k)
			} else {
				leftOut = append(leftOut, k)
			}
		}
	}
	if err := nemesis.CheckMix(mix, d.Capabilities()); err != nil {
		return nil, err
	}
	if len(leftOut) > 0 {
		fmt.Fprintf(out, "tidal-chaos: nemesis all: leaving out what %s cannot take: %s\n", d.Name(), strings.Join(leftOut, ", "))
	}
	// Hold the store's process registry for the run's life before making
	// the run's directory: a second run on the same store is refused here,
	// naming the run that holds it, instead of reaping its nodes.
	reg, err := process.NewRegistry(filepath.Join(cfg.Store, "pids"))
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	run, err := report.NewRun(cfg.Store, cfg.Test, time.Now())
	if err != nil {
		return nil, err
	}
	if err := run.WriteConfig(cfg); err != nil {
		return nil, err
	}
	if err := run.WriteSeed(cfg.Seed); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "tidal-chaos: %s: %s, %d nodes, workload %s, nemesis %v, %s, seed %d\n  store %s\n",
		cfg.Test, d.Name(), cfg.Nodes, workloadName(cfg), cfg.Nemesis, cfg.Duration.D(), cfg.Seed, run.Dir())

	// Reap what an earlier run that died left behind.
	if killed, _ := reg.Reap(); len(killed) > 0 {
		fmt.Fprintf(out, "  reaped leftovers of an earlier run: %s\n", strings.Join(killed, ", "))
	}
	// And its faultfs mounts, dead since its process died: they would
	// fail the pruning of its run directory (this run holds the store, so
	// no live run of it has any).
	if mounts, err := faultfs.ReapStale(cfg.Store); len(mounts) > 0 || err != nil {
		fmt.Fprintf(out, "  unmounted dead faultfs mounts of an earlier run: %s", strings.Join(mounts, ", "))
		if err != nil {
			fmt.Fprintf(out, " (%v)", err)
		}
		fmt.Fprintln(out)
	}
	// The schedule's kinds decide whether the data dirs go through
	// faultfs and whether nodes start with a movable clock, so they are
	// known before the cluster starts.
	disks, err := cfg.mountFaultFS(mix)
	if err != nil {
		return nil, err
	}
	if disks {
		fmt.Fprintf(out, "  faultfs mounted over every node's data dir (--faultfs %s)\n", cfg.FaultFS)
	}
	// Every process exit is recorded from the moment the nodes are all
	// started, with whether the harness asked for it: the nodes
	// checker's evidence.
	var watch *exitWatch
	c, err := d.Setup(ctx, db.Env{Nodes: cfg.Nodes, RunDir: run.Dir(), NodesDir: run.NodesDir(), Registry: reg, Logger: log,
		DiskFaults: disks, ClockControl: nemesis.UsesClock(mix),
		Wrap: func(b cluster.Backend) cluster.Backend {
			if opts.Backend != nil {
				b = opts.Backend(b)
			}
			watch = newExitWatch(b)
			return watch
		},
		Up: func() { watch.arm() },
	})
	if err != nil {
		return nil, err
	}
	defer c.Close()

	rec, err := history.Create(run.HistoryPath())
	if err != nil {
		return nil, err
	}
	defer rec.Close()

	var schedule nemesis.Schedule
	if opts.Schedule != nil {
		schedule = *opts.Schedule
	} else if len(mix) > 0 {
		schedule, err = nemesis.Generate(cfg.Seed, nemesis.ScheduleConfig{
			Duration: cfg.Duration.D(), Interval: cfg.Interval.D(), FaultDuration: cfg.FaultDuration.D(),
			Mix: mix, Nodes: c.Names(), ElectionTimeout: cfg.electionTimeout(),
		})
		if err != nil {
			return nil, err
		}
	}
	if err := run.WriteSchedule(schedule); err != nil {
		return nil, err
	}

	stopSampler, err := c.Observe(run, rec.Now)
	if err != nil {
		return nil, err
	}
	w, err := c.Workload(rec, cfg.Duration.D())
	if err != nil {
		stopSampler()
		return nil, err
	}
	var target nemesis.Cluster = c
	if opts.Nemesis != nil {
		target = opts.Nemesis(target)
	}
	nem := nemesis.NewRunner(target, rec, log)
	if g, ok := w.(interface{ Gate() *workload.Gate }); ok && cfg.QuietBeforeCut > 0 {
		nem.Quiet, nem.QuietBeforeCut = g.Gate(), cfg.QuietBeforeCut.D()
	}

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	var wg sync.WaitGroup
	var workErr, nemErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		workErr = w.Run(runCtx)
	}()
	go func() {
		defer wg.Done()
		if len(schedule.Steps) == 0 {
			return
		}
		nemErr = nem.Run(runCtx, schedule)
	}()
	progressDone := make(chan struct{})
	go progress(out, cfg.ProgressEvery.D(), time.Now(), w, nem, progressDone)
	wg.Wait()
	close(progressDone)

	// Heal (again: Run heals at its end, this covers a cancelled run too),
	// then let the cluster quiesce with the sampler still running, so
	// catch-up after the last heal is measured.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 90*time.Second)
	if err := nem.HealAll(hctx); err != nil {
		fmt.Fprintf(out, "  warning: %v\n", err)
	}
	cancel()
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
	if err := c.WaitConverged(qctx); err != nil {
		fmt.Fprintf(out, "  warning: cluster did not converge after heal: %v\n", err)
	}
	if err := w.Final(qctx); err != nil {
		fmt.Fprintf(out, "  warning: final reads: %v\n", err)
	}
	cancel()
	time.Sleep(2 * cfg.SampleInterval.D())
	stopSampler()

	// Every node that was not removed for good must be running and
	// serving now; then read what each holds. Both go to nodes.json.
	ev := checker.NodeEvidence{Nodes: c.Names()}
	ev.Final = probeNodes(context.WithoutCancel(ctx), c, watch, run.Dir())
	c.Collect(context.WithoutCancel(ctx), run, out, watch.alive, &ev)
	ev.Exits = watch.recorded(rec.Start(), run.Dir())
	if err := run.WriteNodeEvidence(ev); err != nil {
		fmt.Fprintf(out, "  warning: nodes.json: %v\n", err)
	}
	if err := rec.Close(); err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	if workErr != nil && !errors.Is(workErr, context.Canceled) {
		fmt.Fprintf(out, "  workload ended with: %v\n", workErr)
	}
	if nemErr != nil && (!errors.Is(nemErr, context.Canceled) || errors.Is(nemErr, nemesis.ErrNotExercised)) {
		fmt.Fprintf(out, "  nemesis ended with: %s\n", strings.ReplaceAll(nemErr.Error(), "\n", "\n    "))
	}
	if outcomes := nem.Outcomes(); len(outcomes) > 0 {
		for _, kind := range schedule.Kinds() {
			o := outcomes[kind]
			o.Kind = kind
			fmt.Fprintf(out, "  nemesis %s\n", o)
		}
	}

	res, err := Analyze(run, cfg)
	if err != nil {
		return nil, err
	}
	return &Outcome{Run: run, Results: res}, nil
}

// serveWait bounds how long, after the final heal and quiesce, a node may
// take to answer /cluster/status before it counts as not serving.
const serveWait = 30 * time.Second

// probeNodes records every node as it is after the final heal: what the
// harness last did to it, whether its process is alive, and whether it
// answers /cluster/status (retried for up to serveWait: a node restarted
// by the heal may still be replaying its log).
func probeNodes(ctx context.Context, c db.Cluster, watch *exitWatch, dir string) []checker.NodeFinal {
	var out []checker.NodeFinal
	for _, n := range c.Names() {
		st := c.State(n)
		f := checker.NodeFinal{Node: n, State: string(st), Alive: watch.alive(n)}
		if st == cluster.Removed {
			f.State = checker.NodeRemoved
			out = append(out, f)
			continue
		}
		if st == cluster.Running && f.Alive {
			deadline := time.Now().Add(serveWait)
			for {
				err := c.Serving(ctx, n)
				if err == nil {
					f.Serving, f.Error = true, ""
					break
				}
				f.Error = err.Error()
				if time.Now().After(deadline) || !watch.alive(n) {
					break
				}
				select {
				case <-ctx.Done():
				case <-time.After(250 * time.Millisecond):
				}
				if ctx.Err() != nil {
					break
				}
			}
			f.Alive = watch.alive(n)
		} else if !f.Alive {
			f.Error = "its process is not running"
		} else {
			f.Error = "the final heal left it " + string(st)
		}
		if !f.Serving {
			f.Logs = relativeLogs(watch.tails(n), dir)
		}
		out = append(out, f)
	}
	return out
}

// collect saves each node's audit, digest and metrics into the store.
// Nodes removed for good are skipped; for every other node whose audit or
// digest cannot be read (not running, timeout, 5xx, a stream cut short)
// the reason goes into ev, and the checkers then say unknown (or false,
// for a crashed node) rather than judge the others alone.
func collect(ctx context.Context, c *cluster.Cluster, alive func(string) bool, run *report.Run, out io.Writer, ev *checker.NodeEvidence) {
	digests := map[string]checker.DigestSample{}
	ev.AuditErrors, ev.DigestErrors = map[string]string{}, map[string]string{}
	hc := c.HTTPClient(60 * time.Second)
	defer hc.CloseIdleConnections()
	for _, n := range c.Nodes() {
		st := c.State(n.Name)
		if st == cluster.Removed {
			continue
		}
		if st != cluster.Running || !alive(n.Name) {
			why := fmt.Sprintf("not running after the final heal (harness state %s, process alive %t)", st, alive(n.Name))
			ev.AuditErrors[n.Name], ev.DigestErrors[n.Name] = why, why
			fmt.Fprintf(out, "  warning: no audit or digest of %s: %s\n", n.Name, why)
			continue
		}
		err := report.Retry(ctx, func() error {
			return report.Fetch(ctx, hc, c.URL(n.ClientAddr)+"/v1/audit/events", func(r io.Reader) error { return run.WriteAudit(n.Name, r) })
		})
		if err != nil {
			ev.AuditErrors[n.Name] = err.Error()
			fmt.Fprintf(out, "  warning: audit of %s: %v\n", n.Name, err)
		}
		err = report.Retry(ctx, func() error {
			d, err := c.AdminClient(n.Name).Digest(ctx)
			if err == nil {
				digests[n.Name] = checker.DigestSample{AppliedIndex: d.AppliedIndex, Digest: d.Digest}
			}
			return err
		})
		if err != nil {
			ev.DigestErrors[n.Name] = fmt.Sprintf("GET /v1/audit/digest: %v", err)
			fmt.Fprintf(out, "  warning: digest of %s: %v\n", n.Name, err)
		}
		report.Fetch(ctx, hc, c.URL(n.ClientAddr)+"/metrics", func(r io.Reader) error {
			f, err := os.Create(filepath.Join(run.NodeDir(n.Name), "metrics.txt"))
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(f, r)
			return err
		})
	}
	digests, notes := digestsAtOneIndex(ctx, digests, digestRounds,
		func(ctx context.Context) error {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return c.WaitConverged(wctx)
		},
		func(ctx context.Context, n string) (checker.DigestSample, error) {
			d, err := c.AdminClient(n).Digest(ctx)
			return checker.DigestSample{AppliedIndex: d.AppliedIndex, Digest: d.Digest}, err
		})
	for _, note := range notes {
		fmt.Fprintf(out, "  %s\n", note)
	}
	if err := run.WriteDigests(digests); err != nil {
		fmt.Fprintf(out, "  warning: digests: %v\n", err)
	}
}

// Analyze runs every checker over what a run stored and writes
// results.json and report.html. It is how `tidal-chaos analyze` re-checks
// a saved run, and the last step of Run.
func Analyze(run *report.Run, cfg Config) (checker.Results, error) {
	ops, err := run.ReadHistory()
	if err != nil {
		return checker.Results{}, fmt.Errorf("read history: %w", err)
	}
	var rs []checker.Result
	rs = append(rs, checker.Stats(ops))

	// Which nodes crashed, and which were removed for good: only the
	// latter may be left out of the ledger and the digests.
	ev, evErr := run.ReadNodeEvidence()
	all := ev.Nodes
	if len(all) == 0 {
		all = nodeNames(cfg.Nodes)
	}
	var crashed []string
	if evErr != nil {
		rs = append(rs, checker.Result{Name: "nodes", Valid: checker.Unknown,
			Summary: "no record of the node processes (nodes.json unreadable), so a crash could not have been seen: " + evErr.Error()})
	} else {
		nodes := checker.Nodes(ops, ev)
		if d, ok := nodes.Details.(checker.NodesDetails); ok {
			crashed = d.Crashed
		}
		rs = append(rs, nodes)
	}
	auditCov := checker.Coverage{Nodes: all, Removed: ev.RemovedNodes(), Crashed: crashed, Why: ev.AuditErrors}
	digestCov := auditCov
	digestCov.Why = ev.DigestErrors

	if faults, ok := faultsResult(run, cfg, ops); ok {
		rs = append(rs, faults)
	}
	if clock, ok := checker.Clock(ops); ok {
		rs = append(rs, clock)
	}
	// What nodes did under fsync errors, full and corrupt disks: only
	// runs that had such faults.
	if checker.DiskFaulted(ops) {
		if evErr != nil {
			rs = append(rs, checker.Result{Name: "fencing", Valid: checker.Unknown,
				Summary: "no record of the node processes (nodes.json unreadable): " + evErr.Error()})
		} else {
			rs = append(rs, checker.Fencing(ops, ev))
		}
	}

	d, err := openDB(cfg)
	if err != nil {
		return checker.Results{}, err
	}
	rs = append(rs, d.Check(db.CheckInput{Run: run, Ops: ops, Evidence: ev, Audit: auditCov, Digest: digestCov})...)
	rs = append(rs, timelineResults(run, cfg, ops)...)
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

// timelineResults are the checkers of every DB that judge the run over
// time against its fault windows: replication lag, from the status
// samples the DB's Observe took (lag.jsonl), and availability, from the
// clients' ops.
func timelineResults(run *report.Run, cfg Config, ops []history.Op) []checker.Result {
	windows, err := timelineWindows(ops)
	if err != nil {
		return []checker.Result{
			{Name: "lag", Valid: checker.Unknown, Summary: "fault windows: " + err.Error()},
			{Name: "availability", Valid: checker.Unknown, Summary: "fault windows: " + err.Error()},
		}
	}
	var rs []checker.Result
	if samples, err := run.ReadLag(); err != nil {
		rs = append(rs, checker.Result{Name: "lag", Valid: checker.Unknown, Summary: "lag samples unreadable: " + err.Error()})
	} else {
		rs = append(rs, checker.Lag(samples, windows, checker.SLO{P99: cfg.LagP99.D(), CatchUp: cfg.LagCatchUp.D()}))
	}
	rs = append(rs, checker.Availability(ops, windows, checker.AvailabilitySLO{Stall: cfg.AvailabilityStall.D(), Recovery: cfg.AvailabilityRecovery.D()}))
	return rs
}

// timelineWindows are the fault windows lag and availability judge by:
// every window but the quiet spells before power cuts (nemesis' f
// "quiet"). A quiet spell holds the clients, it disturbs no node, and it
// ends inside its cut's window while the cut node is still down: judged as
// a fault, its heal would start a catch-up clock for a node that cannot
// catch up before the cut's own heal.
func timelineWindows(ops []history.Op) ([]checker.FaultWindow, error) {
	windows, err := checker.FaultWindows(ops)
	return slices.DeleteFunc(windows, func(w checker.FaultWindow) bool { return w.F == history.FQuiet }), err
}

// faultsResult judges whether the faults the run asked for happened
// (checker.Faults), for a run that asked for any: its schedule.json, or
// the nemesis of its configuration when the schedule is unreadable.
func faultsResult(run *report.Run, cfg Config, ops []history.Op) (checker.Result, bool) {
	var schedule nemesis.Schedule
	err := run.ReadSchedule(&schedule)
	switch {
	case err != nil && len(cfg.Nemesis) > 0:
		return checker.Result{Name: "faults", Valid: checker.Unknown, Summary: "the run asked for faults " + strings.Join(cfg.Nemesis, ",") +
			" but its schedule is unreadable: " + err.Error()}, true
	case err != nil:
		return checker.Result{}, false
	case len(schedule.Steps) == 0 && len(cfg.Nemesis) > 0:
		return checker.Result{Name: "faults", Valid: checker.Unknown, Summary: "the run asked for faults " + strings.Join(cfg.Nemesis, ",") +
			" but its schedule holds none (the run may be shorter than one fault interval)"}, true
	case len(schedule.Steps) == 0:
		return checker.Result{}, false
	}
	return checker.FaultsWithDisks(ops, schedule.RequestedOf(cfg.Nemesis), run.ReadDiskTotals()), true
}

func nodeNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("n%d", i+1)
	}
	return out
}

// progress prints a line every `every` until done: elapsed, ops and their
// outcomes, and the faults in effect.
func progress(out io.Writer, every time.Duration, start time.Time, w db.Workload, nem *nemesis.Runner, done <-chan struct{}) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		p := w.Progress()
		tot := p.Total()
		faults := nem.Active()
		f := "none"
		if len(faults) > 0 {
			f = strings.Join(faults, "; ")
		}
		fmt.Fprintf(out, "  [%5.1fs] ops %d  ok %d  fail %d  info %d  shed %d  faults: %s\n",
			time.Since(start).Seconds(), tot.Invoked, tot.OK, tot.Fail, tot.Info, p.Shed, f)
	}
}

// workloadName is the run's workload as the first progress line names it.
func workloadName(cfg Config) string {
	if cfg.DB == DBEtcd {
		e, err := cfg.Etcd.WithDefaults()
		if err != nil {
			return cfg.Etcd.Workload
		}
		if e.Workload == etcd.Register {
			return e.Workload + " (" + e.Reads + " reads)"
		}
		return e.Workload
	}
	return string(cfg.Workload.Kind)
}
