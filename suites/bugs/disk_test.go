package bugs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
)

// The WAL's planted defects need faults that reach the
// disk: faultfs under every node's data dir, power cuts that drop what was
// not fsynced, fsyncs that fail. Each is run against the tidalbugs build
// and must come out INVALID through its checker, and the very same
// configuration against the normal build must come out VALID: the catch
// is the defect's, not the schedule's.

// seedEnv shifts every disk spec's seed, so the same specs can be run
// with other seeds (docs/planted-bugs.md gives the catch table over four).
const seedEnv = "BUGS_SEED"

func seedOffset() int64 {
	s := os.Getenv(seedEnv)
	if s == "" {
		return 0
	}
	n, err := strconv.ParseInt(s, 10, 64)
	Expect(err).NotTo(HaveOccurred(), "%s=%q: expected an integer", seedEnv, s)
	return n
}

// diskDefect is one planted WAL defect and the run that exposes it.
type diskDefect struct {
	name string // TIDAL_BUGS value
	by   string // the checker that must say false
	cfg  runner.Config
	// slowFsync, if set, is added to every fsync on every node's disk
	// for the whole run (faultfs slow-disk, armed before the workload
	// starts; armed faults survive power cuts).
	slowFsync time.Duration
	// untorn makes every power cut of the generated schedule keep
	// nothing unsynced (TornWrites off), in schedule.json as run.
	untorn bool
}

// slowFsyncEverywhere arms a constant fsync latency on every node's disk
// as the nemesis gets its cluster, i.e. before the workload starts. It is
// not a scheduled fault (the disk class holds one fault at a time, and a
// power cut would first heal a scheduled slow-disk): it is the disk the
// run is on, said in the spec and in docs/planted-bugs.md.
func slowFsyncEverywhere(lat time.Duration) func(nemesis.Cluster) nemesis.Cluster {
	return func(c nemesis.Cluster) nemesis.Cluster {
		dc, ok := c.(nemesis.DiskCluster)
		Expect(ok && dc.HasDisks()).To(BeTrue(), "expected the nodes' data dirs on faultfs")
		for _, n := range c.Names() {
			d, err := dc.Disk(n)
			Expect(err).NotTo(HaveOccurred())
			Expect(d.Set(faultfs.Faults{SlowDisk: []faultfs.SlowDisk{{Ops: []faultfs.Op{faultfs.OpFsync}, Latency: lat}}})).To(Succeed())
		}
		GinkgoWriter.Printf("every node's fsyncs take %s longer for the whole run\n", lat)
		return c
	}
}

// run runs dd's configuration against server. Its power cuts are the
// cluster's own (cluster.PowerCut): instantaneous, every target frozen,
// every disk cut at once, then killed (docs/planted-bugs.md).
func (dd diskDefect) run(ctx SpecContext, server string, cfg runner.Config) (*runner.Outcome, string, bool) {
	var also []func(nemesis.Cluster) nemesis.Cluster
	if dd.slowFsync > 0 {
		also = append(also, slowFsyncEverywhere(dd.slowFsync))
	}
	var schedule *nemesis.Schedule
	if dd.untorn {
		schedule = untornSchedule(cfg)
	}
	return plantedRun(ctx, server, dd.name, cfg, func(o *runner.Options) {
		o.Nemesis = onFaultFS(also...)
		o.Schedule = schedule
	})
}

// onFaultFS applies the other wrappers to the nemesis' cluster and checks
// that the nodes' data dirs are on faultfs (else a power cut drops
// nothing and no disk defect could be caught).
func onFaultFS(also ...func(nemesis.Cluster) nemesis.Cluster) func(nemesis.Cluster) nemesis.Cluster {
	return func(c nemesis.Cluster) nemesis.Cluster {
		for _, w := range also {
			c = w(c)
		}
		dc, ok := c.(nemesis.DiskCluster)
		Expect(ok && dc.HasDisks()).To(BeTrue(), "expected the nodes' data dirs on faultfs")
		return c
	}
}

// untornSchedule is the schedule the runner would generate for cfg, with
// every power cut keeping none of the unsynced writes.
func untornSchedule(cfg runner.Config) *nemesis.Schedule {
	var nodes []string
	for i := 1; i <= cfg.Nodes; i++ {
		nodes = append(nodes, fmt.Sprintf("n%d", i))
	}
	mix, err := nemesis.ParseMix(strings.Join(cfg.Nemesis, ","), cfg.Nodes)
	Expect(err).NotTo(HaveOccurred())
	s, err := nemesis.Generate(cfg.Seed, nemesis.ScheduleConfig{Duration: cfg.Duration.D(), Interval: cfg.Interval.D(),
		FaultDuration: cfg.FaultDuration.D(), Mix: mix, Nodes: nodes})
	Expect(err).NotTo(HaveOccurred())
	for i := range s.Steps {
		if d := s.Steps[i].Disk; d != nil && d.PowerCut != nil {
			d.PowerCut.TornWrites = false
		}
	}
	Expect(s.Steps).NotTo(BeEmpty())
	return &s
}

