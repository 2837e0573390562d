package chaos

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
)

// expectJudgedElections checks that the election checker judged the run
// (terms and restarts, not only a verdict) and that the nodes checker
// judged at least minGraceful graceful stops.
func expectJudged(o *runner.Outcome, minGraceful int) {
	e := resultNamed(o, "election")
	ed, ok := e.Details.(checker.ElectionDetails)
	Expect(ok).To(BeTrue(), "election details are %T", e.Details)
	Expect(ed.Terms).To(BeNumerically(">", 0), "election: no term judged: %s", e.Summary)
	Expect(ed.Restarts).To(BeNumerically(">", 0), "election: no restart compared: %s", e.Summary)
	n := resultNamed(o, "nodes")
	nd, ok := n.Details.(checker.NodesDetails)
	Expect(ok).To(BeTrue(), "nodes details are %T", n.Details)
	Expect(nd.GracefulStops).To(BeNumerically(">=", minGraceful), "nodes: graceful stops judged: %s", n.Summary)
}

var _ = Describe("graceful stops and elections", Label("faultfs"), func() {
	BeforeEach(requireFaultFS)

	// SIGTERM paths: every stop must drain and exit 0, every node come
	// back, no acknowledged write be lost (also when the disk is cut the
	// moment the process exits), and no term see two leaders or go down
	// across a restart.
	It("stop, restart-graceful, rolling-restart and stop-then-power-cut on the secured plane: valid, every SIGTERM exit 0", func(ctx SpecContext) {
		mix := []string{"stop", "restart-graceful", "rolling-restart", "stop-then-power-cut"}
		o, s := chaosRun(ctx, runner.Config{Test: "graceful", Nodes: 3, Seed: 3, Nemesis: mix,
			Interval: runner.Duration(5 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
			QuietBeforeCut: runner.DefaultQuietBeforeCut,
			Duration:       runner.Duration(30 * time.Second), Workload: workload.Config{Kind: workload.Ledger, Concurrency: 12}})
		expectValid(o, s)
		expectFaultsHappened(o)
		var schedule nemesis.Schedule
		Expect(o.Run.ReadSchedule(&schedule)).To(Succeed())
		Expect(schedule.Kinds()).To(ConsistOf(mix), "seed 3 must schedule every graceful kind")
		// A rolling restart stops all 3; stop, restart-graceful and
		// stop-then-power-cut one each.
		expectJudged(o, 6)
	}, SpecTimeout(5*time.Minute))

	// A power cut within milliseconds of a vote or a leadership change,
	// among kills and an isolated node.
	It("power-cut-after-election with kills and isolate-one: valid, one leader per term", func(ctx SpecContext) {
		mix := []string{"power-cut-after-election", "kill", "isolate-one"}
		o, s := chaosRun(ctx, runner.Config{Test: "election-cut", Nodes: 3, Seed: 1, Nemesis: mix,
			Interval: runner.Duration(5 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
			QuietBeforeCut: runner.DefaultQuietBeforeCut,
			Duration:       runner.Duration(30 * time.Second), Workload: workload.Config{Kind: workload.Ledger, Concurrency: 12}})
		expectValid(o, s)
		expectFaultsHappened(o)
		expectJudged(o, 0)
	}, SpecTimeout(5*time.Minute))
})
