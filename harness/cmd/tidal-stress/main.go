// Command tidal-stress drives open-loop load against tidal-server nodes and
// reports latency from each op's intended start, so a stalled server shows
// as latency, not as a lower rate.
//
//	tidal-stress --targets 127.0.0.1:7071,127.0.0.1:7072 --rate 5000 --duration 30s
//	tidal-stress --targets 127.0.0.1:7071 --batch 100 --ramp 200:200:10:5s --slo-p99 20ms --json out.json
//	tidal-stress --targets 127.0.0.1:7071 --embedding-dim 1536 --ramp 500:500:8:5s
//	tidal-stress --targets 127.0.0.1:7071 --certs-dir certs --rate 2000   # TLS h2, client.writer.crt
//	tidal-stress --targets 127.0.0.1:7071 --protocol grpc --grpc-targets 127.0.0.1:7081 --rate 5000   # the ingest stream
//
// Exit status: 0 when the run completed, 1 on an I/O error, 64 on a usage
// error (an unknown flag, a value that does not parse), 2 when
// --fail-on-slo is set and the SLO was missed (fixed rate: the stage failed;
// ramp: no stage met it).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tidaldb/tidal/buildinfo"
	"github.com/tidaldb/tidal/harness/stress"
	"github.com/tidaldb/tidal/tidal-server/client/creds"
	"github.com/tidaldb/tidal/usage"
)

// errSLO reports a missed SLO with its own exit status.
var errSLO = errors.New("SLO missed")

func main() {
	err := newCommand().Execute()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tidal-stress:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode maps a run's outcome to the process exit status (the package
// comment lists them).
func exitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errSLO):
		return 2
	case usage.Is(err):
		return usage.Code
	default:
		return 1
	}
}

