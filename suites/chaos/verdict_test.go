package chaos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// These specs plant a defect in the run itself and check that the
// harness refuses to call it valid: verdicts are earned.

// unreachableRelay is what the nemesis acts on when the relay mesh's
// control endpoint cannot be reached: the nodes and their links are real
// and healthy, but every partition, link fault, heal and reset is sent to
// a control API nothing listens on, so no fault can take effect.
type unreachableRelay struct {
	nemesis.Cluster
	mesh cluster.Network
}

func (u unreachableRelay) Mesh() cluster.Network { return u.mesh }

func withUnreachableRelay(o *runner.Options) {
	o.Nemesis = func(c nemesis.Cluster) nemesis.Cluster {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		addr := l.Addr().String()
		Expect(l.Close()).To(Succeed()) // nothing listens there any more
		info := control.MeshInfo{Nodes: map[string]control.MeshNode{}}
		for _, n := range c.Names() {
			info.Nodes[n] = control.MeshNode{}
		}
		api := control.NewClient(addr, &http.Client{Timeout: 5 * time.Second})
		return unreachableRelay{Cluster: c, mesh: cluster.NewRemoteNetwork(api, info, nil)}
	}
}

// withWedgedRelay has the nemesis act through a relay control API that
// answers every request 500, as a wedged or misconfigured tcp-relay does:
// every partition, link fault, heal and reset is refused, so no fault can
// take effect and no heal is confirmed.
func withWedgedRelay(o *runner.Options) {
	o.Nemesis = func(c nemesis.Cluster) nemesis.Cluster {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, `{"error":{"code":"internal","message":"%s %s: relay wedged"}}`, r.Method, r.URL.Path)
		}))
		DeferCleanup(srv.Close)
		info := control.MeshInfo{Nodes: map[string]control.MeshNode{}}
		for _, n := range c.Names() {
			info.Nodes[n] = control.MeshNode{}
		}
		return unreachableRelay{Cluster: c, mesh: cluster.NewRemoteNetwork(control.NewClient(srv.URL, srv.Client()), info, nil)}
	}
}

// killBehindTheBack kills one node with SIGKILL, by pid, once it has
// applied some writes — not through the harness, as a crash would. The
// pid goes to killed.
type killBehindTheBack struct {
	cluster.Backend
	victim string
	once   sync.Once
	ctx    context.Context
	killed chan int
}

func (k *killBehindTheBack) Launch(spec cluster.NodeSpec) (cluster.Handle, error) {
	h, err := k.Backend.Launch(spec)
	if err == nil && spec.Name == k.victim {
		k.once.Do(func() {
			go k.killOnceBusy(h, flagValue(spec.Args, "--client-addr"), flagValue(spec.Args, "--certs-dir"))
		})
	}
	return h, err
}

