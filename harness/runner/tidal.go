package runner

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/db"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/workload"
)

// tidalDB is tidal-server as a db.DB: the cluster of package cluster on
// the process or docker backend, the workloads of package workload, the
// lag sampler, and the ledger, counter, linearizable, aggregates,
// embeddings and convergence checkers (lag and availability are the
// runner's, for every DB: Analyze). Everything the runner did for
// tidal-server before the adapter interface it still does,
// here.
type tidalDB struct{ cfg Config }

// Name implements db.DB.
func (tidalDB) Name() string { return DBTidal }

// Capabilities implements db.DB: every fault kind.
func (tidalDB) Capabilities() nemesis.Capabilities {
	return nemesis.Capabilities{DB: DBTidal, Has: []nemesis.Capability{nemesis.CapNetwork, nemesis.CapKill, nemesis.CapPause,
		nemesis.CapLeader, nemesis.CapTransferLeader, nemesis.CapMembership, nemesis.CapDisk, nemesis.CapClock, nemesis.CapStop, nemesis.CapElectionLog}}
}

// Setup implements db.DB.
func (t tidalDB) Setup(ctx context.Context, env db.Env) (db.Cluster, error) {
	cfg := t.cfg
	bin, err := filepath.Abs(cfg.ServerBin)
	if err != nil {
		return nil, err
	}
	relayBin := cfg.RelayBinary
	if relayBin != "" {
		if relayBin, err = filepath.Abs(relayBin); err != nil {
			return nil, err
		}
	}
	backend, newNetwork, err := startBackend(ctx, cfg, bin, relayBin, env.Registry, env.NodesDir, env.Logger)
	if err != nil {
		return nil, err
	}
	wrapped := env.Wrap(backend)
	ccfg := cluster.Config{Nodes: cfg.Nodes, Backend: wrapped, Dir: env.NodesDir, Flags: cfg.ServerFlags, Logger: env.Logger, RelayBinary: relayBin,
		WALSegmentSize: cfg.WALSegmentSize, Insecure: cfg.Insecure, CertsDir: filepath.Join(env.RunDir, "certs"),
		DiskFaults: env.DiskFaults, ClockControl: env.ClockControl}
	if newNetwork != nil {
		ccfg.NewNetwork, ccfg.RelayBinary = newNetwork, ""
	}
	c, err := cluster.New(ccfg)
	if err != nil {
		backend.Close()
		return nil, err
	}
	if env.Up != nil {
		env.Up()
	}
	upCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	_, err = c.WaitLeader(upCtx)
	if err == nil {
		err = c.WaitReady(upCtx)
	}
	cancel()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster did not come up (logs in %s): %w", env.NodesDir, err)
	}
	return &tidalCluster{LiveCluster: nemesis.Live(c), c: c, cfg: cfg}, nil
}

// Check implements db.DB: the checkers of tidal-server's workloads.
func (t tidalDB) Check(in db.CheckInput) []checker.Result {
	cfg, run, ops := t.cfg, in.Run, in.Ops
	var rs []checker.Result
	digests, digestErr := run.ReadDigests()
	audits, err := run.ReadAudits()
	if err != nil {
		rs = append(rs, checker.Result{Name: "ledger", Valid: checker.Unknown, Summary: "audits unreadable: " + err.Error()})
	} else {
		var applied map[string]uint64
		if digestErr == nil {
			applied = map[string]uint64{}
			for n, d := range digests {
				applied[n] = d.AppliedIndex
			}
		}
		// The applied state's counts, when the run read them: the ledger
		// tells a short id memory from lost writes with them.
		state, err := run.ReadEntityCounts()
		if err != nil {
			state = nil
		}
		rs = append(rs, checker.LedgerWithState(ops, audits, applied, in.Audit, state))
	}
	rs = append(rs, checker.Responses(ops))
	kind := cfg.Workload.Kind
	if kind == workload.Counter || kind == workload.Mixed {
		rs = append(rs, checker.Counter(ops))
		rs = append(rs, checker.Linearizable(ops, run.LinearizableDir(), cfg.LinearizableTimeout.D()))
		rs = append(rs, checker.Aggregates(ops, checker.SignalModel{Signal: workload.CounterSignal, HalfLife: cfg.Workload.CounterHalfLife, Windows: cfg.Workload.CounterWindows}))
	}
	if kind == workload.Embeddings || kind == workload.Mixed {
		rs = append(rs, checker.Embeddings(ops, nodeNames(cfg.Nodes)))
	}
	rs = append(rs, electionResult(run, ops, in.Evidence))
	if digestErr == nil {
		rs = append(rs, checker.ConvergenceCovering(digests, in.Digest))
	} else {
		rs = append(rs, checker.Result{Name: "convergence", Valid: checker.Unknown, Summary: "digests unreadable: " + digestErr.Error()})
	}
	return rs
}

