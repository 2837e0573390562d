package bugs

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
)

// The embeddings and aggregates checkers were
// shown saying false on synthetic histories only. Each defect here is
// caught by one of them on a real cluster; each run is also made against
// the normal build, with the same seed, schedule and workload, and must
// come out VALID, so the catch is the defect's and not the run's.
// BUGS_SEED shifts the seeds as for the disk specs.

// checkerDefect is one planted defect aimed at one checker, and the run
// that exposes it.
type checkerDefect struct {
	name string // TIDAL_BUGS value
	by   string // the checker that must say false
	// blind names checkers that must not say false: the defect is one
	// they cannot see (every node computes the same wrong answer).
	blind []string
	cfg   runner.Config
	// writes is the op whose acknowledgements show the run did work.
	writes string
}

var checkerDefects = []checkerDefect{
	{
		// Every snapshot carries an empty vector store. A node that
		// restarts restores its newest snapshot and replays only the log
		// after it, so every vector put before the snapshot's index is
		// gone from it; half the puts go to write-once entities, which
		// no later put refills. Snapshots every 200 entries, so each
		// restart (every ~4 s) finds one. The mixed workload, so the
		// normal build's run has ledger writes too and can be VALID
		// (with embeddings alone the ledger checker has nothing to
		// check and says unknown).
		name: "drop-vectors-in-snapshot", by: "embeddings", writes: history.FPutEmbedding,
		cfg: runner.Config{Test: "bug-drop-vectors-in-snapshot", Nodes: 3, Seed: 9909, Duration: runner.Duration(16 * time.Second),
			Nemesis: []string{"restart-one"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			ServerFlags: []string{"--snapshot-every=200", "--snapshot-catch-up=50"},
			Workload:    workload.Config{Kind: workload.Mixed, Concurrency: 8}},
	},
	{
		// A put to an entity that already has a vector is acknowledged
		// as applied and its vector dropped. Every node applies the log
		// alike, so the digests agree; the overwritten entities' final
		// reads show a vector an acknowledged later put replaced. Mixed
		// workload, as above, so the normal build's twin can be VALID.
		name: "ignore-embedding-overwrite", by: "embeddings", blind: []string{"convergence"}, writes: history.FPutEmbedding,
		cfg: runner.Config{Test: "bug-ignore-embedding-overwrite", Nodes: 3, Seed: 10212, Duration: runner.Duration(16 * time.Second),
			Nemesis: []string{"partition-halves"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Mixed, Concurrency: 8}},
	},
	{
		// Every windowed count is read one bucket late: it leaves out
		// the bucket holding the read's time (1 minute wide for the 1h
		// window, 24 minutes for the 24h one) and counts the one that
		// has just expired. Half the counter adds carry a client ts up
		// to 30 h old, so both windows hold events of every age. Read
		// time only and the same on every node: the state, and so the
		// digests, are right, and the counter checkers read the weight
		// sum.
		name: "window-off-by-one-bucket", by: "aggregates", blind: []string{"convergence", "counter", "linearizable"}, writes: history.FAdd,
		cfg: runner.Config{Test: "bug-window-off-by-one-bucket", Nodes: 3, Seed: 10010, Duration: runner.Duration(16 * time.Second),
			Nemesis: []string{"restart-one"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Counter, Concurrency: 8}},
	},
	{
		// Scores decay with a 72 min half-life where the schema says
		// 72h. Half the counter adds carry a client ts up to 30 h old,
		// which the node's wrong half-life decays by up to 2^-25 instead
		// of 2^-0.42. Every node folds the same log the same way, so
		// their digests agree.
		name: "decay-wrong-half-life", by: "aggregates", blind: []string{"convergence", "counter", "linearizable"}, writes: history.FAdd,
		cfg: runner.Config{Test: "bug-decay-wrong-half-life", Nodes: 3, Seed: 10111, Duration: runner.Duration(16 * time.Second),
			Nemesis: []string{"partition-halves"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Counter, Concurrency: 8}},
	},
	{
		// Every 20th valid POST /v1/signals is answered 500 without being
		// proposed. Nothing is lost, doubled or wrong in any state: the
		// client records the 500 as info (maybe applied), and an info
		// write that never landed is allowed. Only the answers show it,
		// at default settings and without faults.
		name: "internal-error-on-valid-write", by: "responses", writes: history.FWrite,
		blind: []string{"ledger", "convergence", "counter", "linearizable", "aggregates", "embeddings"},
		cfg: runner.Config{Test: "bug-internal-error-on-valid-write", Nodes: 3, Seed: 9505, Duration: runner.Duration(10 * time.Second),
			Workload: workload.Config{Kind: workload.Mixed, Concurrency: 8}},
	},
}

// okOps counts the history's acknowledged ops of f.
func okOps(o *runner.Outcome, f string) int {
	ops, err := o.Run.ReadHistory()
	Expect(err).NotTo(HaveOccurred())
	n := 0
	for _, op := range ops {
		if op.Type == history.OK && op.F == f {
			n++
		}
	}
	return n
}

var _ = Describe("planted defects are caught by the embeddings, aggregates and responses checkers", func() {
	for _, cd := range checkerDefects {
		It(cd.name+": caught by "+cd.by, func(ctx SpecContext) {
			cfg := cd.cfg
			cfg.Seed += seedOffset()
			o, s, warned := plantedRun(ctx, buggyServer, cd.name, cfg)
			Expect(warned).To(BeTrue(), "every node should log %q", warning)
			expectCaught(o, s, cd.by)
			for _, r := range o.Results.Results {
				for _, b := range cd.blind {
					Expect(r.Name != b || r.Valid != checker.Invalid).To(BeTrue(),
						"expected %s not to see %s (every node computes the same), found it said false: %s\n%s", b, cd.name, r.Summary, s)
				}
			}
		}, SpecTimeout(3*time.Minute))

		It(cd.name+": the normal build is valid under the same run", func(ctx SpecContext) {
			cfg := cd.cfg
			cfg.Seed += seedOffset()
			cfg.Test += "-normal"
			o, s, warned := plantedRun(ctx, normalBins.TidalServer, cd.name, cfg)
			Expect(warned).To(BeFalse(), "a normal build should not log %q", warning)
			Expect(okOps(o, cd.writes)).To(BeNumerically(">", 0), "expected acknowledged %s ops in the history\n%s", cd.writes, s)
			Expect(o.Results.Valid).To(Equal(checker.Valid), "the normal build should pass the run that catches %s\n%s", cd.name, s)
		}, SpecTimeout(3*time.Minute))
	}
})
