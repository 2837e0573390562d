package chaos

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
	"github.com/tidaldb/tidal/suites/fixture"
)

// storeRoot is where chaos runs leave their stores: store/chaos-suite/
// under the repository, kept for failed specs (the path is printed).
func storeRoot() string {
	root, err := fixture.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	return filepath.Join(root, "store", "chaos-suite")
}

// chaosRun runs one test and expects no checker to find an anomaly. A
// verdict of "unknown" fails too unless allowUnknown names the checkers
// that may be unknown (e.g. lag when a fault keeps a node down to the end).
func chaosRun(ctx context.Context, cfg runner.Config) (*runner.Outcome, string) {
	cfg.ServerBin = bins.TidalServer
	cfg.Store = storeRoot()
	if cfg.Duration == 0 {
		cfg.Duration = runner.Duration(25 * time.Second)
	}
	cfg.ServerFlags = append(cfg.ServerFlags, fixture.FastFlags...)
	var out bytes.Buffer
	o, err := runner.Run(ctx, cfg, runner.Options{Progress: GinkgoWriter})
	Expect(err).NotTo(HaveOccurred())
	report.Summary(&out, o.Results, o.Run)
	GinkgoWriter.Println(out.String())
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			GinkgoWriter.Printf("run store (history, results, report.html, node logs): %s\n", o.Run.Dir())
		} else {
			os.RemoveAll(filepath.Join(o.Run.Dir(), "nodes"))
		}
	})
	return o, out.String()
}

func expectValid(o *runner.Outcome, summary string, mayBeUnknown ...string) {
	for _, r := range o.Results.Results {
		if r.Valid == checker.Valid {
			continue
		}
		allowed := false
		for _, name := range mayBeUnknown {
			allowed = allowed || (r.Valid == checker.Unknown && r.Name == name)
		}
		Expect(allowed).To(BeTrue(), "checker %s: %s\n%s", r.Name, r.Summary, summary)
	}
}

var _ = Describe("under faults, no acknowledged write is lost or applied twice", func() {
	It("survives partitions of every shape (ledger writes)", func(ctx SpecContext) {
		o, s := chaosRun(ctx, runner.Config{Test: "partitions", Nodes: 3, Seed: 101,
			Nemesis: []string{"partition"}, Interval: runner.Duration(6 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 12}})
		expectValid(o, s)
	}, SpecTimeout(4*time.Minute))

	It("survives kills and restarts of leaders and followers (ledger writes)", func(ctx SpecContext) {
		o, s := chaosRun(ctx, runner.Config{Test: "kills", Nodes: 3, Seed: 202,
			Nemesis: []string{"kill", "restart"}, Interval: runner.Duration(6 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 12}})
		expectValid(o, s)
	}, SpecTimeout(4*time.Minute))

	It("keeps counters linearizable through pauses and leader transfers", func(ctx SpecContext) {
		o, s := chaosRun(ctx, runner.Config{Test: "pauses-linearizable", Nodes: 3, Seed: 303,
			Nemesis: []string{"pause", "transfer"}, Interval: runner.Duration(6 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
			Workload: workload.Config{Kind: workload.Counter, Concurrency: 8}})
		expectValid(o, s)
		names := map[string]bool{}
		for _, r := range o.Results.Results {
			names[r.Name] = true
		}
		Expect(names).To(HaveKey("linearizable"))
		Expect(names).To(HaveKey("counter"))
	}, SpecTimeout(4*time.Minute))

	It("survives membership churn and slow links (mixed workload)", func(ctx SpecContext) {
		o, s := chaosRun(ctx, runner.Config{Test: "membership-slow", Nodes: 3, Seed: 404,
			Nemesis: []string{"member-churn", "slow"}, Interval: runner.Duration(7 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
			Workload: workload.Config{Kind: workload.Mixed, Concurrency: 8, Dim: 1536}})
		expectValid(o, s)
	}, SpecTimeout(4*time.Minute))

	It("survives every fault kind on 5 nodes (ledger writes)", func(ctx SpecContext) {
		o, s := chaosRun(ctx, runner.Config{Test: "five-nodes-all", Nodes: 5, Seed: 505,
			Nemesis: []string{"all"}, Interval: runner.Duration(5 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
			Duration: runner.Duration(30 * time.Second), Workload: workload.Config{Kind: workload.Ledger, Concurrency: 16}})
		expectValid(o, s)
	}, SpecTimeout(5*time.Minute))

	It("re-analyzes a stored run to the same verdict", func(ctx SpecContext) {
		o, s := chaosRun(ctx, runner.Config{Test: "reanalyze", Nodes: 3, Seed: 606, Duration: runner.Duration(10 * time.Second),
			Nemesis: []string{"isolate-leader"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8}})
		expectValid(o, s)
		run, err := report.OpenRun(o.Run.Dir())
		Expect(err).NotTo(HaveOccurred())
		var cfg runner.Config
		Expect(run.ReadConfig(&cfg)).To(Succeed())
		again, err := runner.Analyze(run, cfg)
		Expect(err).NotTo(HaveOccurred())
		Expect(again.Valid).To(Equal(o.Results.Valid))
		Expect(len(again.Results)).To(Equal(len(o.Results.Results)))
	}, SpecTimeout(3*time.Minute))
})
