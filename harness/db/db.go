// Package db is the harness's database adapter interface,
// Jepsen's split: a DB sets up a cluster of one database and acts on its
// nodes (start, kill, pause, wipe, membership, the current leader, its
// logs), its Workload turns operations into requests and classifies every
// outcome as ok, fail (certainly not applied) or info (unknown), and its
// checkers judge what was recorded. The runner (package runner) owns
// everything around them: the run store, the seeded fault schedule, the
// nemesis, progress, the final heal, the nodes' exits and the report.
//
// tidal-server is one DB (runner's tidal adapter); etcd is another
// (package db/etcd). A DB says which fault capabilities it has
// (nemesis.Capabilities); a run refuses, before anything starts, a fault
// whose needs it lacks.
package db

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/process"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/workload"
)

// DB is one database the harness can run.
type DB interface {
	// Name is what --db calls it ("tidal", "etcd").
	Name() string
	// Capabilities are the faults it can take.
	Capabilities() nemesis.Capabilities
	// Setup starts a cluster as env says and returns once it has a
	// leader and serves; on error nothing it started is left running.
	Setup(ctx context.Context, env Env) (Cluster, error)
	// Check runs the DB's own checkers over a stored run (after the
	// runner's: stats, nodes, faults). It needs no live cluster:
	// `tidal-chaos analyze` calls it on a store alone.
	Check(in CheckInput) []checker.Result
}

// Env is what the runner gives Setup.
type Env struct {
	Nodes    int
	RunDir   string // the run's store directory
	NodesDir string // nodes/<name>/ go here
	Registry *process.Registry
	// Wrap wraps the backend that starts the node processes: the runner's
	// watch of every exit (and a test's hook). Setup must launch every
	// node through it.
	Wrap func(cluster.Backend) cluster.Backend
	// Up, when set, is called once every node has been started (before
	// waiting for a leader): from then on every exit counts as the
	// database's, not as a failed start.
	Up     func()
	Logger *slog.Logger
	// DiskFaults: the schedule has disk faults (or --faultfs on), so the
	// nodes' data dirs must sit on faultfs; an adapter without CapDisk
	// never sees it set (the run refused the faults first).
	DiskFaults bool
	// ClockControl: the schedule has clock faults, so the nodes must start
	// with a clock the nemesis can move (CapClock).
	ClockControl bool
}

// Cluster is a running cluster of a DB: what the nemesis acts on, plus
// what the runner needs around the workload.
type Cluster interface {
	nemesis.Cluster
	// Workload makes the run's clients, recording into rec; they issue
	// ops for d.
	Workload(rec *history.Recorder, d time.Duration) (Workload, error)
	// Observe starts what samples the cluster during the run (tidal: the
	// lag sampler) on the history's clock; stop ends it and returns once
	// it is flushed. A DB without one returns a no-op.
	Observe(run *report.Run, now func() int64) (stop func(), err error)
	// Serving says whether name answers its status endpoint now (nil),
	// or why not.
	Serving(ctx context.Context, name string) error
	// Collect reads what every node holds after the final heal into the
	// store (audits, digests, metrics) for Check, recording in ev why a
	// node's could not be read. alive says whether a node's process runs.
	Collect(ctx context.Context, run *report.Run, out io.Writer, alive func(string) bool, ev *checker.NodeEvidence)
	Close() error
}

// Workload is the clients of one run.
type Workload interface {
	Run(ctx context.Context) error
	Progress() workload.Progress
	// Final runs after the heal and convergence (final reads; nothing for
	// a workload that needs none).
	Final(ctx context.Context) error
}

// CheckInput is what Check judges.
type CheckInput struct {
	Run      *report.Run
	Ops      []history.Op
	Evidence checker.NodeEvidence
	// Audit and Digest cover the nodes: the crashed, the removed, and why
	// a node's audit or digest could not be read.
	Audit, Digest checker.Coverage
}
