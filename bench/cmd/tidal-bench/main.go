// Command tidal-bench is `make bench`: it builds tidal-server and
// tidal-stress, runs the Go micro-benchmarks, then starts three real
// tidal-server processes on loopback and ramps tidal-stress to the knee of
// each workload (single-event writes, 100-event batches, 1536-dim
// embeddings), samples follower lag at 80% of the single-event knee, and
// writes bench/results/<date>-<commit>.json with a Markdown summary next
// to it, compared with the previous results file when there is one.
//
//	go run ./bench/cmd/tidal-bench            # from the repository root
//	go run ./bench/cmd/tidal-bench -quick     # shorter stages, fewer benchmark runs
//	./ci/bench -side-by-side                  # tidal vs etcd, tcp-relay vs direct vs Toxiproxy
//
// Every node is its own process with its own data directory and log file
// in a temporary directory, stopped by pid (SIGTERM, then SIGKILL) when a
// workload ends or the command is interrupted. The directory is removed on
// success and kept, with its path printed, on failure.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/buildinfo/gobuild"
	"github.com/tidaldb/tidal/harness/stress"
)

// workload is one cluster benchmark.
type workload struct {
	Name        string
	Description string
	Flags       []string      // tidal-stress flags that make the workload
	Start       float64       // ops/s of the first coarse stage
	SLO         time.Duration // p99 the knee must meet
	// Target is the project's goal for the knee: Unit "ops/s" or "events/s".
	Target     float64
	TargetUnit string
}

var workloads = []workload{
	{Name: "single", Description: "single-event quorum writes", Flags: []string{"--batch", "1"},
		Start: 250, SLO: 20 * time.Millisecond, Target: 10000, TargetUnit: "events/s"},
	{Name: "batch100", Description: "100-event batches", Flags: []string{"--batch", "100"},
		Start: 20, SLO: 100 * time.Millisecond, Target: 150000, TargetUnit: "events/s"},
	{Name: "embed1536", Description: "1536-dim embedding writes", Flags: []string{"--embedding-dim", "1536"},
		Start: 200, SLO: 100 * time.Millisecond, Target: 3000, TargetUnit: "events/s"},
}

// lagTarget is the project's follower-lag goal at 80% of the single-event knee.
const lagTarget = 50 * time.Millisecond

// options are the command line.
type options struct {
	repo        string
	out         string
	quick       bool
	skipMicro   bool
	skipCluster bool
	microCount  int
	benchtime   string
	coarseStage time.Duration
	fineStage   time.Duration
	lagRun      time.Duration
	keep        bool
	render      string
	sideBySide  bool
	sbs         sbsOptions
	embeddings  bool
	embed       embedOptions
	digestAB    bool
	digest      digestOptions
}

