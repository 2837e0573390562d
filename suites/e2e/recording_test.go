package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/workload"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// targets is the deployment as the workload sees it: every service at
// its published port, over TLS as the admin.
type targets struct{ d *deployment }

func (t targets) Names() []string { return t.d.names }

func (t targets) Client(name string, opts ...client.Option) *client.Client {
	return t.d.client(name, opts...)
}

func (t targets) Leader(ctx context.Context) string {
	l, _ := t.d.leader(ctx)
	return l
}

// recording is a workload running against the deployment, every op in
// dir/history.jsonl.
type recording struct {
	d    *deployment
	rec  *history.Recorder
	w    *workload.Workload
	path string

	cancel context.CancelFunc
	done   chan struct{}
	err    error
	once   sync.Once
}

// record starts cfg's workload in the background (cfg.Duration 0: until
// Stop).
func (d *deployment) record(cfg workload.Config) *recording {
	r := &recording{d: d, path: filepath.Join(d.dir, "history.jsonl"), done: make(chan struct{})}
	var err error
	r.rec, err = history.Create(r.path)
	Expect(err).NotTo(HaveOccurred())
	if cfg.IDPrefix == "" {
		cfg.IDPrefix = "e2e-"
	}
	r.w, err = workload.New(cfg, targets{d}, r.rec)
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		r.err = r.w.Run(ctx)
	}()
	DeferCleanup(r.Stop)
	return r
}

// Now is the current history time.
func (r *recording) Now() int64 { return r.rec.Now() }

// Wait waits for a workload with a Duration to end on its own (the ops
// in flight run to completion).
func (r *recording) Wait() {
	Expect(r.w.Config().Duration).To(BeNumerically(">", 0), "Wait on a workload without a Duration would never return")
	<-r.done
}

// Stop ends the workload and waits for it: no new op starts, and the ops
// in flight end info (their outcome is unknown to the checkers, never
// assumed).
func (r *recording) Stop() {
	r.once.Do(func() {
		r.cancel()
		<-r.done
	})
}

// ops is the history so far (the recorder flushes on Close; Stop first).
func (r *recording) ops() []history.Op {
	Expect(r.rec.Close()).To(Succeed())
	ops, err := history.Read(r.path)
	Expect(err).NotTo(HaveOccurred())
	return ops
}

// verdict is what the checkers said about a recording.
type verdict struct {
	Results checker.Results
	Ops     []history.Op
}

// check reads what every node holds once the cluster has converged and
// runs the ledger checker on the recorded history (plus counter,
// linearizable and convergence for the workloads that have them). The
// results go to dir/results.json; every checker must say valid.
func (r *recording) check(ctx context.Context) verdict {
	r.Stop()
	Expect(r.err).NotTo(HaveOccurred(), "the workload could not run")
	cfg := r.w.Config()
	if cfg.Kind == workload.Counter || cfg.Kind == workload.Mixed || cfg.Kind == workload.Embeddings {
		Expect(r.w.FinalReads(ctx)).To(Succeed())
	}
	d := r.d
	digests := d.waitConverged(ctx, d.names...)
	ops := r.ops()

	audits := map[string][]checker.AuditEntry{}
	applied := map[string]uint64{}
	samples := map[string]checker.DigestSample{}
	for _, n := range d.names {
		var entries []checker.AuditEntry
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		err := d.client(n).AuditEvents(actx, func(l client.Location) error {
			entries = append(entries, checker.AuditEntry{ID: l.ID, Index: l.Index, Term: l.Term, Entity: l.Entity, Signal: l.Signal})
			return nil
		})
		cancel()
		Expect(err).NotTo(HaveOccurred(), "audit of %s", n)
		audits[n] = entries
		applied[n] = digests[n].AppliedIndex
		samples[n] = checker.DigestSample{AppliedIndex: digests[n].AppliedIndex, Digest: digests[n].Digest}
	}
	cov := checker.Coverage{Nodes: d.names}
	rs := []checker.Result{checker.Stats(ops), checker.LedgerCovering(ops, audits, applied, cov), checker.ConvergenceCovering(samples, cov)}
	if cfg.Kind == workload.Counter || cfg.Kind == workload.Mixed {
		rs = append(rs, checker.Counter(ops), checker.Linearizable(ops, filepath.Join(d.dir, "linearizable"), time.Minute))
	}
	if cfg.Kind == workload.Embeddings || cfg.Kind == workload.Mixed {
		rs = append(rs, checker.Embeddings(ops, d.names))
	}
	res := checker.NewResults(rs...)
	b, err := json.MarshalIndent(res, "", "  ")
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(d.dir, "results.json"), b, 0o644)).To(Succeed())
	var summary []string
	for _, x := range res.Results {
		summary = append(summary, fmt.Sprintf("%s: %s: %s", x.Name, x.Valid, x.Summary))
	}
	GinkgoWriter.Printf("checkers:\n  %s\n", strings.Join(summary, "\n  "))
	for _, x := range res.Results {
		Expect(x.Valid).To(Equal(checker.Valid), "checker %s: %s\n(all: %s)", x.Name, x.Summary, strings.Join(summary, "; "))
	}
	return verdict{Results: res, Ops: ops}
}

// okWrites counts the ledger writes acknowledged per node, within
// [from, to] history time (to < 0: no end).
func okWrites(ops []history.Op, from, to int64) map[string]int {
	out := map[string]int{}
	pairs, err := history.Pairs(ops)
	Expect(err).NotTo(HaveOccurred())
	for _, p := range pairs {
		if p.Invoke.Process == history.Nemesis || p.Type() != history.OK || p.Invoke.F != history.FWrite {
			continue
		}
		if t := p.Completion.Time; t < from || (to >= 0 && t > to) {
			continue
		}
		out[p.Invoke.Node]++
	}
	return out
}
