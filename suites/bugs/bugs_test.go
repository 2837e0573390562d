package bugs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
	"github.com/tidaldb/tidal/suites/fixture"
)

// envVar is the switch of a tidalbugs build (tidal-server/bugs). The
// suite sets it in its own environment for the length of one run: every
// node the process backend starts inherits it.
const envVar = "TIDAL_BUGS"

// warning is what a tidalbugs node logs at start when a defect is on.
const warning = "PLANTED DEFECTS ACTIVE"

func storeRoot() string {
	root, err := fixture.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	return filepath.Join(root, "store", "bugs-suite")
}

// plantedRun runs one chaos test against server with TIDAL_BUGS=defects
// and returns the outcome, its terminal summary, and whether every node's
// log carries the planted-defects warning. The store path is printed
// always: for a caught bug it is the evidence.
// with, if given, adjusts the run's options (the disk specs' nemesis
// wrapper and schedule).
func plantedRun(ctx context.Context, server, defects string, cfg runner.Config, with ...func(*runner.Options)) (*runner.Outcome, string, bool) {
	Expect(os.Setenv(envVar, defects)).To(Succeed())
	DeferCleanup(os.Unsetenv, envVar)
	cfg.ServerBin = server
	cfg.Store = storeRoot()
	cfg.ServerFlags = append(cfg.ServerFlags, fixture.FastFlags...)
	opts := runner.Options{Progress: GinkgoWriter}
	for _, w := range with {
		w(&opts)
	}
	o, err := runner.Run(ctx, cfg, opts)
	Expect(err).NotTo(HaveOccurred())
	var out bytes.Buffer
	report.Summary(&out, o.Results, o.Run)
	GinkgoWriter.Println(out.String())
	AddReportEntry("run store", o.Run.Dir())
	GinkgoWriter.Printf("run store (history, results, report.html): %s\n", o.Run.Dir())

	warned := true
	for i := 1; i <= cfg.Nodes; i++ {
		log, err := os.ReadFile(filepath.Join(o.Run.NodesDir(), fmt.Sprintf("n%d", i), "node.log"))
		Expect(err).NotTo(HaveOccurred())
		warned = warned && bytes.Contains(log, []byte(warning))
	}
	DeferCleanup(func() {
		if !CurrentSpecReport().Failed() {
			os.RemoveAll(o.Run.NodesDir()) // data dirs; results and history stay
		}
	})
	return o, out.String(), warned
}

// ackedWrites counts the writes the run's history records as
// acknowledged.
func ackedWrites(o *runner.Outcome) int {
	ops, err := o.Run.ReadHistory()
	Expect(err).NotTo(HaveOccurred())
	n := 0
	for _, op := range ops {
		if op.Type == history.OK && op.F == history.FWrite {
			n++
		}
	}
	return n
}

// expectCaught asserts the composed verdict is invalid and that the
// checker named by by is among those that said false.
func expectCaught(o *runner.Outcome, summary, by string) {
	Expect(o.Results.Valid).To(Equal(checker.Invalid), "expected the harness to catch the planted defect, found verdict %s\n%s", o.Results.Valid, summary)
	var caught []string
	for _, r := range o.Results.Results {
		if r.Valid == checker.Invalid {
			caught = append(caught, r.Name)
		}
	}
	Expect(caught).To(ContainElement(by), "expected checker %s to say false; false: %v\n%s", by, caught, summary)
	GinkgoWriter.Printf("caught by: %v\n", caught)
}

