package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/nemesis"
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
func chaosRun(ctx context.Context, cfg runner.Config, opts ...func(*runner.Options)) (*runner.Outcome, string) {
	cfg.ServerBin = bins.TidalServer
	cfg.Store = storeRoot()
	if cfg.Duration == 0 {
		cfg.Duration = runner.Duration(25 * time.Second)
	}
	cfg.ServerFlags = append(cfg.ServerFlags, fixture.FastFlags...)
	var out bytes.Buffer
	options := runner.Options{Progress: GinkgoWriter}
	for _, o := range opts {
		o(&options)
	}
	o, err := runner.Run(ctx, cfg, options)
	Expect(err).NotTo(HaveOccurred())
	report.Summary(&out, o.Results, o.Run)
	GinkgoWriter.Println(out.String())
	if !cfg.Insecure {
		// Every chaos run is on the secured plane.
		Expect(startLinesSecured(o.Run.NodesDir(), cfg.Nodes)).To(Succeed(), "run store: %s", o.Run.Dir())
	}
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
	problems := verdictProblems(o, mayBeUnknown...)
	Expect(problems).To(BeEmpty(), "%s", summary)
}

// verdictProblems lists the checkers that keep a run from passing: any
// that is not true, unless it is unknown and named in mayBeUnknown.
func verdictProblems(o *runner.Outcome, mayBeUnknown ...string) []string {
	var problems []string
	for _, r := range o.Results.Results {
		if r.Valid == checker.Valid || r.Valid == checker.Unknown && slices.Contains(mayBeUnknown, r.Name) {
			continue
		}
		problems = append(problems, fmt.Sprintf("checker %s: %s: %s", r.Name, r.Valid, r.Summary))
	}
	if len(o.Results.Results) == 0 {
		problems = append(problems, "no checker ran")
	}
	return problems
}

// resultNamed returns the run's result of checker name.
func resultNamed(o *runner.Outcome, name string) checker.Result {
	for _, r := range o.Results.Results {
		if r.Name == name {
			return r
		}
	}
	Fail(fmt.Sprintf("no %s checker among the results of %s", name, o.Run.Dir()))
	return checker.Result{}
}

// expectFaultsHappened checks, per fault kind the run's schedule asked
// for, that at least one fault of it took effect and was healed: a run
// whose faults never happened proves nothing about surviving them.
func expectFaultsHappened(o *runner.Outcome) {
	var schedule nemesis.Schedule
	Expect(o.Run.ReadSchedule(&schedule)).To(Succeed())
	Expect(schedule.Steps).NotTo(BeEmpty(), "the run scheduled no fault")
	r := resultNamed(o, "faults")
	d, ok := r.Details.(checker.FaultsDetails)
	Expect(ok).To(BeTrue(), "faults details are %T", r.Details)
	happened := map[string]checker.FaultKindOutcome{}
	for _, k := range d.Kinds {
		happened[k.Name] = k
	}
	for _, kind := range schedule.Kinds() {
		Expect(happened).To(HaveKey(kind))
		k := happened[kind]
		Expect(k.TookEffect).To(BeNumerically(">=", 1), "%s never took effect: %+v", kind, k)
		Expect(k.Healed).To(BeNumerically(">=", 1), "%s never healed: %+v", kind, k)
	}
}

// scenario is one chaos run the suite makes: a fault family against a
// workload on a cluster size.
type scenario struct {
	name     string
	nodes    int
	seed     int64
	nemesis  []string
	workload workload.Kind
	conc     int
	duration time.Duration
}

var scenarios = []scenario{
	{"partitions", 3, 101, []string{"partition"}, workload.Ledger, 12, 25 * time.Second},
	{"kills", 3, 202, []string{"kill"}, workload.Ledger, 12, 25 * time.Second},
	{"pauses", 3, 303, []string{"pause"}, workload.Ledger, 12, 25 * time.Second},
	{"restarts-and-transfers", 3, 404, []string{"restart", "transfer"}, workload.Ledger, 12, 25 * time.Second},
	{"slow-links", 3, 505, []string{"slow"}, workload.Ledger, 12, 25 * time.Second},
	{"membership-churn", 3, 606, []string{"member-churn"}, workload.Ledger, 12, 25 * time.Second},
	{"counter-under-partitions", 3, 707, []string{"partition"}, workload.Counter, 8, 25 * time.Second},
	{"mixed-under-pauses-and-kills", 3, 808, []string{"pause", "kill-one"}, workload.Mixed, 8, 25 * time.Second},
	{"five-nodes-every-fault", 5, 909, []string{"all"}, workload.Ledger, 16, 30 * time.Second},
}

var _ = Describe("under faults, no acknowledged write is lost or applied twice", func() {
	for _, sc := range scenarios {
		It(fmt.Sprintf("%s: %v on %d nodes, %s workload", sc.name, sc.nemesis, sc.nodes, sc.workload), func(ctx SpecContext) {
			o, s := chaosRun(ctx, runner.Config{Test: sc.name, Nodes: sc.nodes, Seed: sc.seed,
				Nemesis: sc.nemesis, Interval: runner.Duration(6 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
				Duration: runner.Duration(sc.duration), Workload: workload.Config{Kind: sc.workload, Concurrency: sc.conc}})
			expectValid(o, s)
			expectFaultsHappened(o)
			if sc.workload == workload.Counter || sc.workload == workload.Mixed {
				names := map[string]bool{}
				for _, r := range o.Results.Results {
					names[r.Name] = true
				}
				Expect(names).To(HaveKey("linearizable"))
				Expect(names).To(HaveKey("counter"))
			}
		}, SpecTimeout(5*time.Minute))
	}

	It("standalone relay: the mesh in a separate tcp-relay process, driven over its control API, carries partitions and kills", func(ctx SpecContext) {
		o, s := chaosRun(ctx, runner.Config{Test: "standalone-relay", Nodes: 3, Seed: 1010, Duration: runner.Duration(12 * time.Second),
			RelayBinary: bins.TCPRelay,
			Nemesis:     []string{"isolate-leader", "kill-one"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8}})
		expectValid(o, s)
		expectFaultsHappened(o)
		// The mesh lived in the relay process, not in this one.
		relayLog, err := os.ReadFile(filepath.Join(o.Run.NodesDir(), "tcp-relay", "tcp-relay.log"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(relayLog)).To(ContainSubstring("mesh created"))
	}, SpecTimeout(3*time.Minute))

	It("smoke: a short run under a leader partition is valid, and re-analyzing its store agrees", Label("smoke"), func(ctx SpecContext) {
		o, s := chaosRun(ctx, runner.Config{Test: "smoke", Nodes: 3, Seed: 606, Duration: runner.Duration(10 * time.Second),
			Nemesis: []string{"isolate-leader"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8}})
		expectValid(o, s)
		expectFaultsHappened(o)
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