func newCommand() *cobra.Command {
	var (
		cfg         stress.Config
		mix         string
		rate        float64
		rampSpec    string
		duration    time.Duration
		jsonPath    string
		lagEvery    time.Duration
		quiet       bool
		failOnSLO   bool
		maxErrorPct float64
		secure      creds.Flags
		protocol    string
	)
	cmd := &cobra.Command{
		Use:   "tidal-stress",
		Short: "Open-loop load generator for tidal-server",
		Long: `tidal-stress sends requests on a fixed schedule (--rate) or a linear ramp
(--ramp start:step:stages:stage-duration), measures each op's latency from its
intended start (queueing included) into HDR histograms, and reports offered
against achieved rate, p50/p90/p99/p999/max and errors by kind. Achieved rates
divide by the time the stage's ops took — its duration plus the drain of its
backlog, reported as "drain" — so past saturation achieved falls below
offered. Failed ops (503, 504, timeouts, ...) have their latency reported too
("failed p99", and "all p99" over every op sent), and --slo-p99 applies to
both the successes and all ops sent. Ops that come due while --max-inflight
are outstanding are shed: counted apart from server errors, because they
measure the generator, not the server. A ramp reports its knee: the highest
stage with at most 1% errors and p99 within --slo-p99.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if cfg.Mix, err = stress.ParseMix(mix); err != nil {
				return err
			}
			cfg.SLO.MaxErrorRate = maxErrorPct / 100
			var plan []stress.Stage
			switch {
			case rampSpec != "" && cmd.Flags().Changed("rate"):
				return errors.New("expected either --rate or --ramp, found both")
			case rampSpec != "":
				r, err := stress.ParseRamp(rampSpec)
				if err != nil {
					return err
				}
				plan = r.Plan()
			default:
				if rate <= 0 || duration <= 0 {
					return fmt.Errorf("expected --rate > 0 and --duration > 0, found %g and %s", rate, duration)
				}
				plan = []stress.Stage{{Rate: rate, Duration: duration}}
			}
			switch {
			case protocol == "grpc" && len(cfg.GRPCTargets) == 0:
				return errors.New("--protocol grpc: expected --grpc-targets, the nodes' --grpc-addr in the order of --targets")
			case protocol == "http" && len(cfg.GRPCTargets) > 0:
				return errors.New("--grpc-targets: only with --protocol grpc")
			case protocol != "http" && protocol != "grpc":
				return fmt.Errorf("--protocol: expected http or grpc, found %q", protocol)
			}
			c, err := secure.Resolve()
			if err != nil {
				return err
			}
			cfg.TLS, cfg.Token = c.TLS, c.Token
			out := cmd.OutOrStdout()
			if !quiet {
				cfg.Progress = func(p stress.Progress) { fmt.Fprintln(out, p) }
			}

			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var lag *stress.LagReport
			lagDone := make(chan struct{})
			lagCtx, stopLag := context.WithCancel(ctx)
			if lagEvery > 0 {
				go func() {
					defer close(lagDone)
					lag = stress.SampleLag(lagCtx, cfg.Targets, lagEvery, c.Options()...)
				}()
			} else {
				close(lagDone)
			}
			res, runErr := stress.Run(ctx, cfg, plan)
			stopLag()
			<-lagDone
			if res == nil {
				return runErr
			}
			res.Lag = lag
			if err := res.WriteTable(out); err != nil {
				return err
			}
			if jsonPath != "" {
				if err := writeJSON(jsonPath, res); err != nil {
					return err
				}
			}
			if runErr != nil {
				return fmt.Errorf("run ended early: %w", runErr)
			}
			if failOnSLO {
				if len(res.Stages) > 1 && res.Knee == nil {
					return fmt.Errorf("%w: no stage of the ramp met it", errSLO)
				}
				if len(res.Stages) == 1 && !res.Stages[0].Pass {
					return fmt.Errorf("%w: %s", errSLO, res.Stages[0].Reason)
				}
			}
			return nil
		},
	}
	// --version: the same one line every tidal binary prints.
	cmd.Version = buildinfo.Read().String()
	cmd.SetVersionTemplate(buildinfo.Line("tidal-stress") + "\n")
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Targets, "targets", []string{"127.0.0.1:7070"}, "node client addresses, comma-separated; ops go round-robin")
	f.StringVar(&mix, "mix", "writes", "writes, reads or mixed")
	f.Float64Var(&cfg.ReadFraction, "read-fraction", 0.5, "share of reads when --mix mixed")
	f.IntVar(&cfg.Batch, "batch", 1, "events per signal write")
	f.IntVar(&cfg.EmbeddingDim, "embedding-dim", 0, "when > 0, writes are embedding puts with vectors of this dimension")
	f.BoolVar(&cfg.BinaryVectors, "binary-vectors", false, "send embedding puts as application/octet-stream (little-endian float32s) instead of JSON")
	f.Uint64Var(&cfg.Entities, "entities", 100000, "entity ids are drawn uniformly from [1, entities]")
	f.StringVar(&cfg.Consistency, "consistency", "linearizable", "reads: linearizable or local")
	f.Float64Var(&rate, "rate", 1000, "ops per second (one stage of --duration)")
	f.StringVar(&rampSpec, "ramp", "", "start:step:stages:stage-duration, e.g. 1000:1000:10:5s; a step of x2 doubles each stage (instead of --rate)")
	f.DurationVar(&duration, "duration", 10*time.Second, "how long --rate runs")
	f.IntVar(&cfg.MaxInFlight, "max-inflight", 4096, "ops outstanding at most; ops due beyond it are shed (and reported as such)")
	f.IntVar(&cfg.Connections, "connections", 64, "connections per target: over HTTP/1.1 the concurrency cap per node (ops beyond it wait, and the wait counts as latency); over HTTP/2 each carries up to the node's --http2-max-streams")
	f.DurationVar(&cfg.Timeout, "timeout", 10*time.Second, "per-op timeout")
	f.DurationVar(&cfg.SLO.P99, "slo-p99", 0, "p99 latency a stage must stay within (0: none)")
	f.Float64Var(&maxErrorPct, "max-error-pct", 1, "percent of ops (shed included) a stage may lose and still meet the SLO")
	f.IntVar(&cfg.StopAfterFailures, "ramp-stop-after", 2, "end a ramp after this many consecutive stages missed the SLO (0: run all)")
	f.Uint64Var(&cfg.Seed, "seed", 0, "random seed for entities and vectors (0: from the clock)")
	f.StringVar(&jsonPath, "json", "", "write the full result as JSON to this file")
	f.DurationVar(&lagEvery, "sample-lag", 0, "poll /cluster/status on every target at this interval and report follower lag (0: off)")
	f.BoolVar(&quiet, "quiet", false, "no per-second progress lines")
	f.BoolVar(&failOnSLO, "fail-on-slo", false, "exit 2 when the SLO was missed")
	// A secured cluster: load presents client.writer.crt unless told otherwise.
	secure.Register(f, "writer")
	f.StringVar(&protocol, "protocol", "http", "how signal writes travel: http (POST /v1/signals) or grpc (the nodes' gRPC ingest stream at --grpc-targets; reads and embeddings stay HTTP)")
	f.StringSliceVar(&cfg.GRPCTargets, "grpc-targets", nil, "with --protocol grpc: the nodes' --grpc-addr, one per --targets address in the same order")
	f.IntVar(&cfg.GRPCStreams, "grpc-streams", 1, "with --protocol grpc: ingest streams per target, shared by the workers")
	f.BoolVar(&cfg.HTTP1, "http1", false, "with --certs-dir: HTTP/1.1 over TLS instead of HTTP/2 (to compare)")
	usage.Install(cmd)
	return cmd
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding results for %s: %w", path, err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	return nil
}