var _ = Describe("planted defects are caught by the chaos checkers", Ordered, func() {
	// Label smoke: `make test` runs this one, so CI
	// always sees a checker say false on a real run. It is the quickest
	// of the planted defects to catch.
	It("ack-before-commit: an isolated leader's acks that never commit are lost writes (ledger)", Label("smoke"), func(ctx SpecContext) {
		o, s, warned := plantedRun(ctx, buggyServer, "ack-before-commit", runner.Config{
			Test: "bug-ack-before-commit", Nodes: 3, Seed: 9101, Duration: runner.Duration(16 * time.Second),
			Nemesis: []string{"isolate-leader"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			// An ack that waits for nothing is instant: bound the rate so
			// the history stays small.
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8, Rate: 200},
		})
		Expect(warned).To(BeTrue(), "every node should log %q", warning)
		expectCaught(o, s, "ledger")
	}, SpecTimeout(3*time.Minute))

	It("apply-twice-after-restart: entries replayed twice make the restarted node diverge (convergence)", func(ctx SpecContext) {
		o, s, warned := plantedRun(ctx, buggyServer, "apply-twice-after-restart", runner.Config{
			Test: "bug-apply-twice-after-restart", Nodes: 3, Seed: 9202, Duration: runner.Duration(16 * time.Second),
			Nemesis: []string{"restart-one"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8},
		})
		Expect(warned).To(BeTrue(), "every node should log %q", warning)
		expectCaught(o, s, "convergence")
	}, SpecTimeout(3*time.Minute))

	It("local-linearizable-reads: an isolated node serves stale counters (counter)", func(ctx SpecContext) {
		o, s, warned := plantedRun(ctx, buggyServer, "local-linearizable-reads", runner.Config{
			Test: "bug-local-linearizable-reads", Nodes: 3, Seed: 9303, Duration: runner.Duration(16 * time.Second),
			Nemesis: []string{"isolate-leader", "partition-halves"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Counter, Concurrency: 8},
		})
		Expect(warned).To(BeTrue(), "every node should log %q", warning)
		expectCaught(o, s, "counter")
	}, SpecTimeout(3*time.Minute))

	It("drop-dedup-on-restart: retried writes fold again on a restarted node (convergence)", func(ctx SpecContext) {
		// The default workload rarely retries an id that was already
		// applied. Attempts that time out after 40 ms (the server goes on
		// and commits them) are retried with the same ids, so the log
		// holds retries of applied ids throughout the run, before and
		// after each restart.
		o, s, warned := plantedRun(ctx, buggyServer, "drop-dedup-on-restart", runner.Config{
			Test: "bug-drop-dedup-on-restart", Nodes: 3, Seed: 9404, Duration: runner.Duration(16 * time.Second),
			Nemesis: []string{"restart-one"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8, Timeout: 40 * time.Millisecond, Attempts: 3},
		})
		Expect(warned).To(BeTrue(), "every node should log %q", warning)
		expectCaught(o, s, "convergence")
	}, SpecTimeout(3*time.Minute))

	It("a normal build ignores TIDAL_BUGS: no switch in the binary, no warning, a valid run", func(ctx SpecContext) {
		normal, err := os.ReadFile(normalBins.TidalServer)
		Expect(err).NotTo(HaveOccurred())
		buggy, err := os.ReadFile(buggyServer)
		Expect(err).NotTo(HaveOccurred())
		// The WAL's defects too, and the message only
		// ignore-fsync-error logs.
		for _, s := range []string{envVar, "ack-before-commit", "drop-dedup-on-restart",
			"ack-before-fsync", "skip-dir-fsync", "drop-last-record-on-recovery", "ignore-fsync-error", "fdatasync failed; carrying on", "never-fsync",
			// and the embeddings and aggregates checkers'.
			"drop-vectors-in-snapshot", "window-off-by-one-bucket", "decay-wrong-half-life", "ignore-embedding-overwrite",
			// and the election and responses checkers'.
			"vote-before-sync", "internal-error-on-valid-write", "valid write refused without proposing it",
			// and the graceful faults'.
			"drain-ack-before-fsync", "answering every write as applied without waiting",
			// and the hidden flag that makes a node stand for a newer
			// release, with the hooks it calls.
			"test-newer-format", "acting as a newer release", "SetTestNewerFormat", "SetTestNewerEntryFormat", "SetTestNewerProtocol"} {
			Expect(bytes.Contains(normal, []byte(s))).To(BeFalse(), "the normal tidal-server binary should not contain %q", s)
			Expect(bytes.Contains(buggy, []byte(s))).To(BeTrue(), "the tidalbugs binary should contain %q (else this check proves nothing)", s)
		}

		// A misspelt defect stops a tidalbugs node, so a typo cannot pass
		// for a caught bug.
		cmd := exec.CommandContext(ctx, buggyServer, "run", "--data-dir", GinkgoT().TempDir(), "--client-addr", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), envVar+"=ack-before-comit")
		msg, err := cmd.CombinedOutput()
		Expect(err).To(HaveOccurred(), "a tidalbugs node with an unknown defect should refuse to start:\n%s", msg)
		Expect(string(msg)).To(ContainSubstring(`unknown defect "ack-before-comit"`))

		o, s, warned := plantedRun(ctx, normalBins.TidalServer, "ack-before-commit,apply-twice-after-restart,local-linearizable-reads,drop-dedup-on-restart,internal-error-on-valid-write", runner.Config{
			Test: "bug-normal-build-ignores-switch", Nodes: 3, Seed: 9101, Duration: runner.Duration(12 * time.Second),
			Nemesis: []string{"isolate-leader"}, Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8, Rate: 200},
		})
		Expect(warned).To(BeFalse(), "a normal build should not log %q", warning)
		// Regression: a valid verdict over no
		// acknowledged writes would say nothing about the build.
		Expect(ackedWrites(o)).To(BeNumerically(">", 0), "expected acknowledged writes in the history\n%s", s)
		Expect(o.Results.Valid).To(Equal(checker.Valid), "a normal build with TIDAL_BUGS set should stay correct\n%s", s)
	}, SpecTimeout(3*time.Minute))
})
