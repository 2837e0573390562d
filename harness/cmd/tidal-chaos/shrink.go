package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/tidaldb/tidal/harness/shrink"
	"github.com/tidaldb/tidal/usage"
)

func newShrinkCommand() *cobra.Command {
	var cfg shrink.Config
	var verbose bool
	cmd := &cobra.Command{
		Use:   "shrink RUN-DIR",
		Short: "Find the smallest fault schedule that fails the way a stored run did",
		Long: `Shrink a failing run's fault schedule to the fewest, shortest faults that
still fail the same way, by delta debugging (ddmin) over its fault
episodes (a fault and its heal), then passes that drop targets, halve
fault durations, move faults earlier and end the run sooner. Every
candidate is a real run with the stored run's configuration and workload
seed.

"The same way": the candidate's anomaly signature holds the stored run's
primary anomaly, the first kind of the first INVALID checker in the order
ledger, linearizable, counter, embeddings, aggregates, convergence, watch,
fencing, clock, nodes, (others), faults, availability, lag.

First the unchanged schedule is run --runs times; if it never fails the
same way, the shrink ends there. If it failed every time, a candidate is
rejected at its first passing run and kept after two same-way failures; if
only sometimes (flaky), a candidate is kept at its first same-way failure
and rejected after --runs passing runs. Candidates are cached by schedule
hash. When --budget is spent no run starts and the best schedule so far is
the result.

The result is a new run directory, <store>/<test>-shrink/<timestamp>/,
with the minimal schedule.json (replay it with the printed tidal-chaos
repro command), shrink.json (every candidate and run) and candidates/
(their runs). The minimum is then run --confirm times as <test>-repro
runs, whose report.html compares the two schedules.

Exit status: 1 when a failing minimum was found (the anomaly stands), 2
when there is nothing to shrink (the run was VALID or UNKNOWN, the
failure did not reproduce) or on an error, 64 usage.`,
		Example: `  # shrink the newest run, for at most 20 minutes
  tidal-chaos shrink store/latest --budget 20m

  # a planted-bug run: the nodes inherit TIDAL_BUGS from this environment
  TIDAL_BUGS=ack-before-commit tidal-chaos shrink store/chaos/20261206T051502.114Z --server-bin bin/tidal-server-bugs`,
		Args: cobra.ExactArgs(1),
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Search.Budget < 0 {
				return usage.Errorf("--budget: expected a duration >= 0 (0: none), found %s", cfg.Search.Budget)
			}
			if cfg.Search.MaxRuns < 1 {
				return usage.Errorf("--runs: expected at least 1, found %d", cfg.Search.MaxRuns)
			}
			if cfg.Confirm < 0 {
				return usage.Errorf("--confirm: expected a number of runs >= 0, found %d", cfg.Confirm)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			st, err := shrink.Open(args[0])
			var nothing *shrink.NothingToShrinkError
			if errors.As(err, &nothing) {
				fmt.Fprintln(cmd.ErrOrStderr(), "tidal-chaos:", err)
				return exitStatus(2)
			}
			if err != nil {
				return err
			}
			if cfg.ServerBin == "" && (st.Config.DB == "" || st.Config.DB == "tidal") {
				if err := checkBinary("--server-bin", st.Config.ServerBin); err != nil {
					return err
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			cfg.Verbose = verbose
			if verbose {
				cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			}
			o, err := shrink.Shrink(ctx, st, cfg, out)
			if o != nil && o.Report != nil {
				printShrink(cmd, st, o)
			}
			if err != nil {
				return err
			}
			if !o.Report.Reproduced {
				return exitStatus(2)
			}
			return exitStatus(1)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&cfg.Search.Budget, "budget", 20*time.Minute, "wall-clock budget of the search; when spent, the best schedule so far is the result (0: none)")
	f.IntVar(&cfg.Search.MaxRuns, "runs", 3, "k: runs of the unchanged schedule, and passing runs that reject a candidate when the failure is flaky")
	f.IntVar(&cfg.Confirm, "confirm", 3, "runs of the minimum after the search, stored as <test>-repro runs")
	f.DurationVar(&cfg.Search.Settle, "settle", 5*time.Second, "what the shortened run leaves after its last heal")
	f.StringVar(&cfg.ServerBin, "server-bin", "", "tidal-server binary (default: the one the run used)")
	f.BoolVarP(&verbose, "verbose", "v", false, "print every run's progress and log harness steps to stderr")
	return cmd
}

// printShrink ends a shrink's output: what it found, and how to replay it.
func printShrink(cmd *cobra.Command, st *shrink.Stored, o *shrink.Outcome) {
	out, r := cmd.OutOrStdout(), o.Report
	fmt.Fprintln(out)
	if !r.Reproduced {
		fmt.Fprintf(out, "the failure did not reproduce in %d runs of the original schedule; nothing to shrink\n", r.OriginalRuns)
		fmt.Fprintf(out, "  candidates and their runs: %s\n", filepath.Join(o.Dir, shrink.ReportFile))
		return
	}
	budget := ""
	if r.BudgetExhausted {
		budget = " (budget spent: the best so far)"
	}
	fmt.Fprintf(out, "shrunk %s: %d episodes, %s run -> %d episodes, %s run%s\n", filepath.Clean(st.Run.Dir()),
		len(r.Original.Episodes), r.Original.Duration, len(r.Minimal.Episodes), r.Minimal.Duration, budget)
	fmt.Fprintf(out, "  preserving %s; original schedule failed %d of %d runs; %d runs of %d candidates (%d cache hits) in %s\n",
		r.Primary, r.OriginalFailures, r.OriginalRuns, r.Runs, len(r.Trials), r.CacheHits, r.Elapsed)
	fmt.Fprintf(out, "  minimal schedule: %s\n", r.Minimal)
	if len(r.Confirm) > 0 {
		fmt.Fprintf(out, "  the minimum failed the same way in %d of %d repro runs\n", r.ConfirmFailures(), len(r.Confirm))
		for _, c := range r.Confirm {
			fmt.Fprintf(out, "    %s  %s\n", c.Signature, c.Dir)
		}
	}
	fmt.Fprintf(out, "replay: tidal-chaos repro %s\n", o.Dir)
}