// killOnceBusy watches the node's applied index on its /metrics (open
// without credentials; over TLS trusting the node's own ca.crt when it
// has --certs-dir) and kills it once it passed 200.
func (k *killBehindTheBack) killOnceBusy(h cluster.Handle, addr, certsDir string) {
	defer GinkgoRecover()
	opts := []client.Option{client.WithRetries(0)}
	if certsDir != "" {
		cfg, err := certs.ClientTLS(certsDir, "")
		Expect(err).NotTo(HaveOccurred())
		opts = append(opts, client.WithTLS(cfg))
	}
	c := client.New(addr, opts...)
	ctx, cancel := context.WithTimeout(k.ctx, 2*time.Minute)
	defer cancel()
	applied := regexp.MustCompile(`(?m)^tidal_raft_applied_index (\S+)$`)
	for ctx.Err() == nil {
		sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
		text, err := c.Metrics(sctx)
		scancel()
		if m := applied.FindSubmatch(text); err == nil && m != nil {
			if n, perr := strconv.ParseFloat(string(m[1]), 64); perr == nil && n >= 200 {
				break
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	if ctx.Err() != nil {
		return // the run ended first; the spec's expectations fail
	}
	Expect(syscall.Kill(h.PID(), syscall.SIGKILL)).To(Succeed())
	k.killed <- h.PID()
}

func flagValue(args []string, name string) string {
	if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

var _ = Describe("verdicts are earned", Label("verdicts"), func() {
	// Regression: a run whose every fault failed to
	// inject came out VALID. It must be UNKNOWN, naming each kind, and the
	// checks every chaos spec makes must reject it.
	injectionAlwaysFails := func(ctx SpecContext, test string, relay func(*runner.Options)) {
		o, s := chaosRun(ctx, runner.Config{Test: test, Nodes: 3, Seed: 1616, Duration: runner.Duration(10 * time.Second),
			Nemesis: []string{"partition-halves", "isolate-one"}, Interval: runner.Duration(3 * time.Second), FaultDuration: runner.Duration(time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 4}}, relay)
		Expect(o.Results.Valid).To(Equal(checker.Unknown), "%s", s)
		faults := resultNamed(o, "faults")
		Expect(faults.Valid).To(Equal(checker.Unknown))
		var schedule nemesis.Schedule
		Expect(o.Run.ReadSchedule(&schedule)).To(Succeed())
		Expect(schedule.Kinds()).NotTo(BeEmpty())
		for _, kind := range schedule.Kinds() {
			Expect(faults.Summary).To(ContainSubstring(kind+" never took effect"), "%s", s)
		}
		// A kind asked for by name that the schedule never drew is named
		// too (seed 1616 draws partition-halves only).
		Expect(schedule.Kinds()).NotTo(ContainElement("isolate-one"))
		Expect(faults.Summary).To(ContainSubstring("isolate-one was never injected"), "%s", s)
		d := faults.Details.(checker.FaultsDetails)
		Expect(d.FailedHeals).NotTo(BeEmpty(), "the heal-all against the unreachable relay must not be recorded ok")
		for _, h := range d.FailedHeals {
			Expect(h.Outcome).NotTo(Equal(history.OK))
		}
		// What a chaos spec checks rejects this run.
		Expect(verdictProblems(o)).To(ContainElement(ContainSubstring("checker faults: unknown")))
		Expect(InterceptGomegaFailure(func() { expectFaultsHappened(o) })).To(HaveOccurred())
		// Nothing else went wrong: the cluster itself was never faulted.
		Expect(resultNamed(o, "nodes").Valid).To(Equal(checker.Valid), "%s", s)
		Expect(resultNamed(o, "ledger").Valid).To(Equal(checker.Valid), "%s", s)
	}
	It("a nemesis whose injection always fails makes the run unknown, and a chaos spec fails on it", Label("smoke"), func(ctx SpecContext) {
		injectionAlwaysFails(ctx, "injection-fails", withUnreachableRelay)
	}, SpecTimeout(4*time.Minute))
	// The same with a relay that answers every control request 500 (a
	// wedged tcp-relay): the request arrives and is refused, rather than
	// never connecting.
	It("a relay control API that answers 500 makes the run unknown, and a chaos spec fails on it", func(ctx SpecContext) {
		injectionAlwaysFails(ctx, "injection-refused", withWedgedRelay)
	}, SpecTimeout(4*time.Minute))

	// Regression: a node that went down behind the
	// harness's back was "not audited" and the verdict was VALID. It must
	// be INVALID, with the node, its exit status and the end of its log in
	// results.json and report.html.
	It("a node killed behind the harness's back makes the run invalid, with its exit status and log", func(ctx SpecContext) {
		kill := &killBehindTheBack{victim: "n2", ctx: ctx, killed: make(chan int, 1)}
		o, s := chaosRun(ctx, runner.Config{Test: "killed-behind-the-back", Nodes: 3, Seed: 1717, Duration: runner.Duration(10 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 4}}, func(opts *runner.Options) {
			opts.Backend = func(b cluster.Backend) cluster.Backend { kill.Backend = b; return kill }
		})
		var pid int
		Eventually(kill.killed).Should(Receive(&pid), "n2 was never killed: it did not apply 200 entries")
		Expect(o.Results.Valid).To(Equal(checker.Invalid), "%s", s)
		nodes := resultNamed(o, "nodes")
		Expect(nodes.Valid).To(Equal(checker.Invalid))
		Expect(nodes.Summary).To(ContainSubstring("n2 exited on its own (signal: killed)"))
		d := nodes.Details.(checker.NodesDetails)
		Expect(d.Crashed).To(Equal([]string{"n2"}))
		Expect(d.Crashes[0].PID).To(Equal(pid))
		Expect(d.Crashes[0].Logs).NotTo(BeEmpty())
		// The ledger and the digests cannot leave the crashed node out.
		for _, name := range []string{"ledger", "convergence"} {
			r := resultNamed(o, name)
			Expect(r.Valid).To(Equal(checker.Invalid), "%s: %s", name, r.Summary)
			Expect(r.Summary).To(ContainSubstring("n2 crashed"))
		}
		results, err := os.ReadFile(o.Run.Path(report.ResultsFile))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(results)).To(And(ContainSubstring(`"crashed": [`), ContainSubstring(`"pid": `+strconv.Itoa(pid)),
			ContainSubstring(`"signal": "killed"`), ContainSubstring(`nodes/n2/stdout.log`)))
		page, err := os.ReadFile(o.Run.Path(report.ReportFile))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(page)).To(And(ContainSubstring("Crashed nodes"), ContainSubstring("pid "+strconv.Itoa(pid)), ContainSubstring("signal: killed")))
	}, SpecTimeout(6*time.Minute))
})
