// Command tidal-chaos runs Jepsen-style tests against real tidal-server
// processes: run (a new test), analyze (re-check a stored run), repro (run
// a stored run's seed and schedule again). Exit status: 0 valid, 1 invalid
// (an anomaly was found), 2 unknown or error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/tidaldb/tidal/buildinfo"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/db/etcd"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
	"github.com/tidaldb/tidal/usage"
)

// exitStatus carries the process exit code out of a command.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func main() {
	err := newRoot().Execute()
	var st exitStatus
	if err != nil && !errors.As(err, &st) {
		fmt.Fprintln(os.Stderr, "tidal-chaos:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode maps a command's outcome to the process exit status: a
// verdict's own status, 64 for a usage error, 2 for any other error.
func exitCode(err error) int {
	var st exitStatus
	switch {
	case err == nil:
		return 0
	case errors.As(err, &st):
		return int(st)
	case usage.Is(err):
		return usage.Code
	default:
		return 2
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "tidal-chaos",
		Short: "Jepsen-style chaos tests for tidal-server",
		Long: `tidal-chaos starts a cluster of real tidal-server processes with every link
behind its own relay, runs a workload that records every operation in a
history, injects faults from a seeded schedule, heals, and checks that no
acknowledged write was lost or applied twice, that reads were consistent,
that replicas converged, and that replication lag stayed inside its SLO.
With --db etcd it does the same to real etcd processes (register and
append workloads, porcupine, ledger and watch checkers).

Every run leaves a store (store/<test>/<timestamp>/, store/latest points at
the newest) with history.jsonl, results.json, report.html, the schedule and
seed, and each node's logs and metrics. A run ends by pruning the store to
the newest --keep-runs runs of each test; ` + "`tidal-chaos prune`" + ` does it by hand.

Exit status: 0 valid, 1 invalid (an anomaly was found), 2 unknown or error,
64 usage (an unknown flag or command, a value that does not parse; the same
in every tidal binary).`,
		Version:       buildinfo.Read().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate(buildinfo.Line("tidal-chaos") + "\n")
	root.AddCommand(newRunCommand(), newAnalyzeCommand(), newReproCommand(), newFaultsCommand(), newPruneCommand())
	root.AddCommand(newFaultfsCommand(), newShrinkCommand())
	usage.Install(root)
	return root
}

// markRequired makes cobra refuse to run cmd without the flag, and says so
// in --help (cobra enforces required flags but does not show them).
func markRequired(cmd *cobra.Command, name string) {
	f := cmd.Flags().Lookup(name)
	f.Usage += " (required)"
	if err := cmd.MarkFlagRequired(name); err != nil {
		panic(err) // a flag name typo in this file
	}
}

// defaultKeepRuns is how many runs of each test a run leaves in the store.
const defaultKeepRuns = 20

func addKeepRunsFlag(cmd *cobra.Command, keep *int) {
	cmd.Flags().IntVar(keep, "keep-runs", defaultKeepRuns, "after the run, prune the store to the newest `N` runs of each test, as tidal-chaos prune --keep N does (0: prune nothing)")
}

func newRunCommand() *cobra.Command {
	var cfg runner.Config
	var nemesisList, workloadKind, selection, reads string
	var dbFlags []string
	var duration, interval, faultDuration, lagP99, lagCatchUp, linTimeout, stall, recovery, quietBeforeCut time.Duration
	var verbose bool
	var keepRuns int
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run a chaos test and check it",
		Example: `  # 3 nodes, ledger writes, every partition shape and leader kills for a minute
  tidal-chaos run --server-bin bin/tidal-server --nemesis partition,kill-leader --duration 1m

  # counters with linearizable reads under pauses, a fixed seed
  tidal-chaos run --server-bin bin/tidal-server --workload counter --nemesis pause-leader,pause-one --seed 42

  # 5 nodes, open-loop at 200 ops/s, every fault kind
  tidal-chaos run --server-bin bin/tidal-server --nodes 5 --rate 200 --nemesis all

  # no faults: a baseline of the workload alone, keeping every earlier run
  tidal-chaos run --nemesis none --duration 10s --keep-runs 0

  # power loss on every node at once, and partitions: every acknowledged write must survive
  tidal-chaos run --server-bin bin/tidal-server --nemesis power-cut-all,partition --duration 1m

  # every disk fault (faultfs under each data dir), 3 nodes
  tidal-chaos run --server-bin bin/tidal-server --nemesis disk

  # the same in plaintext without authentication, to compare with the secured default
  tidal-chaos run --nemesis none --duration 10s --insecure

  # etcd, not tidal-server: registers checked with porcupine under partitions, kills and pauses
  tidal-chaos run --db etcd --nodes 3 --nemesis partition,kill,pause --duration 60s

  # etcd, unique-key appends checked by the ledger checker, membership churn
  tidal-chaos run --db etcd --workload append --nemesis membership,kill --duration 60s

  # etcd, stale reads: clients bound to members, the leader paused past elections again and again
  tidal-chaos run --db etcd --select bound --op-timeout 1s --nemesis pause-leader-burst --db-flag=--election-timeout=500`,
		Args: cobra.NoArgs,
		// Flags are checked before anything starts, so a typo costs no
		// cluster start-up (and --help's examples are checked by the same
		// code, in main_test.go).
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Nodes < 3 || cfg.Nodes%2 == 0 {
				return fmt.Errorf("--nodes: expected an odd number of at least 3 (3 or 5: an even cluster tolerates no more failures than the odd one below it), found %d", cfg.Nodes)
			}
			if err := parseWorkload(cmd, &cfg, workloadKind, selection, reads); err != nil {
				return err
			}
			if cfg.DB == runner.DBEtcd {
				cfg.Etcd.Flags = dbFlags
			} else {
				cfg.ServerFlags = append(cfg.ServerFlags, dbFlags...)
			}
			var err error
			if cfg.FaultFS, err = runner.ParseFaultFS(cfg.FaultFS); err != nil {
				return fmt.Errorf("--faultfs: %w", err)
			}
			cfg.Nemesis = nil
			if nemesisList != "" && nemesisList != "none" {
				cfg.Nemesis = strings.Split(nemesisList, ",")
				if _, err := cfg.ParseNemesis(); err != nil {
					return fmt.Errorf("--nemesis: %w", err)
				}
			}
			if keepRuns < 0 {
				return fmt.Errorf("--keep-runs: expected a number of runs >= 0 (0: prune nothing), found %d", keepRuns)
			}
			cfg.Duration, cfg.Interval, cfg.FaultDuration = runner.Duration(duration), runner.Duration(interval), runner.Duration(faultDuration)
			if quietBeforeCut < 0 {
				return fmt.Errorf("--quiet-before-cut: expected a duration >= 0 (0: off), found %s", quietBeforeCut)
			}
			cfg.QuietBeforeCut = runner.Duration(quietBeforeCut)
			cfg.LagP99, cfg.LagCatchUp, cfg.LinearizableTimeout = runner.Duration(lagP99), runner.Duration(lagCatchUp), runner.Duration(linTimeout)
			cfg.AvailabilityStall, cfg.AvailabilityRecovery = runner.Duration(stall), runner.Duration(recovery)
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.DB == runner.DBEtcd {
				return execute(cmd, cfg, nil, verbose, keepRuns)
			}
			if err := checkBinary("--server-bin", cfg.ServerBin); err != nil {
				return err
			}
			if cfg.RelayBinary != "" {
				if err := checkBinary("--relay-bin", cfg.RelayBinary); err != nil {
					return err
				}
			}
			return execute(cmd, cfg, nil, verbose, keepRuns)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Test, "test", "chaos", "test name: the run store is <store>/<test>/<timestamp>/")
	f.IntVar(&cfg.Nodes, "nodes", 3, "cluster size: an odd number, at least 3 (3 or 5)")
	f.StringVar(&cfg.DB, "db", "tidal", "database under test: tidal (tidal-server) or etcd (Debian's etcd, installed with apt-get when absent and run as root)")
	f.StringVar(&workloadKind, "workload", "ledger", "ledger (unique-id writes), counter (adds + linearizable reads), embeddings, or mixed; with --db etcd: register (put/get/cas, porcupine; the default) or append (unique keys, ledger checker)")
	f.StringVar(&reads, "reads", "linearizable", "--db etcd, register workload: linearizable or serializable reads (serializable may be stale by etcd's contract: only writes are checked)")
	f.StringVar(&cfg.Etcd.Binary, "etcd-bin", "", "--db etcd: the etcd binary (default: etcd on PATH)")
	f.StringVar(&nemesisList, "nemesis", "partition,kill", "fault `kinds` or groups, comma-separated (tidal-chaos faults lists them); none = no faults")
	f.DurationVar(&duration, "duration", 30*time.Second, "how long the workload and the fault schedule run")
	f.DurationVar(&interval, "interval", 8*time.Second, "mean gap between fault starts")
	f.DurationVar(&faultDuration, "fault-duration", 4*time.Second, "how long each fault lasts before its heal")
	f.DurationVar(&quietBeforeCut, "quiet-before-cut", runner.DefaultQuietBeforeCut.D(), "before each power cut, hold the workload's new ops this long so the newest writes are acknowledged and synced when it lands (0: off)")
	f.IntVar(&cfg.Workload.Concurrency, "concurrency", 8, "client processes (closed loop) or the in-flight bound (open loop)")
	f.Float64Var(&cfg.Workload.Rate, "rate", 0, "open-loop ops/s (0: closed loop)")
	f.StringVar(&selection, "select", "round-robin", "which node each op goes to: round-robin, random or leader; with --db etcd also bound (each worker tied to one member for the run, so a paused member stalls only its own workers)")
	f.IntVar(&cfg.Etcd.Keys, "keys", 0, "--db etcd, register workload: keys in use at once (0: 3)")
	f.IntVar(&cfg.Etcd.OpsPerKey, "ops-per-key", 0, "--db etcd, register workload: ops a key takes before its slot moves to a fresh key, which keeps the linearizability search small (0: 120)")
	f.IntVar(&cfg.Etcd.Values, "values", 0, "--db etcd, register workload: draw written values from 1..N; 0 writes a value never written before, so a read names the write it saw")
	f.Var((*durationFlag)(&cfg.Etcd.OpTimeout), "op-timeout", "--db etcd: bound on one client request, past it the op is info (default 5s; shorter than a pause keeps the workers of a paused member cycling)")
	f.StringArrayVar(&dbFlags, "db-flag", nil, "extra flag of the database under test, repeatable: etcd's (e.g. --db-flag=--election-timeout=500 --db-flag=--heartbeat-interval=50) or, for tidal, the same as --server-flag")
	f.Int64Var(&cfg.Seed, "seed", 0, "seed for the schedule and the workload (0: from the clock; printed and stored)")
	f.StringVar(&cfg.Store, "store", "store", "run store root")
	f.StringVar(&cfg.ServerBin, "server-bin", "bin/tidal-server", "tidal-server binary")
	f.StringVar(&cfg.RelayBinary, "relay-bin", "", "tcp-relay binary: run the relay mesh as that standalone process, driven over its control API (empty: in-process relays); with --backend docker, the binary of the relay container (default: beside --server-bin)")
	f.StringVar(&cfg.Backend, "backend", "process", "what runs the nodes: process (tidal-server processes) or docker (containers of an image built FROM scratch around --server-bin, on a network of the run's own)")
	f.StringSliceVar(&cfg.ServerFlags, "server-flag", nil, "extra tidal-server flag, repeatable (e.g. --server-flag=--snapshot-every=2000)")
	f.DurationVar(&lagP99, "slo-lag-p99", 2*time.Second, "lag SLO: follower p99 lag outside fault windows")
	f.DurationVar(&lagCatchUp, "slo-catch-up", 10*time.Second, "lag SLO: catch-up time after each heal")
	f.DurationVar(&stall, "slo-stall", 10*time.Second, "availability: longest stretch without an ok client op before any fault")
	f.DurationVar(&recovery, "slo-recovery", 15*time.Second, "availability: longest fault-free time, summed between faults, without an ok client op after a fault began (recovery after a heal)")
	f.DurationVar(&linTimeout, "linearizable-timeout", time.Minute, "give up on the linearizability search after this long (verdict unknown)")
	f.BoolVarP(&verbose, "verbose", "v", false, "log harness steps (cluster, nemesis) to stderr")
	f.StringVar(&cfg.FaultFS, "faultfs", "auto", "mount faultfs over every node's data dir: auto (when --nemesis has a disk kind: power-cut-*, fsync-error, disk-full, slow-disk, corrupt-read), on, or off; needs /dev/fuse and root or fusermount3; on --backend docker faultfs is mounted on the host under each container's bind-mounted node directory")
	f.BoolVar(&cfg.Insecure, "insecure", false, "run the cluster in plaintext without authentication, to compare (default: TLS with HTTP/2, client certificates and tokens made for the run, in <run>/certs)")
	addKeepRunsFlag(cmd, &keepRuns)
	return cmd
}

// checkBinary refuses a binary flag that names nothing runnable before a
// run directory is made for it.
func checkBinary(flag, path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s %s: expected an executable, found none (build it with `make build`)", flag, path)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s %s: expected an executable, found a file without execute permission or a directory", flag, path)
	}
	return nil
}

