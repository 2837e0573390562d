package etcd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/db/etcd"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/suites/fixture"
)

func storeRoot() string {
	root, err := fixture.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	return filepath.Join(root, "store", "etcd-suite")
}

// etcdRun runs one test against etcd and expects it to have been carried
// out and judged: no error, a verdict from every checker the workload
// needs, the faults asked for taking effect, and report.html written.
func etcdRun(ctx context.Context, nemesisList []string, e etcd.Config) *runner.Outcome {
	if _, err := etcd.Find(""); err != nil {
		Skip("etcd is not installed and cannot be: " + err.Error())
	}
	cfg := runner.Config{DB: runner.DBEtcd, Etcd: e, Nodes: 3, Store: storeRoot(), Test: "etcd-" + strings.ReplaceAll(CurrentSpecReport().LeafNodeText, " ", "-"),
		Duration: runner.Duration(20 * time.Second), Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
		Nemesis: nemesisList}
	cfg.Workload.Rate, cfg.Workload.Concurrency = 150, 12
	o, err := runner.Run(ctx, cfg, runner.Options{Progress: GinkgoWriter})
	Expect(err).NotTo(HaveOccurred())
	var out bytes.Buffer
	report.Summary(&out, o.Results, o.Run)
	GinkgoWriter.Println(out.String())
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			GinkgoWriter.Printf("run store (history, results, report.html, node logs): %s\n", o.Run.Dir())
		} else {
			os.RemoveAll(o.Run.Dir())
		}
	})
	judged(o, e.Workload, len(nemesisList) > 0, out.String())
	return o
}

// judged expects every checker of the workload to have run and given a
// verdict, and the faults (when any were asked for) to have taken effect.
func judged(o *runner.Outcome, workload string, faults bool, summary string) {
	want := []string{"stats", "nodes", "convergence", "lag", "availability"}
	switch workload {
	case etcd.Append:
		want = append(want, "ledger", "watch")
	default:
		want = append(want, "linearizable", "revision")
	}
	if faults {
		want = append(want, "faults")
	}
	got := map[string]checker.Result{}
	for _, r := range o.Results.Results {
		got[r.Name] = r
	}
	for _, name := range want {
		r, ok := got[name]
		Expect(ok).To(BeTrue(), "checker %s did not run:\n%s", name, summary)
		Expect([]checker.Validity{checker.Valid, checker.Invalid, checker.Unknown}).To(ContainElement(r.Valid), "checker %s", name)
		Expect(r.Summary).NotTo(BeEmpty(), "checker %s gave no summary", name)
	}
	if faults {
		Expect(got["faults"].Valid).To(Equal(checker.Valid), "the faults asked for must take effect:\n%s", summary)
	}
	Expect(got["nodes"].Valid).To(Equal(checker.Valid), "every etcd node must be running and serving after the heal:\n%s", summary)
	// The lag checker judged etcd's own status samples (Observe), not an
	// empty file.
	lag, ok := got["lag"].Details.(checker.LagDetails)
	Expect(ok && len(lag.Followers) > 0).To(BeTrue(), "the lag checker must have judged etcd's followers from status samples:\n%s", summary)
	Expect(filepath.Join(o.Run.Dir(), "report.html")).To(BeAnExistingFile())
	ops, err := o.Run.ReadHistory()
	Expect(err).NotTo(HaveOccurred())
	oks := 0
	for _, op := range ops {
		if op.Process.IsClient() && op.Type == history.OK {
			oks++
		}
	}
	Expect(oks).To(BeNumerically(">", 50), "the workload must have made progress:\n%s", summary)
}