func main() {
	var o options
	flag.StringVar(&o.repo, "repo", ".", "repository root")
	flag.StringVar(&o.out, "out", "bench/results", "results directory (relative to -repo)")
	flag.BoolVar(&o.quick, "quick", false, "short stages and 2 benchmark runs: a smoke test, not a record")
	flag.BoolVar(&o.skipMicro, "skip-micro", false, "skip the Go micro-benchmarks")
	flag.BoolVar(&o.skipCluster, "skip-cluster", false, "skip the 3-node cluster benchmark")
	flag.IntVar(&o.microCount, "count", 5, "runs per micro-benchmark (benchstat needs several)")
	flag.StringVar(&o.benchtime, "benchtime", "300ms", "go test -benchtime per run")
	flag.DurationVar(&o.coarseStage, "coarse-stage", 4*time.Second, "stage length of the doubling ramp that brackets the knee")
	flag.DurationVar(&o.fineStage, "fine-stage", 5*time.Second, "stage length of the linear ramp that narrows it")
	flag.DurationVar(&o.lagRun, "lag-run", 30*time.Second, "length of the run at 80% of the knee that samples follower lag")
	flag.BoolVar(&o.keep, "keep", false, "keep the working directory (binaries, node logs, tidal-stress JSON)")
	flag.StringVar(&o.render, "render", "", "measure nothing: rewrite the Markdown summary of this results file (against the results before it)")
	flag.BoolVar(&o.sideBySide, "side-by-side", false, "instead: tidal-server against etcd and tcp-relay against direct and Toxiproxy, in alternating rounds (see bench/README.md)")
	flag.IntVar(&o.sbs.rounds, "rounds", 3, "-side-by-side: rounds of each system, alternating")
	flag.StringVar(&o.sbs.clients, "sbs-clients", "1,16,64,256", "-side-by-side: closed-loop client counts")
	flag.DurationVar(&o.sbs.warmup, "sbs-warmup", 2*time.Second, "-side-by-side: warm-up of each store run (not counted)")
	flag.DurationVar(&o.sbs.duration, "sbs-duration", 8*time.Second, "-side-by-side: measured window of each store run")
	flag.DurationVar(&o.sbs.opTimeout, "sbs-timeout", 5*time.Second, "-side-by-side: bound on each write; a write past it is an error")
	flag.IntVar(&o.sbs.etcdConns, "etcd-conns", 1, "-side-by-side: gRPC connections etcd's workers share (0: one per worker)")
	flag.IntVar(&o.sbs.batchClients, "batch-clients", 16, "-side-by-side: clients of tidal's batched run (0: none)")
	flag.IntVar(&o.sbs.batchSize, "batch-size", 100, "-side-by-side: events per request of tidal's batched run")
	flag.DurationVar(&o.sbs.relayDuration, "relay-duration", 2*time.Second, "-side-by-side: time of each relay measurement")
	flag.StringVar(&o.sbs.etcd, "etcd", "etcd", "-side-by-side: etcd server binary")
	flag.StringVar(&o.sbs.toxiproxy, "toxiproxy", "", "-side-by-side: Toxiproxy server binary (ci/bench builds it)")
	flag.BoolVar(&o.sbs.skipStores, "skip-stores", false, "-side-by-side: skip etcd vs tidal")
	flag.BoolVar(&o.sbs.skipRelay, "skip-relay", false, "-side-by-side: skip the relay comparison")
	flag.StringVar(&o.sbs.tidalFlags, "tidal-flags", "", "-side-by-side: extra flags for the measured tidal-server's nodes (not the baseline's), e.g. --pack-proposals")
	flag.StringVar(&o.sbs.protocol, "protocol", "http", "-side-by-side: how the measured tidal is written: http (POST /v1/signals) or grpc (the ingest stream, --grpc-addr)")
	flag.StringVar(&o.sbs.baselineProtocol, "baseline-protocol", "http", "-side-by-side -baseline: how the baseline build is written: http or grpc")
	flag.IntVar(&o.sbs.grpcStreams, "grpc-streams", 1, "-side-by-side -protocol grpc: ingest streams (one connection each) the workers share")
	flag.BoolVar(&o.sbs.tlsAB, "tls-ab", false, "-side-by-side: plaintext against secured (--certs-dir: mutual TLS between nodes, TLS with HTTP/2 and a writer certificate to clients) on this build, in etcd's and tidal's places, both written with -protocol; the file's stem ends in -tls")
	flag.BoolVar(&o.sbs.tlsHTTP1, "tls-http1", false, "-side-by-side -tls-ab: the secured clients speak HTTP/1.1 over TLS, one connection each, as the plaintext ones do (isolates TLS from HTTP/2; not with -protocol grpc, always HTTP/2); the stem ends in -tls-h1")
	flag.StringVar(&o.sbs.baseline, "baseline", "", "-side-by-side: an older tidal-server binary measured in etcd's place (an A/B of two builds; the file's stem ends in -ab and its etcd columns are that build)")
	flag.BoolVar(&o.embeddings, "embeddings", false, "instead: load -embed-vectors vectors (binary) into a fresh cluster, time nearest queries over them and report them against this machine's memory-read bound (see bench/README.md)")
	flag.IntVar(&o.embed.vectors, "embed-vectors", 100000, "-embeddings: vectors to load, one entity each")
	flag.IntVar(&o.embed.dim, "embed-dim", 1536, "-embeddings: their dimension (the server's schema must match; the default schema's is 1536)")
	flag.IntVar(&o.embed.nodes, "embed-nodes", 3, "-embeddings: cluster members")
	flag.IntVar(&o.embed.clients, "embed-clients", 16, "-embeddings: concurrent clients loading vectors")
	flag.IntVar(&o.embed.queries, "embed-queries", 30, "-embeddings: nearest queries, one after another")
	flag.IntVar(&o.embed.k, "embed-k", 10, "-embeddings: results per query")
	flag.StringVar(&o.embed.flags, "embed-flags", "", "-embeddings: extra tidal-server flags")
	flag.StringVar(&o.embed.server, "embed-server", "", "-embeddings: tidal-server binary (default: built from -repo)")
	flag.BoolVar(&o.digestAB, "digest", false, "instead: write p99 on one node without and with clients looping on GET /v1/audit/digest, for -digest-baseline and for this tree (see bench/README.md)")
	flag.StringVar(&o.digest.baseline, "digest-baseline", "", "-digest: the old tidal-server binary to compare with")
	flag.IntVar(&o.digest.vectors, "digest-vectors", 20000, "-digest: vectors loaded before measuring, one entity each")
	flag.IntVar(&o.digest.dim, "digest-dim", 1536, "-digest: their dimension (the server's schema must match)")
	flag.IntVar(&o.digest.clients, "digest-clients", 8, "-digest: concurrent clients loading vectors")
	flag.Float64Var(&o.digest.rate, "digest-rate", 100, "-digest: open-loop single-event writes per second")
	flag.DurationVar(&o.digest.duration, "digest-duration", 15*time.Second, "-digest: length of each phase (without, then with digest readers)")
	flag.IntVar(&o.digest.readers, "digest-readers", 2, "-digest: clients looping on the digest in the second phase")
	flag.Float64Var(&o.digest.embedRate, "digest-embed-rate", 0, "-digest: untimed embedding overwrites per second in both phases, so the vectors change between digests (0: none; then every digest after the first reuses the vectors' hash)")
	flag.StringVar(&o.digest.flags, "digest-flags", "--snapshot-every 1000000", "-digest: extra tidal-server flags (the default keeps snapshots out of the measurement)")
	flag.Parse()
	if o.quick {
		o.microCount, o.benchtime = 2, "100ms"
		o.coarseStage, o.fineStage, o.lagRun = time.Second, 2*time.Second, 5*time.Second
		o.sbs.rounds, o.sbs.warmup, o.sbs.duration, o.sbs.relayDuration = 1, 500*time.Millisecond, 2*time.Second, 500*time.Millisecond
		o.embed.vectors, o.embed.queries = min(o.embed.vectors, 2000), min(o.embed.queries, 5)
		o.digest.vectors, o.digest.duration = min(o.digest.vectors, 2000), min(o.digest.duration, 3*time.Second)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	run := run
	switch {
	case o.render != "":
		run = render
	case o.sideBySide:
		run = runSideBySide
	case o.embeddings:
		run = runEmbeddings
	case o.digestAB:
		run = runDigest
	}
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "tidal-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) (err error) {
	repo, outDir, work, err := workspace(o.repo, o.out, "tidal-bench-")
	if err != nil {
		return err
	}
	defer removeWork(work, o.keep, &err)

	started := time.Now()
	res := &results{Schema: 1, Time: started.UTC(), Quick: o.quick}
	res.Env, err = environment(ctx, repo)
	if err != nil {
		return err
	}
	stem := res.Time.Format("2006-01-02") + "-" + res.Env.Commit
	fmt.Printf("tidal-bench: %s, %s, %d cores, %s, load %s\n", stem, res.Env.CPUModel, res.Env.Cores, res.Env.GoVersion, res.Env.LoadStart)

	binDir := filepath.Join(work, "bin")
	for name, pkg := range map[string]string{"tidal-server": "./tidal-server", "tidal-stress": "./harness/cmd/tidal-stress"} {
		if err := build(ctx, repo, pkg, filepath.Join(binDir, name)); err != nil {
			return err
		}
	}

	if !o.skipCluster {
		res.Cluster, err = runCluster(ctx, o, binDir, work)
		if err != nil {
			return err
		}
	}
	if !o.skipMicro {
		fmt.Println("tidal-bench: micro-benchmarks")
		raw := filepath.Join(outDir, stem+".bench.txt")
		res.Micro, err = runMicro(ctx, repo, []string{"./tidal-server/...", "./tcp-relay/..."}, o.microCount, o.benchtime, raw)
		if err != nil {
			return err
		}
		res.Micro.Raw = filepath.Base(raw)
		for _, f := range res.Micro.Failures {
			fmt.Fprintln(os.Stderr, "tidal-bench: micro-benchmark failure:", f)
		}
	}
	res.Env.LoadEnd = loadAvg()
	res.Seconds = time.Since(started).Seconds()

	prev, prevPath := previousResults(outDir, stem, res.Time)
	jsonPath := filepath.Join(outDir, stem+".json")
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(jsonPath, append(data, '\n'), 0o644); err != nil {
		return err
	}
	var stat string
	if prev != nil && prev.Micro != nil && res.Micro != nil {
		stat = benchstat(ctx, repo, filepath.Join(outDir, prev.Micro.Raw), filepath.Join(outDir, res.Micro.Raw))
	}
	md := summary(res, prev, filepath.Base(prevPath), stat)
	mdPath := filepath.Join(outDir, stem+".md")
	if err := os.WriteFile(mdPath, []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print("\n", md)
	fmt.Printf("tidal-bench: wrote %s and %s in %.0fs\n", jsonPath, mdPath, res.Seconds)
	return nil
}

// render rewrites the summary of an existing results file, comparing it
// with the newest results file older than it.
func render(ctx context.Context, o options) error {
	data, err := os.ReadFile(o.render)
	if err != nil {
		return err
	}
	if isSideBySide(data) {
		return renderSideBySide(o.render, data)
	}
	var r results
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("%s: %w", o.render, err)
	}
	dir, stem := filepath.Dir(o.render), strings.TrimSuffix(filepath.Base(o.render), ".json")
	prev, prevPath := previousResults(dir, stem, r.Time)
	var stat string
	if prev != nil && prev.Micro != nil && r.Micro != nil {
		stat = benchstat(ctx, o.repo, filepath.Join(dir, prev.Micro.Raw), filepath.Join(dir, r.Micro.Raw))
	}
	return os.WriteFile(filepath.Join(dir, stem+".md"), []byte(summary(&r, prev, filepath.Base(prevPath), stat)), 0o644)
}

// build compiles pkg as a release binary (no cgo, no race detector, the
// version and commit linked in as `make build` does).
// workspace resolves a run's directories: the repository, the results
// directory (out, relative to the repository unless absolute; made if
// missing) and a new working directory named with prefix.
func workspace(repoFlag, out, prefix string) (repo, outDir, work string, err error) {
	if repo, err = filepath.Abs(repoFlag); err != nil {
		return "", "", "", err
	}
	outDir = out
	if !filepath.IsAbs(outDir) {
		outDir = filepath.Join(repo, outDir)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", "", "", err
	}
	if work, err = os.MkdirTemp("", prefix); err != nil {
		return "", "", "", err
	}
	return repo, outDir, work, nil
}

// removeWork removes the working directory at the end of a run, unless
// the run failed (*runErr) or keep asks to keep it: then it says where it
// is.
func removeWork(work string, keep bool, runErr *error) {
	if *runErr != nil || keep {
		fmt.Fprintf(os.Stderr, "tidal-bench: working directory kept: %s\n", work)
		return
	}
	os.RemoveAll(work)
}

func build(ctx context.Context, repo, pkg, out string) error {
	if b, err := gobuild.Command(ctx, repo, gobuild.StampOf(repo), out, pkg).CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, b)
	}
	return nil
}