// execute runs cfg, prints the summary, prunes the store to keepRuns runs
// per test (0: not at all) and maps the verdict to an exit status.
func execute(cmd *cobra.Command, cfg runner.Config, schedule *nemesis.Schedule, verbose bool, keepRuns int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.DiscardHandler)
	if verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	out := cmd.OutOrStdout()
	o, err := runner.Run(ctx, cfg, runner.Options{Progress: out, Logger: log, Schedule: schedule})
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	if err := report.Summary(out, o.Results, o.Run); err != nil {
		return err
	}
	pruneAfterRun(out, cmd.ErrOrStderr(), cfg.Store, keepRuns)
	return verdict(o.Results.Valid)
}

// pruneAfterRun caps the store at keep runs per test (0: leaves it
// alone). A store that cannot be pruned is worth a warning, not another
// verdict for the run that just finished.
func pruneAfterRun(out, errOut io.Writer, store string, keep int) {
	if keep <= 0 {
		return
	}
	res, err := report.Prune(store, report.PruneOptions{Keep: keep})
	if len(res.Removed) > 0 {
		fmt.Fprintf(out, "pruned %s to the newest %d runs of each test (--keep-runs): removed %d, freed %s\n", store, keep, len(res.Removed), formatBytes(res.Freed))
	}
	if err != nil {
		fmt.Fprintf(errOut, "tidal-chaos: warning: pruning %s: %v\n", store, err)
	}
}