var _ = Describe("etcd under faults", func() {
	register := etcd.Config{Workload: etcd.Register}
	appendSet := etcd.Config{Workload: etcd.Append}

	It("runs and judges the register workload without faults", Label("smoke"), func(ctx SpecContext) {
		etcdRun(ctx, nil, register)
	}, SpecTimeout(3*time.Minute))

	It("partitions", func(ctx SpecContext) {
		etcdRun(ctx, []string{"partition"}, register)
	}, SpecTimeout(3*time.Minute))

	It("kills", func(ctx SpecContext) {
		etcdRun(ctx, []string{"kill"}, appendSet)
	}, SpecTimeout(3*time.Minute))

	It("pauses", func(ctx SpecContext) {
		etcdRun(ctx, []string{"pause"}, register)
	}, SpecTimeout(3*time.Minute))

	It("restarts", func(ctx SpecContext) {
		etcdRun(ctx, []string{"restart"}, appendSet)
	}, SpecTimeout(3*time.Minute))

	It("transfers leadership", func(ctx SpecContext) {
		etcdRun(ctx, []string{"transfer"}, register)
	}, SpecTimeout(3*time.Minute))

	It("churns membership through the member API", func(ctx SpecContext) {
		etcdRun(ctx, []string{"membership"}, appendSet)
	}, SpecTimeout(3*time.Minute))

	It("slows links", func(ctx SpecContext) {
		etcdRun(ctx, []string{"slow"}, register)
	}, SpecTimeout(3*time.Minute))

	It("reads serializably, checking the writes only", func(ctx SpecContext) {
		o := etcdRun(ctx, []string{"partition"}, etcd.Config{Workload: etcd.Register, Reads: etcd.Serializable})
		for _, r := range o.Results.Results {
			if r.Name == "linearizable" {
				Expect(r.Summary).To(Or(ContainSubstring("serializable reads left out"), ContainSubstring("not linearizable")))
			}
		}
	}, SpecTimeout(3*time.Minute))

	It("says false of a stored etcd run once a stale read is planted in it", func(ctx SpecContext) {
		o := etcdRun(ctx, nil, register)
		// Plant: the last ok get reads a value no put or cas ever wrote.
		ops, err := o.Run.ReadHistory()
		Expect(err).NotTo(HaveOccurred())
		planted := false
		for i := len(ops) - 1; i >= 0 && !planted; i-- {
			if ops[i].F == etcd.FGet && ops[i].Type == history.OK {
				v, err := history.Decode[etcd.RegisterValue](ops[i])
				Expect(err).NotTo(HaveOccurred())
				v.Value = -7 // every written value is positive
				ops[i].Value = mustJSON(v)
				planted = true
			}
		}
		Expect(planted).To(BeTrue())
		Expect(rewriteHistory(o.Run, ops)).To(Succeed())
		var cfg runner.Config
		Expect(o.Run.ReadConfig(&cfg)).To(Succeed())
		res, err := runner.Analyze(o.Run, cfg)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Valid).To(Equal(checker.Invalid), "the planted read must make the run invalid")
	}, SpecTimeout(3*time.Minute))
	It("pauses whoever leads past elections, its clients bound to members", func(ctx SpecContext) {
		etcdRun(ctx, []string{"pause-leader-burst"}, etcd.Config{Workload: etcd.Register, Select: etcd.Bound,
			OpTimeout: etcd.Duration(time.Second), Flags: []string{"--election-timeout=500", "--heartbeat-interval=50"}})
	}, SpecTimeout(3*time.Minute))

	It("sends every op to the leader", func(ctx SpecContext) {
		etcdRun(ctx, []string{"pause-leader", "transfer-leader"}, etcd.Config{Workload: etcd.Register, Select: etcd.Leader, OpTimeout: etcd.Duration(2 * time.Second)})
	}, SpecTimeout(3*time.Minute))

	// Power cuts are left to campaigns: under faultfs every cut member has
	// so far lost its member directory (docs/findings.md), and two cuts
	// leave the cluster without a quorum for the rest of the run.
	// Regression: etcd refused to start on faultfs — bbolt maps its db
	// file, and a direct-I/O FUSE file could not be mapped ("failed to
	// open database ... no such device"), so the cluster never came up.
	It("Regression: etcd cannot start on faultfs; fails etcd's fsyncs (faultfs under its data dirs)", func(ctx SpecContext) {
		if _, err := etcd.Find(""); err != nil {
			Skip("etcd is not installed and cannot be: " + err.Error())
		}
		cfg := runner.Config{DB: runner.DBEtcd, Etcd: etcd.Config{Workload: etcd.Register, Select: etcd.Bound}, Nodes: 3, Store: storeRoot(),
			Test: "etcd-fsync-error", Duration: runner.Duration(20 * time.Second), Interval: runner.Duration(5 * time.Second),
			FaultDuration: runner.Duration(3 * time.Second), Nemesis: []string{"fsync-error"}}
		o, err := runner.Run(ctx, cfg, runner.Options{Progress: GinkgoWriter})
		if err != nil && strings.Contains(err.Error(), "faultfs") {
			Skip("faultfs cannot mount here: " + err.Error())
		}
		Expect(err).NotTo(HaveOccurred())
		var out bytes.Buffer
		report.Summary(&out, o.Results, o.Run)
		GinkgoWriter.Println(out.String())
		// Whether etcd survives is what the run finds (docs/findings.md);
		// the spec asks that the faults took effect and were judged.
		got := map[string]checker.Result{}
		for _, r := range o.Results.Results {
			got[r.Name] = r
		}
		Expect(got["faults"].Valid).To(Equal(checker.Valid), "the fsync errors must take effect:\n%s", out.String())
		for _, name := range []string{"nodes", "linearizable", "revision", "convergence", "fencing"} {
			Expect(got).To(HaveKey(name), "checker %s did not run:\n%s", name, out.String())
		}
		Expect(filepath.Join(o.Run.Dir(), "nodes", "n1", "faultfs.json")).To(BeAnExistingFile())
	}, SpecTimeout(3*time.Minute))

	It("says false of a stored etcd run once a read is answered at an old revision", func(ctx SpecContext) {
		o := etcdRun(ctx, nil, register)
		// Plant: the last ok get answers at revision 1, below every write
		// acknowledged before it; its value is left as it was, so only the
		// revision gives it away.
		ops, err := o.Run.ReadHistory()
		Expect(err).NotTo(HaveOccurred())
		planted := false
		for i := len(ops) - 1; i >= 0 && !planted; i-- {
			if ops[i].F == etcd.FGet && ops[i].Type == history.OK && ops[i].Seq > 1 {
				ops[i].Seq = 1
				planted = true
			}
		}
		Expect(planted).To(BeTrue())
		Expect(rewriteHistory(o.Run, ops)).To(Succeed())
		var cfg runner.Config
		Expect(o.Run.ReadConfig(&cfg)).To(Succeed())
		res, err := runner.Analyze(o.Run, cfg)
		Expect(err).NotTo(HaveOccurred())
		for _, r := range res.Results {
			if r.Name == "revision" {
				Expect(r.Valid).To(Equal(checker.Invalid), "the read at revision 1 must make the revision checker say false: %s", r.Summary)
				return
			}
		}
		Fail("the revision checker did not run")
	}, SpecTimeout(3*time.Minute))

	It("says false of a stored etcd run once its clients are no longer served", func(ctx SpecContext) {
		o := etcdRun(ctx, nil, register)
		// Plant: from 5 s into the workload on, no client op succeeds
		// (every ok becomes fail), with no fault to excuse it: a stall of
		// the rest of the run, over the 10 s bound.
		ops, err := o.Run.ReadHistory()
		Expect(err).NotTo(HaveOccurred())
		from := int64(-1)
		failed := 0
		for i := range ops {
			if !ops[i].Process.IsClient() {
				continue
			}
			if from < 0 {
				from = ops[i].Time + int64(5*time.Second)
			}
			if ops[i].Time >= from && ops[i].Type == history.OK {
				ops[i].Type = history.Fail
				failed++
			}
		}
		Expect(failed).To(BeNumerically(">", 0))
		Expect(rewriteHistory(o.Run, ops)).To(Succeed())
		var cfg runner.Config
		Expect(o.Run.ReadConfig(&cfg)).To(Succeed())
		res, err := runner.Analyze(o.Run, cfg)
		Expect(err).NotTo(HaveOccurred())
		found := false
		for _, r := range res.Results {
			if r.Name == "availability" {
				found = true
				Expect(r.Valid).To(Equal(checker.Invalid), "the planted stall must be an availability anomaly: %s", r.Summary)
				Expect(r.Summary).To(ContainSubstring("before any fault, over the stall bound"))
			}
		}
		Expect(found).To(BeTrue(), "the availability checker must run on etcd runs")
		Expect(res.Valid).To(Equal(checker.Invalid))
	}, SpecTimeout(3*time.Minute))

	It("says false of a stored etcd append run once a watch event is dropped from it", func(ctx SpecContext) {
		o := etcdRun(ctx, nil, appendSet)
		path := filepath.Join(o.Run.NodeDir("n1"), etcd.WatchFile)
		body, err := os.ReadFile(path)
		Expect(err).NotTo(HaveOccurred())
		lines := strings.SplitAfter(string(body), "\n")
		dropped := false
		for i := len(lines) / 2; i < len(lines) && !dropped; i++ {
			if strings.Contains(lines[i], `"key"`) {
				lines = append(lines[:i], lines[i+1:]...)
				dropped = true
			}
		}
		Expect(dropped).To(BeTrue())
		Expect(os.WriteFile(path, []byte(strings.Join(lines, "")), 0o644)).To(Succeed())
		var cfg runner.Config
		Expect(o.Run.ReadConfig(&cfg)).To(Succeed())
		res, err := runner.Analyze(o.Run, cfg)
		Expect(err).NotTo(HaveOccurred())
		for _, r := range res.Results {
			if r.Name == "watch" {
				Expect(r.Valid).To(Equal(checker.Invalid), "the dropped event must be a watch anomaly: %s", r.Summary)
			}
		}
		Expect(res.Valid).To(Equal(checker.Invalid))
	}, SpecTimeout(3*time.Minute))
})