// runCluster runs every workload, each on a fresh cluster so that one
// workload's log and state do not weigh on the next.
func runCluster(ctx context.Context, o options, binDir, work string) (*clusterResults, error) {
	cr := &clusterResults{Nodes: 3, Workloads: map[string]*workloadResult{}}
	for _, w := range workloads {
		fmt.Printf("tidal-bench: cluster workload %s (%s)\n", w.Name, w.Description)
		c, err := startCluster(ctx, filepath.Join(binDir, "tidal-server"), filepath.Join(work, w.Name), cr.Nodes, nodeOptions{})
		if err != nil {
			return nil, err
		}
		wr, lag, err := runWorkload(ctx, o, w, c, filepath.Join(binDir, "tidal-stress"), filepath.Join(work, w.Name))
		if stopErr := c.stop(); err == nil && stopErr != nil {
			err = fmt.Errorf("stopping the %s cluster: %w", w.Name, stopErr)
		}
		if err != nil {
			return nil, err
		}
		cr.Workloads[w.Name] = wr
		if lag != nil {
			cr.Lag = lag
		}
	}
	return cr, nil
}

// runWorkload brackets the knee with a doubling ramp judged loosely (p99
// within 10× the SLO, at least 500ms), narrows it with a linear ramp judged by the SLO
// between the last stage that met the SLO and the first that did not, and,
// for single events, samples follower lag at 80% of the knee.
func runWorkload(ctx context.Context, o options, w workload, c *cluster, stressBin, dir string) (*workloadResult, *lagResult, error) {
	strict := stress.SLO{P99: w.SLO, MaxErrorRate: 0.01}
	// The doubling ramp stops at saturation — errors, or queues growing
	// into p99s far past the SLO — not at the SLO itself, so that it also
	// measures the most the cluster sustains.
	loose := max(10*w.SLO, 500*time.Millisecond)
	coarse, err := runStress(ctx, stressBin, c, w, dir, "coarse",
		"--ramp", fmt.Sprintf("%g:x2:9:%s", w.Start, o.coarseStage), "--slo-p99", loose.String(), "--ramp-stop-after", "1")
	if err != nil {
		return nil, nil, err
	}
	stages := rejudge(coarse.Stages, strict)
	var lo, hi float64
	if k, ok := stress.Knee(stages, strict); ok {
		lo = k.OfferedRate
	}
	for _, s := range stages {
		if !s.Pass && s.TargetRate > lo && (hi == 0 || s.TargetRate < hi) {
			hi = s.TargetRate
		}
	}
	if hi > 0 {
		step := (hi - lo) / 5
		fine, err := runStress(ctx, stressBin, c, w, dir, "fine",
			"--ramp", fmt.Sprintf("%.0f:%.0f:4:%s", lo+step, step, o.fineStage), "--slo-p99", w.SLO.String(), "--ramp-stop-after", "2")
		if err != nil {
			return nil, nil, err
		}
		stages = append(stages, rejudge(fine.Stages, strict)...)
	}
	for i := range stages {
		stages[i].Index = i
	}
	wr := &workloadResult{
		Description: w.Description, Flags: w.Flags, SLOP99: w.SLO,
		Target: w.Target, TargetUnit: w.TargetUnit, Stages: stages, ToppedOut: hi == 0,
	}
	if k, ok := stress.Knee(stages, strict); ok {
		wr.Knee = &k
	}
	if k, ok := stress.Knee(stages, stress.SLO{MaxErrorRate: 0.01}); ok {
		wr.MaxSustained = &k
	}
	if w.Name != "single" {
		return wr, nil, nil
	}
	base := wr.Knee
	if base == nil {
		base = wr.MaxSustained
	}
	if base == nil {
		return wr, nil, nil
	}
	rate := 0.8 * base.OfferedRate
	lagRun, err := runStress(ctx, stressBin, c, w, dir, "lag",
		"--rate", fmt.Sprintf("%.0f", rate), "--duration", o.lagRun.String(), "--slo-p99", w.SLO.String(), "--sample-lag", "10ms")
	if err != nil {
		return nil, nil, err
	}
	lr := &lagResult{Rate: rate, Of: "knee", Target: lagTarget, Run: lagRun.Stages[0], Lag: lagRun.Lag}
	if wr.Knee == nil {
		lr.Of = "max sustained (no stage met the SLO)"
	}
	return wr, lr, nil
}