func verdict(v checker.Validity) error {
	switch v {
	case checker.Valid:
		return nil
	case checker.Invalid:
		return exitStatus(1)
	}
	return exitStatus(2)
}

func newAnalyzeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "analyze RUN-DIR",
		Short: "Re-run every checker over a stored run (history, audits, digests, lag)",
		Long: `Re-check a run from its store alone: nothing is started. Results and
report.html are rewritten; the summary is printed. Use it after changing a
checker, or to re-read a run from CI.`,
		Example: "  tidal-chaos analyze store/latest",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			run, err := report.OpenRun(args[0])
			if err != nil {
				return err
			}
			var cfg runner.Config
			if err := run.ReadConfig(&cfg); err != nil {
				return fmt.Errorf("%s: config.json: %w", run.Dir(), err)
			}
			res, err := runner.Analyze(run, cfg)
			if err != nil {
				return err
			}
			if err := report.Summary(cmd.OutOrStdout(), res, run); err != nil {
				return err
			}
			return verdict(res.Valid)
		},
	}
}

func newReproCommand() *cobra.Command {
	var serverBin string
	var verbose bool
	var keepRuns int
	cmd := &cobra.Command{
		Use:   "repro RUN-DIR",
		Short: "Run a stored run again: same config, seed and fault schedule",
		Long: `Start a new run with the stored run's configuration, seed and exact fault
schedule (schedule.json). Timing on a real machine is never identical, so a
repro replays the same faults at the same offsets against the same workload
seed; a bug that needs a precise interleaving may need several tries.

The repro is stored as a new run of test <test>-repro, and the store's
latest link moves to it (the reproduced run is left where it is).`,
		Example: `  tidal-chaos repro store/latest
  tidal-chaos repro store/chaos/20261130T175502.591Z --server-bin bin/tidal-server`,
		Args: cobra.ExactArgs(1),
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if keepRuns < 0 {
				return fmt.Errorf("--keep-runs: expected a number of runs >= 0 (0: prune nothing), found %d", keepRuns)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			run, err := report.OpenRun(args[0])
			if err != nil {
				return err
			}
			var cfg runner.Config
			if err := run.ReadConfig(&cfg); err != nil {
				return fmt.Errorf("%s: config.json: %w", run.Dir(), err)
			}
			var schedule nemesis.Schedule
			if err := run.ReadSchedule(&schedule); err != nil {
				return fmt.Errorf("%s: schedule.json: %w", run.Dir(), err)
			}
			if serverBin != "" {
				cfg.ServerBin = serverBin
			}
			if cfg.DB == "" || cfg.DB == runner.DBTidal {
				if err := checkBinary("--server-bin", cfg.ServerBin); err != nil {
					return err
				}
			}
			cfg.Test = strings.TrimSuffix(cfg.Test, "-repro") + "-repro"
			fmt.Fprintf(cmd.OutOrStdout(), "repro of %s (seed %d, %d faults)\n", filepath.Clean(run.Dir()), cfg.Seed, len(schedule.Steps))
			fmt.Fprintf(cmd.OutOrStdout(), "the repro is a new run of test %s: %s/latest will point at it; %s stays as it is\n", cfg.Test, cfg.Store, filepath.Clean(run.Dir()))
			return execute(cmd, cfg, &schedule, verbose, keepRuns)
		},
	}
	cmd.Flags().StringVar(&serverBin, "server-bin", "", "tidal-server binary (default: the one the run used)")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log harness steps to stderr")
	addKeepRunsFlag(cmd, &keepRuns)
	return cmd
}

