// Command tidal-chaos runs Jepsen-style tests against real tidal-server
// processes: run (a new test), analyze (re-check a stored run), repro (run
// a stored run's seed and schedule again). Exit status: 0 valid, 1 invalid
// (an anomaly was found), 2 unknown or error.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
)

// exitStatus carries the process exit code out of a command.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func main() {
	err := newRoot().Execute()
	var st exitStatus
	switch {
	case err == nil:
	case errors.As(err, &st):
		os.Exit(int(st))
	default:
		fmt.Fprintln(os.Stderr, "tidal-chaos:", err)
		os.Exit(2)
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

Every run leaves a store (store/<test>/<timestamp>/, store/latest points at
the newest) with history.jsonl, results.json, report.html, the schedule and
seed, and each node's logs and metrics.

Exit status: 0 valid, 1 invalid (an anomaly was found), 2 unknown or error.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCommand(), newAnalyzeCommand(), newReproCommand(), newFaultsCommand())
	return root
}

func newRunCommand() *cobra.Command {
	var cfg runner.Config
	var nemesisList, workloadKind, selection string
	var duration, interval, faultDuration, lagP99, lagCatchUp, linTimeout time.Duration
	var verbose bool
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run a chaos test and check it",
		Example: `  # 3 nodes, ledger writes, partitions and kills for a minute
  tidal-chaos run --server-bin bin/tidal-server --nemesis partitions,kill-leader --duration 1m

  # counters with linearizable reads under pauses, a fixed seed
  tidal-chaos run --server-bin bin/tidal-server --workload counter --nemesis pause-leader,pause-one --seed 42

  # 5 nodes, open-loop at 200 ops/s, every fault kind
  tidal-chaos run --server-bin bin/tidal-server --nodes 5 --rate 200 --nemesis all`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			kind, err := workload.ParseKind(workloadKind)
			if err != nil {
				return fmt.Errorf("--workload: %w", err)
			}
			sel, err := workload.ParseSelection(selection)
			if err != nil {
				return fmt.Errorf("--select: %w", err)
			}
			cfg.Workload.Kind, cfg.Workload.Select = kind, sel
			if nemesisList != "" && nemesisList != "none" {
				if _, err := nemesis.ParseMix(nemesisList, cfg.Nodes); err != nil {
					return fmt.Errorf("--nemesis: %w", err)
				}
				cfg.Nemesis = strings.Split(nemesisList, ",")
			}
			cfg.Duration, cfg.Interval, cfg.FaultDuration = runner.Duration(duration), runner.Duration(interval), runner.Duration(faultDuration)
			cfg.LagP99, cfg.LagCatchUp, cfg.LinearizableTimeout = runner.Duration(lagP99), runner.Duration(lagCatchUp), runner.Duration(linTimeout)
			return execute(cmd, cfg, nil, verbose)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Test, "test", "chaos", "test name: the run store is <store>/<test>/<timestamp>/")
	f.IntVar(&cfg.Nodes, "nodes", 3, "cluster size (odd: 3 or 5)")
	f.StringVar(&workloadKind, "workload", "ledger", "ledger (unique-id writes), counter (adds + linearizable reads), embeddings, or mixed")
	f.StringVar(&nemesisList, "nemesis", "partition,kill", "fault kinds or groups, comma-separated (see `tidal-chaos faults`); none = no faults")
	f.DurationVar(&duration, "duration", 30*time.Second, "how long the workload and the fault schedule run")
	f.DurationVar(&interval, "interval", 8*time.Second, "mean gap between fault starts")
	f.DurationVar(&faultDuration, "fault-duration", 4*time.Second, "how long each fault lasts before its heal")
	f.IntVar(&cfg.Workload.Concurrency, "concurrency", 8, "client processes (closed loop) or the in-flight bound (open loop)")
	f.Float64Var(&cfg.Workload.Rate, "rate", 0, "open-loop ops/s (0: closed loop)")
	f.StringVar(&selection, "select", "round-robin", "which node each op goes to: round-robin, random or leader")
	f.Int64Var(&cfg.Seed, "seed", 0, "seed for the schedule and the workload (0: from the clock; printed and stored)")
	f.StringVar(&cfg.Store, "store", "store", "run store root")
	f.StringVar(&cfg.ServerBin, "server-bin", "bin/tidal-server", "tidal-server binary")
	f.StringVar(&cfg.RelayBinary, "relay-bin", "", "tcp-relay binary: run the relay mesh as that standalone process, driven over its control API (empty: in-process relays); with --backend docker, the binary of the relay container (default: beside --server-bin)")
	f.StringVar(&cfg.Backend, "backend", "process", "what runs the nodes: process (tidal-server processes) or docker (containers of an image built FROM scratch around --server-bin, on a network of the run's own)")
	f.StringSliceVar(&cfg.ServerFlags, "server-flag", nil, "extra tidal-server flag, repeatable (e.g. --server-flag=--snapshot-every=2000)")
	f.DurationVar(&lagP99, "slo-lag-p99", 2*time.Second, "lag SLO: follower p99 lag outside fault windows")
	f.DurationVar(&lagCatchUp, "slo-catch-up", 10*time.Second, "lag SLO: catch-up time after each heal")
	f.DurationVar(&linTimeout, "linearizable-timeout", time.Minute, "give up on the linearizability search after this long (verdict unknown)")
	f.BoolVarP(&verbose, "verbose", "v", false, "log harness steps (cluster, nemesis) to stderr")
	return cmd
}

// execute runs cfg, prints the summary and maps the verdict to an exit status.
func execute(cmd *cobra.Command, cfg runner.Config, schedule *nemesis.Schedule, verbose bool) error {
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
	return verdict(o.Results.Valid)
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
	cmd := &cobra.Command{
		Use:   "repro RUN-DIR",
		Short: "Run a stored run again: same config, seed and fault schedule",
		Long: `Start a new run with the stored run's configuration, seed and exact fault
schedule (schedule.json). Timing on a real machine is never identical, so a
repro replays the same faults at the same offsets against the same workload
seed; a bug that needs a precise interleaving may need several tries.`,
		Example: "  tidal-chaos repro store/chaos/20261130T175502.591Z",
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
			var schedule nemesis.Schedule
			if err := run.ReadSchedule(&schedule); err != nil {
				return fmt.Errorf("%s: schedule.json: %w", run.Dir(), err)
			}
			if serverBin != "" {
				cfg.ServerBin = serverBin
			}
			cfg.Test = strings.TrimSuffix(cfg.Test, "-repro") + "-repro"
			fmt.Fprintf(cmd.OutOrStdout(), "repro of %s (seed %d, %d faults)\n", filepath.Clean(run.Dir()), cfg.Seed, len(schedule.Steps))
			return execute(cmd, cfg, &schedule, verbose)
		},
	}
	cmd.Flags().StringVar(&serverBin, "server-bin", "", "tidal-server binary (default: the one the run used)")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log harness steps to stderr")
	return cmd
}

func newFaultsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "faults",
		Short: "List the fault kinds and groups --nemesis accepts",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprint(cmd.OutOrStdout(), nemesis.Help())
		},
	}
}