// rejudge applies slo to stages a run judged by another SLO.
func rejudge(stages []stress.StageResult, slo stress.SLO) []stress.StageResult {
	out := make([]stress.StageResult, len(stages))
	for i, s := range stages {
		s.Pass, s.Reason = slo.Judge(s)
		out[i] = s
	}
	return out
}

// runStress runs the tidal-stress binary against the cluster with the
// workload's flags plus extra, and reads back its JSON result.
func runStress(ctx context.Context, bin string, c *cluster, w workload, dir, label string, extra ...string) (*stress.Result, error) {
	jsonPath := filepath.Join(dir, label+".json")
	args := append([]string{"--targets", strings.Join(c.clients, ","), "--json", jsonPath, "--timeout", "5s"}, w.Flags...)
	args = append(args, extra...)
	fmt.Printf("tidal-bench: tidal-stress %s\n", strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("tidal-stress %s for %s: %w (node logs in %s)", label, w.Name, err, c.dir)
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		return nil, err
	}
	var r stress.Result
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", jsonPath, err)
	}
	if len(r.Stages) == 0 {
		return nil, fmt.Errorf("%s: expected at least one stage, found none", jsonPath)
	}
	return &r, nil
}

// environment describes the machine and the tree being measured.
func environment(ctx context.Context, repo string) (env, error) {
	e := env{Cores: runtime.NumCPU(), OS: runtime.GOOS, Arch: runtime.GOARCH, LoadStart: loadAvg(), CPUModel: cpuModel()}
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = repo
		out, err := cmd.Output()
		return strings.TrimSpace(string(out)), err
	}
	var err error
	if e.Commit, err = git("rev-parse", "--short=12", "HEAD"); err != nil {
		return e, fmt.Errorf("reading the commit of %s: %w", repo, err)
	}
	if st, err := git("status", "--porcelain", "--untracked-files=no"); err == nil && st != "" {
		e.Dirty = true
	}
	cmd := exec.CommandContext(ctx, "go", "env", "GOVERSION")
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		return e, fmt.Errorf("go env GOVERSION: %w", err)
	}
	e.GoVersion = strings.TrimSpace(string(out))
	return e, nil
}