func newFaultsCommand() *cobra.Command {
	return &cobra.Command{
		Use:     "faults",
		Short:   "List the fault kinds and groups --nemesis accepts",
		Example: "  tidal-chaos faults",
		Args:    cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprint(cmd.OutOrStdout(), nemesis.Help())
		},
	}
}

func newPruneCommand() *cobra.Command {
	var store string
	var keep int
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "prune --keep N",
		Short: "Remove all but the newest N runs of each test from the run store",
		Long: `Remove old runs from the run store: of each test (store/<test>/), the
newest N runs stay and older ones are removed. A run that a latest link
points to is never removed, nor is a live one (the process that made it,
named in its owner.json, is still running). Suites' store roots one level
down (store/chaos-suite/, store/bugs-suite/) are pruned the same way;
directories that are not runs (pids/, junit/, suites' spec directories)
are left alone. Every removed run is printed with its size, then the total
freed.

tidal-chaos run does the same at its end with --keep-runs (default 20).`,
		Example: `  # see what keeping 5 runs per test would free, without removing anything
  tidal-chaos prune --keep 5 --dry-run

  # keep only the run latest points to in each test of the chaos suite's store
  tidal-chaos prune --store store/chaos-suite --keep 0`,
		Args: cobra.NoArgs,
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if keep < 0 {
				return fmt.Errorf("--keep: expected a number of runs >= 0, found %d", keep)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := report.Prune(store, report.PruneOptions{Keep: keep, DryRun: dryRun})
			printPruned(cmd.OutOrStdout(), res, dryRun)
			return err
		},
	}
	f := cmd.Flags()
	f.IntVar(&keep, "keep", 0, "newest runs to keep per test (the run latest points to and live runs are kept besides)")
	f.StringVar(&store, "store", "store", "run store root (or one test's directory in it)")
	f.BoolVar(&dryRun, "dry-run", false, "print what would be removed and freed; remove nothing")
	markRequired(cmd, "keep")
	return cmd
}