// electionResult judges election safety from elections.jsonl and the
// node exits (checker.Election).
func electionResult(run *report.Run, ops []history.Op, ev checker.NodeEvidence) checker.Result {
	samples, found, err := run.ReadElections()
	switch {
	case err != nil:
		return checker.Result{Name: "election", Valid: checker.Unknown, Summary: "election samples unreadable: " + err.Error()}
	case !found:
		return checker.Result{Name: "election", Valid: checker.Unknown, Summary: "the run has no election samples (" + report.ElectionsFile + "): a store from before they were taken"}
	}
	samples = append(samples, checker.LoggedLeaderClaims(ops)...)
	logs := map[string]string{}
	for _, n := range ev.Nodes {
		logs[n] = filepath.Join(run.NodesDir(), n, "node.log")
	}
	el, err := checker.ReadElectionLogs(logs)
	if err != nil {
		r := checker.ElectionWithLogs(samples, ev.Exits, nil)
		if r.Valid == checker.Valid {
			r.Valid, r.Summary = checker.Unknown, r.Summary+"; node logs unreadable: "+err.Error()
		}
		return r
	}
	if len(el.Starts) == 0 {
		// A store whose node logs were pruned: the samples alone.
		return checker.ElectionWithLogs(samples, ev.Exits, nil)
	}
	return checker.ElectionWithLogs(samples, ev.Exits, &el)
}

// tidalCluster is a running tidal cluster as a db.Cluster. It embeds
// the concrete nemesis.LiveCluster, so the disk and clock faults reach
// the cluster's own methods (the nemesis' DiskCluster and ClockSetter)
// without forwarding.
type tidalCluster struct {
	nemesis.LiveCluster
	c   *cluster.Cluster
	cfg Config
}

var (
	_ db.Cluster          = (*tidalCluster)(nil)
	_ nemesis.DiskCluster = (*tidalCluster)(nil)
	_ nemesis.ClockSetter = (*tidalCluster)(nil)
)

func (t *tidalCluster) Workload(rec *history.Recorder, d time.Duration) (db.Workload, error) {
	wcfg := t.cfg.Workload
	wcfg.Duration = d
	w, err := workload.New(wcfg, workload.FromCluster(t.c), rec)
	if err != nil {
		return nil, err
	}
	return tidalWorkload{w}, nil
}

func (t *tidalCluster) Observe(run *report.Run, now func() int64) (func(), error) {
	lagw, err := run.LagWriter()
	if err != nil {
		return nil, err
	}
	ew, err := run.ElectionWriter()
	if err != nil {
		lagw.Close()
		return nil, err
	}
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampler := &lagSampler{c: t.c, now: now, interval: t.cfg.SampleInterval.D(), w: lagw, elections: ew}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sampler.run(sampleCtx)
	}()
	return func() {
		stopSampling()
		<-done
		lagw.Close()
		ew.Close()
	}, nil
}

func (t *tidalCluster) Serving(ctx context.Context, name string) error {
	if _, err := t.c.Status(ctx, name); err != nil {
		return fmt.Errorf("GET /cluster/status: %v", err)
	}
	return nil
}

func (t *tidalCluster) Collect(ctx context.Context, run *report.Run, out io.Writer, alive func(string) bool, ev *checker.NodeEvidence) {
	collect(ctx, t.c, alive, run, out, ev)
	if wc, err := t.cfg.Workload.WithDefaults(); err == nil {
		switch wc.Kind {
		case workload.Ledger, workload.Mixed:
			collectEntityCounts(ctx, t.c, alive, run, out, wc.Entities)
		case workload.Counter:
			// No ledger entities: the counter keys the audits name.
			collectEntityCounts(ctx, t.c, alive, run, out, 0)
		}
	}
}

func (t *tidalCluster) Close() error { return t.c.Close() }

// tidalWorkload runs the final reads of the workloads that have them.
type tidalWorkload struct{ *workload.Workload }

func (w tidalWorkload) Final(ctx context.Context) error {
	switch w.Config().Kind {
	case workload.Counter, workload.Mixed, workload.Embeddings:
		return w.FinalReads(ctx)
	}
	return nil
}