// powerCutAll cuts power under every node at once every ~4 s (held 2 s,
// then every node starts again on what its disk kept): a write
// acknowledged by a quorum must survive on what they fsynced.
func powerCutAll(test string, seed int64, w workload.Config) runner.Config {
	return runner.Config{Test: test, Nodes: 3, Seed: seed, Duration: runner.Duration(14 * time.Second),
		Nemesis: []string{"power-cut-all"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
		Workload: w}
}

var diskDefects = []diskDefect{
	{
		// Under load the writer is nearly always inside an fdatasync
		// whose group was already acknowledged: a cut then loses acked
		// writes, if the cut comes while the fsync runs (the
		// cluster's cut is instantaneous, see cluster.PowerCut; one node, as on
		// three a durable copy on any node hides the loss) and
		// the fsync outlasts the ack's way to the client (commit, apply,
		// HTTP). faultfs on the local disk syncs in under a millisecond,
		// so the run is on disks whose fsync takes 50 ms more, as a busy
		// cloud volume's can.
		name: "ack-before-fsync", by: "ledger", slowFsync: 50 * time.Millisecond, untorn: true,
		cfg: func() runner.Config {
			// Cuts ~4 s apart held 1 s, so the node is back and loaded
			// before each one (4-5 cuts in 20 s), none torn: a torn cut
			// keeps a random prefix of the unsynced writes, and the
			// unsynced group is one write, kept whole half the time (a
			// disk may write what was never fsynced); with torn cuts
			// seed 9507's four all tore and kept everything.
			c := powerCutAll("bug-ack-before-fsync", 9505, workload.Config{Kind: workload.Ledger, Concurrency: 16})
			c.Nodes = 1
			c.Duration, c.FaultDuration = runner.Duration(20*time.Second), runner.Duration(time.Second)
			// One node has no follower to lag; what the lag checker
			// sees is its own apply catching up after each restart,
			// which with 50 ms fsyncs and a cut every ~4 s left too few
			// samples outside faults for a 2 s p99 (seed 9506, normal
			// build: 2.15 s over 8 samples).
			c.LagP99 = runner.Duration(5 * time.Second)
			return c
		}(),
	},
	{
		// No segment's name is ever made durable (the first one's
		// neither): a cut takes every node's log with it.
		name: "skip-dir-fsync", by: "ledger",
		cfg: powerCutAll("bug-skip-dir-fsync", 9606, workload.Config{Kind: workload.Ledger, Concurrency: 8}),
	},
	{
		// Each node drops its newest entry on restart. The entry lost
		// everywhere is an acknowledged one when the cluster is idle at
		// the cut; under a closed loop the newest entries are always in
		// flight, their outcome unknown. The quiet spell before each cut
		// (tidal-chaos's default, 300 ms) holds new ops so the newest
		// entries are acknowledged ones, at the default load: 8
		// closed-loop clients (before quiet spells existed, this spec
		// needed a slow steady writer, 2 clients at 20 ops/s).
		name: "drop-last-record-on-recovery", by: "ledger",
		// Each cut needs the cluster back up and written to since the
		// last one (else the newest entry is the new leader's empty
		// one): faults held 1 s, ~5 s apart.
		cfg: func() runner.Config {
			c := powerCutAll("bug-drop-last-record-on-recovery", 9707, workload.Config{Kind: workload.Ledger, Concurrency: 8})
			c.Duration, c.Interval, c.FaultDuration = runner.Duration(18*time.Second), runner.Duration(5*time.Second), runner.Duration(time.Second)
			c.QuietBeforeCut = runner.DefaultQuietBeforeCut
			return c
		}(),
	},
	{
		// Every fsync on one node fails until the heal: the node must
		// fence (exit 4); with the defect it keeps acknowledging the
		// writes the round-robin workload sends it.
		name: "ignore-fsync-error", by: "fencing",
		cfg: runner.Config{Test: "bug-ignore-fsync-error", Nodes: 3, Seed: 9808, Duration: runner.Duration(14 * time.Second),
			Nemesis: []string{"fsync-error"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8}},
	},
}

var _ = Describe("planted WAL defects are caught under disk faults", Label("disk", "faultfs"), func() {
	BeforeEach(func() {
		if err := nemesis.DiskSupport(); err != nil {
			Skip("the disk defects need faultfs (FUSE): " + err.Error())
		}
	})

	for _, dd := range diskDefects {
		It(dd.name+": caught by "+dd.by, func(ctx SpecContext) {
			cfg := dd.cfg
			cfg.Seed += seedOffset()
			o, s, warned := dd.run(ctx, buggyServer, cfg)
			Expect(warned).To(BeTrue(), "every node should log %q", warning)
			expectCaught(o, s, dd.by)
		}, SpecTimeout(5*time.Minute)) // a damaged node can hold the final convergence wait (1 min) and the audits up

		It(dd.name+": the normal build is valid under the same run", func(ctx SpecContext) {
			cfg := dd.cfg
			cfg.Seed += seedOffset()
			cfg.Test += "-normal"
			o, s, warned := dd.run(ctx, normalBins.TidalServer, cfg)
			Expect(warned).To(BeFalse(), "a normal build should not log %q", warning)
			Expect(ackedWrites(o)).To(BeNumerically(">", 0), "expected acknowledged writes in the history\n%s", s)
			Expect(o.Results.Valid).To(Equal(checker.Valid), "the normal build should pass the run that catches %s\n%s", dd.name, s)
		}, SpecTimeout(3*time.Minute))
	}
})