func printPruned(w io.Writer, res report.PruneResult, dryRun bool) {
	verb, freed := "removed", "freed"
	if dryRun {
		verb, freed = "would remove", "would free"
	}
	for _, r := range res.Removed {
		fmt.Fprintf(w, "%s %s (%s)\n", verb, r.Dir, formatBytes(r.Bytes))
	}
	for _, s := range res.Spared {
		fmt.Fprintf(w, "kept %s: %s\n", s.Dir, s.Reason)
	}
	fmt.Fprintf(w, "%s %s in %d runs; %d runs kept\n", freed, formatBytes(res.Freed), len(res.Removed), res.Kept)
}

// formatBytes is n in the largest binary unit that keeps it >= 1.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// parseWorkload reads --workload, --select and --reads for the run's
// database: tidal-server's workloads, or etcd's (register, append).
func parseWorkload(cmd *cobra.Command, cfg *runner.Config, kind, selection, reads string) error {
	switch cfg.DB {
	case runner.DBTidal, "":
		k, err := workload.ParseKind(kind)
		if err != nil {
			return fmt.Errorf("--workload: %w", err)
		}
		sel, err := workload.ParseSelection(selection)
		if err != nil {
			return fmt.Errorf("--select: %w", err)
		}
		cfg.Workload.Kind, cfg.Workload.Select = k, sel
		for _, name := range []string{"keys", "values", "ops-per-key", "op-timeout"} {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s: only for --db etcd (its register workload)", name)
			}
		}
		if cmd.Flags().Changed("reads") {
			return fmt.Errorf("--reads: only for --db etcd (tidal-server's workloads read linearizably)")
		}
		return nil
	case runner.DBEtcd:
		cfg.Etcd.Workload, cfg.Etcd.Reads = etcd.Register, reads
		if cmd.Flags().Changed("workload") {
			cfg.Etcd.Workload = kind
		}
		cfg.Etcd.Select = selection
		if _, err := cfg.Etcd.WithDefaults(); err != nil {
			return fmt.Errorf("--workload/--reads/--select/--keys/--values: %w", err)
		}
		return nil
	}
	return fmt.Errorf("--db: expected %s or %s, found %q", runner.DBTidal, runner.DBEtcd, cfg.DB)
}

// durationFlag is an etcd.Duration as a pflag.Value ("5s").
type durationFlag etcd.Duration

func (d *durationFlag) String() string {
	if *d == 0 {
		return ""
	}
	return time.Duration(*d).String()
}

func (d *durationFlag) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v <= 0 {
		return fmt.Errorf("expected a duration > 0, found %s", s)
	}
	*d = durationFlag(v)
	return nil
}

func (d *durationFlag) Type() string { return "duration" }