func cpuModel() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for line := range strings.Lines(string(data)) {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// loadAvg is /proc/loadavg's 1, 5 and 15 minute figures: on a shared
// machine, the first thing to read before trusting a result.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// previousResults finds the newest results file in dir from before the
// given time, other than stem's own.
func previousResults(dir, stem string, before time.Time) (*results, string) {
	paths, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	var best *results
	var bestPath string
	for _, p := range paths {
		if strings.TrimSuffix(filepath.Base(p), ".json") == stem {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil || isSideBySide(data) {
			continue
		}
		var r results
		if json.Unmarshal(data, &r) != nil || r.Schema == 0 || !r.Time.Before(before) {
			continue
		}
		if best == nil || r.Time.After(best.Time) {
			best, bestPath = &r, p
		}
	}
	return best, bestPath
}

// isSideBySide tells a side-by-side results file from a cluster one.
func isSideBySide(data []byte) bool {
	var k struct {
		Kind string `json:"kind"`
	}
	return json.Unmarshal(data, &k) == nil && k.Kind == sideBySideKind
}

var errNoKnee = errors.New("no stage met the SLO")

// kneeFigure is a workload's headline: knee events/s, or an error.
func (w *workloadResult) kneeFigure() (float64, error) {
	if w == nil || w.Knee == nil {
		return 0, errNoKnee
	}
	return w.Knee.AchievedEvents, nil
}

func fmtRate(v float64) string {
	s := strconv.FormatFloat(v, 'f', 0, 64)
	// Thousands separators for readability: 150000 -> 150,000.
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
