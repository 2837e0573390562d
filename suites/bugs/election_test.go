package bugs

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
)

// voteBeforeSyncRun is the run that catches vote-before-sync: power cuts
// within milliseconds of a node's vote or leadership, often, for 30 s.
func voteBeforeSyncRun(test string) runner.Config {
	return runner.Config{Test: test, Nodes: 3, Seed: 9701, Duration: runner.Duration(30 * time.Second),
		Nemesis: []string{"power-cut-after-election"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
		QuietBeforeCut: runner.DefaultQuietBeforeCut,
		Workload:       workload.Config{Kind: workload.Ledger, Concurrency: 8}}
}

var _ = Describe("a vote answered before it is durable is caught by the election checker", Label("disk", "faultfs"), func() {
	BeforeEach(func() {
		if err := nemesis.DiskSupport(); err != nil {
			Skip("power-cut-after-election needs faultfs (FUSE): " + err.Error())
		}
	})

	It("vote-before-sync: a node cut right after its vote or leadership comes back below that term (election)", func(ctx SpecContext) {
		cfg := voteBeforeSyncRun("bug-vote-before-sync")
		cfg.Seed += seedOffset()
		o, s, warned := plantedRun(ctx, buggyServer, "vote-before-sync", cfg)
		Expect(warned).To(BeTrue(), "every node should log %q", warning)
		expectCaught(o, s, "election")
	}, SpecTimeout(5*time.Minute))

	It("vote-before-sync: the normal build is valid under the same run, the election checker having judged restarts", func(ctx SpecContext) {
		cfg := voteBeforeSyncRun("bug-vote-before-sync-normal")
		cfg.Seed += seedOffset()
		o, s, warned := plantedRun(ctx, normalBins.TidalServer, "vote-before-sync", cfg)
		Expect(warned).To(BeFalse(), "a normal build should not log %q", warning)
		Expect(o.Results.Valid).To(Equal(checker.Valid), "the normal build should pass the run that catches vote-before-sync\n%s", s)
		var e checker.Result
		for _, r := range o.Results.Results {
			if r.Name == "election" {
				e = r
			}
		}
		d, ok := e.Details.(checker.ElectionDetails)
		Expect(ok).To(BeTrue(), "election details are %T", e.Details)
		Expect(d.LogStarts).To(BeNumerically(">", 3), "election: expected restarts judged from the logs: %s", e.Summary)
	}, SpecTimeout(5*time.Minute))
})
