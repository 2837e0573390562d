package chaos

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
)

// Clock faults, one scenario per kind on 3 nodes. The
// counter workload's aggregates are judged against offsets the history
// records; the clock checker judges that a node beyond --max-clock-skew
// acked no write while shifted. Seed 1104 draws clock-skew both beyond
// (n2 +3m) and within (n1 -20s, n3 +20s, n1 +20s) the bound; every
// clock-jump is beyond it (±2h).
var _ = Describe("under clock faults, no node stamps writes with a clock beyond the bound", func() {
	for _, sc := range []scenario{
		{"clock-skew", 3, 1104, []string{"clock-skew"}, workload.Counter, 8, 30 * time.Second},
		{"clock-jump", 3, 1201, []string{"clock-jump"}, workload.Mixed, 8, 25 * time.Second},
	} {
		It(fmt.Sprintf("%s: %v on %d nodes, %s workload", sc.name, sc.nemesis, sc.nodes, sc.workload), func(ctx SpecContext) {
			o, s := chaosRun(ctx, runner.Config{Test: sc.name, Nodes: sc.nodes, Seed: sc.seed,
				Nemesis: sc.nemesis, Interval: runner.Duration(6 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
				Duration: runner.Duration(sc.duration), Workload: workload.Config{Kind: sc.workload, Concurrency: sc.conc}})
			expectValid(o, s)
			expectFaultsHappened(o)
			clock := resultNamed(o, "clock")
			d, ok := clock.Details.(checker.ClockDetails)
			Expect(ok).To(BeTrue(), "clock details are %T", clock.Details)
			Expect(d.Judged).To(BeNumerically(">=", 1), "no shift beyond the bound was judged: %s", clock.Summary)
			Expect(resultNamed(o, "aggregates").Valid).To(Equal(checker.Valid))
		}, SpecTimeout(5*time.Minute))
	}
})
