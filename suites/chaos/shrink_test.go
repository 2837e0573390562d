package chaos

import (
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/shrink"
	"github.com/tidaldb/tidal/harness/workload"
	"github.com/tidaldb/tidal/suites/fixture"
)

// shrinkBudget bounds the search of the shrink spec: the original's three
// runs and ddmin fit well inside it on a loaded 2-core machine (a 30s run
// takes about 31s); the shortening passes take what is left.
const shrinkBudget = 10 * time.Minute

var _ = Describe("shrink", func() {
	// A tidalbugs build with ack-before-commit loses the writes an
	// isolated leader acknowledges (docs/planted-bugs.md). A run of nine
	// episodes — isolate-leader among slow links and follower pauses —
	// fails with lost writes; one isolate-leader is enough to lose some,
	// so the shrink must end with at most two episodes that still lose
	// acknowledged writes, in at least 2 of 3 runs of the minimum.
	It("shrinks a failing run of 9 fault episodes to at most 2 that fail the same way", func(ctx SpecContext) {
		buggy, err := fixture.BuildTidalbugs(bins.Dir)
		Expect(err).NotTo(HaveOccurred())
		Expect(os.Setenv("TIDAL_BUGS", "ack-before-commit")).To(Succeed())
		DeferCleanup(os.Unsetenv, "TIDAL_BUGS")

		cfg := runner.Config{
			Test: "shrink-ack-before-commit", Nodes: 3, Seed: 7001, Duration: runner.Duration(30 * time.Second),
			Nemesis:  []string{"isolate-leader", "slow-links", "pause-one"},
			Interval: runner.Duration(3 * time.Second), FaultDuration: runner.Duration(1500 * time.Millisecond),
			Workload:    workload.Config{Kind: workload.Ledger, Concurrency: 8, Rate: 200},
			ServerBin:   buggy,
			Store:       storeRoot(),
			ServerFlags: fixture.FastFlags,
		}
		o, err := runner.Run(ctx, cfg, runner.Options{Progress: GinkgoWriter})
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Printf("original run: %s\n", o.Run.Dir())
		Expect(o.Results.Valid).To(Equal(checker.Invalid), "expected the planted defect to fail the original run")
		var sched nemesis.Schedule
		Expect(o.Run.ReadSchedule(&sched)).To(Succeed())
		Expect(len(sched.Steps)).To(BeNumerically(">=", 8), "expected at least 8 fault episodes in the original")

		st, err := shrink.Open(o.Run.Dir())
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Primary()).To(Equal(shrink.Anomaly{Checker: "ledger", Kind: "acknowledged write lost"}))

		started := time.Now()
		res, err := shrink.Shrink(ctx, st, shrink.Config{Search: shrink.Options{Budget: shrinkBudget}, Confirm: 3}, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		r := res.Report
		AddReportEntry("shrink", res.Dir)
		GinkgoWriter.Printf("shrink: %d -> %d episodes (%s -> %s run) in %s, %d runs of %d candidates, %d cache hits, budget spent %v; minimum failed %d of %d confirm runs\n  minimal: %s\n  replay: tidal-chaos repro %s\n",
			len(r.Original.Episodes), len(r.Minimal.Episodes), r.Original.Duration, r.Minimal.Duration, time.Since(started).Round(time.Second),
			r.Runs, len(r.Trials), r.CacheHits, r.BudgetExhausted, r.ConfirmFailures(), len(r.Confirm), r.Minimal, res.Dir)
		Expect(r.Reproduced).To(BeTrue(), "expected the original schedule to fail again")
		Expect(len(r.Minimal.Episodes)).To(BeNumerically("<=", 2), "minimal schedule: %s", r.Minimal)
		Expect(r.Confirm).To(HaveLen(3))
		Expect(r.ConfirmFailures()).To(BeNumerically(">=", 2), "expected the minimum to lose acknowledged writes in at least 2 of 3 runs: %+v", r.Confirm)
		for _, c := range r.Confirm {
			if c.Same {
				Expect(c.Signature.Has(st.Primary())).To(BeTrue())
			}
		}
		// What tidal-chaos repro replays is the minimum.
		var min nemesis.Schedule
		Expect(readSchedule(filepath.Join(res.Dir, "schedule.json"), &min)).To(Succeed())
		Expect(min.Steps).To(HaveLen(len(r.Minimal.Episodes)))

		DeferCleanup(func() {
			if !CurrentSpecReport().Failed() {
				os.RemoveAll(o.Run.NodesDir())
				for _, c := range r.Confirm {
					os.RemoveAll(filepath.Join(c.Dir, "nodes"))
				}
			}
		})
	}, Label("shrink"), SpecTimeout(30*time.Minute))
})

func readSchedule(path string, s *nemesis.Schedule) error {
	loaded, err := nemesis.LoadSchedule(path)
	*s = loaded
	return err
}
