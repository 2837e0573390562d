package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// The embeddings mode ("puts/s and nearest-query latency over
// 100,000 vectors reported against the memory-bandwidth bound of an exact
// scan"). It starts a fresh cluster, loads -embed-vectors vectors of the
// schema's dimension through the API as application/octet-stream (so JSON
// float decoding is not what is measured), one entity each, then times
// -embed-queries nearest queries one after another against the leader,
// and measures this machine's single-core streaming read rate with a
// plain Go loop over a buffer far larger than the caches. A query scans
// every stored vector once, so bytes scanned ÷ read rate is the least a
// query can take on one core here: the bound the latency is reported
// against.

type embedOptions struct {
	vectors int
	dim     int
	nodes   int
	clients int
	queries int
	k       int
	flags   string
	server  string
}

type embedResult struct {
	Time          time.Time `json:"time"`
	Commit        string    `json:"commit"`
	Server        string    `json:"server,omitempty"` // -embed-server, when not built from Commit
	Flags         string    `json:"flags,omitempty"`
	Nodes         int       `json:"nodes"`
	Vectors       int       `json:"vectors"`
	Dim           int       `json:"dim"`
	Clients       int       `json:"clients"`
	PutSeconds    float64   `json:"put_seconds"`
	PutsPerSec    float64   `json:"puts_per_sec"`
	PutErrors     int64     `json:"put_errors"`
	PutCPUPerPut  float64   `json:"put_server_cpu_us_per_put"` // all members together
	PutP99Ms      float64   `json:"put_p99_ms"`
	Queries       int       `json:"queries"`
	K             int       `json:"k"`
	QueryP50Ms    float64   `json:"query_p50_ms"`
	QueryP99Ms    float64   `json:"query_p99_ms"`
	QueryMinMs    float64   `json:"query_min_ms"`
	ScanBytes     int64     `json:"scan_bytes"`
	ReadGBps      float64   `json:"read_gb_per_s"` // best pass
	ReadGBpsMed   float64   `json:"read_gb_per_s_median"`
	PlainReadGBps float64   `json:"plain_go_read_gb_per_s"` // best of 3, 8-byte loads
	BoundMs       float64   `json:"bound_ms"`               // scan bytes at the best read rate
	P50OverBound  float64   `json:"p50_over_bound"`
	MinOverBound  float64   `json:"min_over_bound"`
	LoadStart     string    `json:"load_start"`
	LoadAfterPuts string    `json:"load_after_puts"`
	LoadEnd       string    `json:"load_end"`
	// Memory is each member's, read after the load (embedmem.go).
	Memory []nodeMemory `json:"memory,omitempty"`
}

func runEmbeddings(ctx context.Context, o options) (err error) {
	eo := o.embed
	repo, err := filepath.Abs(o.repo)
	if err != nil {
		return err
	}
	outDir := o.out
	if !filepath.IsAbs(outDir) {
		outDir = filepath.Join(repo, outDir)
	}
	work, err := os.MkdirTemp("", "tidal-bench-embed-")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil || o.keep {
			fmt.Fprintf(os.Stderr, "tidal-bench: working directory kept: %s\n", work)
			return
		}
		os.RemoveAll(work)
	}()
	envr, err := environment(ctx, repo)
	if err != nil {
		return err
	}
	res := embedResult{Time: time.Now().UTC(), Commit: envr.Commit, Nodes: eo.nodes, Vectors: eo.vectors, Dim: eo.dim,
		Clients: eo.clients, Queries: eo.queries, K: eo.k, LoadStart: loadAvg(), Server: eo.server, Flags: eo.flags}
	bin := eo.server
	if bin == "" {
		bin = filepath.Join(work, "bin", "tidal-server")
		if err := build(ctx, repo, "./tidal-server", bin); err != nil {
			return err
		}
	}
	c, err := startCluster(ctx, bin, filepath.Join(work, "cluster"), eo.nodes, nodeOptions{extra: strings.Fields(eo.flags)})
	if err != nil {
		return err
	}
	defer c.stop()
	leader, err := leaderAddr(ctx, c)
	if err != nil {
		return err
	}
	fmt.Printf("tidal-bench: embeddings: %d nodes, leader %s, loading %d × %d-dim vectors with %d clients (load %s)\n",
		eo.nodes, leader, eo.vectors, eo.dim, eo.clients, res.LoadStart)

	// Load: every client takes the next entity until all are written.
	cpu0, err := clusterCPUSeconds(c)
	if err != nil {
		return err
	}
	var next, errs atomic.Int64
	lat := make([][]time.Duration, eo.clients)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range eo.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := client.New(leader, client.WithBinaryVectors(), client.WithRetries(3), client.WithTimeout(30*time.Second))
			defer cl.CloseIdleConnections()
			vec := make([]float32, eo.dim)
			for {
				e := next.Add(1)
				if e > int64(eo.vectors) || ctx.Err() != nil {
					return
				}
				fillVector(vec, uint64(e))
				t := time.Now()
				if _, err := cl.PutEmbedding(ctx, uint64(e), fmt.Sprintf("embed-%d", e), vec); err != nil {
					if errs.Add(1) <= 3 {
						fmt.Fprintf(os.Stderr, "tidal-bench: put %d: %v\n", e, err)
					}
					continue
				}
				lat[w] = append(lat[w], time.Since(t))
			}
		}()
	}
	progressDone := make(chan struct{})
	go func() {
		for {
			select {
			case <-progressDone:
				return
			case <-time.After(15 * time.Second):
				fmt.Printf("tidal-bench: embeddings: %d puts after %.0fs (load %s)\n", min(next.Load(), int64(eo.vectors)), time.Since(start).Seconds(), loadAvg())
			}
		}
	}()
	wg.Wait()
	close(progressDone)
	res.PutSeconds = time.Since(start).Seconds()
	if err := ctx.Err(); err != nil {
		return err
	}
	cpu1, err := clusterCPUSeconds(c)
	if err != nil {
		return err
	}
	res.PutErrors = errs.Load()
	res.PutsPerSec = float64(int64(eo.vectors)-res.PutErrors) / res.PutSeconds
	res.PutCPUPerPut = (cpu1 - cpu0) * 1e6 / float64(int64(eo.vectors)-res.PutErrors)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	res.PutP99Ms = quantileMs(all, 0.99)
	res.LoadAfterPuts = loadAvg()
	fmt.Printf("tidal-bench: embeddings: %.0f puts/s (%d errors), %.0f µs server CPU per put, put p99 %.1f ms\n",
		res.PutsPerSec, res.PutErrors, res.PutCPUPerPut, res.PutP99Ms)

	if res.Memory, err = collectMemory(ctx, c, work); err != nil {
		return fmt.Errorf("reading the members' memory: %w", err)
	}

	// Queries, one at a time, each with a different query vector.
	cl := client.New(leader, client.WithBinaryVectors(), client.WithRetries(0), client.WithTimeout(60*time.Second))
	defer cl.CloseIdleConnections()
	q := make([]float32, eo.dim)
	var qlat []time.Duration
	for i := range eo.queries {
		fillVector(q, uint64(eo.vectors)+1+uint64(i))
		t := time.Now()
		m, err := cl.Nearest(ctx, q, eo.k)
		if err != nil {
			return fmt.Errorf("nearest query %d: %w", i, err)
		}
		qlat = append(qlat, time.Since(t))
		if len(m) != min(eo.k, eo.vectors) {
			return fmt.Errorf("nearest query %d: %d results, expected %d", i, len(m), min(eo.k, eo.vectors))
		}
	}
	res.QueryP50Ms, res.QueryP99Ms = quantileMs(qlat, 0.5), quantileMs(qlat, 0.99)
	res.QueryMinMs = quantileMs(qlat, 0)

	// The bound: one core's streaming read rate, measured after the
	// cluster's work so that the figures share the machine's state.
	res.ScanBytes = int64(eo.vectors) * int64(eo.dim) * 4
	best, med, plain := readBandwidth(1<<30, 7)
	res.ReadGBps, res.ReadGBpsMed, res.PlainReadGBps = best/1e9, med/1e9, plain/1e9
	res.BoundMs = float64(res.ScanBytes) / best * 1e3
	res.P50OverBound = res.QueryP50Ms / res.BoundMs
	res.MinOverBound = res.QueryMinMs / res.BoundMs
	res.LoadEnd = loadAvg()

	md := embedSummary(res)
	fmt.Print("\n", md)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	stem := res.Time.Format("2006-01-02") + "-" + res.Commit + "-embeddings"
	if eo.vectors != 100000 {
		stem += fmt.Sprintf("-%d", eo.vectors) // several sizes from one commit
	}
	if o.quick {
		stem += "-quick" // a smoke test, not a record
	}
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(outDir, stem+".json"), append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(outDir, stem+".md"), []byte(md), 0o644)
}

func embedSummary(r embedResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Embeddings: %d × %d-dim vectors on %d nodes (commit %s, %s)\n\n", r.Vectors, r.Dim, r.Nodes, r.Commit, r.Time.Format(time.RFC3339))
	if r.Server != "" {
		fmt.Fprintf(&b, "Server binary: %s (-embed-server).\n\n", r.Server)
	}
	if r.Flags != "" {
		fmt.Fprintf(&b, "Server flags: `%s`.\n\n", r.Flags)
	}
	fmt.Fprintf(&b, "Load average: %s at start, %s after the puts, %s at the end.\n\n", r.LoadStart, r.LoadAfterPuts, r.LoadEnd)
	fmt.Fprintf(&b, "| measure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| puts/s (binary vectors, %d clients, to the leader) | %.0f (%d errors) |\n", r.Clients, r.PutsPerSec, r.PutErrors)
	fmt.Fprintf(&b, "| servers' CPU per put, all members | %.0f µs |\n", r.PutCPUPerPut)
	fmt.Fprintf(&b, "| put p99 | %.1f ms |\n", r.PutP99Ms)
	fmt.Fprintf(&b, "| nearest (k=%d) over %d vectors: p50 / p99 / min of %d | %.1f / %.1f / %.1f ms |\n", r.K, r.Vectors, r.Queries, r.QueryP50Ms, r.QueryP99Ms, r.QueryMinMs)
	fmt.Fprintf(&b, "| bytes one query scans | %.0f MB |\n", float64(r.ScanBytes)/1e6)
	fmt.Fprintf(&b, "| one core's streaming read rate here, the scan's loads (vectors.ReadProbe): best / median of 7 passes over 1 GiB | %.2f / %.2f GB/s |\n", r.ReadGBps, r.ReadGBpsMed)
	if r.PlainReadGBps > 0 {
		fmt.Fprintf(&b, "| the same with a plain Go loop (8-byte loads), best of 3 | %.2f GB/s |\n", r.PlainReadGBps)
	}
	fmt.Fprintf(&b, "| bound: bytes scanned at the best rate | %.1f ms |\n", r.BoundMs)
	fmt.Fprintf(&b, "| query p50 ÷ bound (min ÷ bound) | %.2f (%.2f) |\n", r.P50OverBound, r.MinOverBound)
	memorySummary(&b, r.Memory)
	return b.String()
}

// fillVector writes a deterministic pseudo-random vector for seed (norm
// near 1, no component zero), so every run loads the same store.
func fillVector(v []float32, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for i := range v {
		v[i] = float32(rng.NormFloat64() / math.Sqrt(float64(len(v))))
	}
}

// readBandwidth reads a size-byte buffer passes times with
// vectors.ReadProbe (the scan's own loads, nothing else) and returns the
// best and median rates in bytes/s. plain is the best rate of a plain Go
// loop (8-byte loads) over the same buffer, reported for comparison: it
// reads slower than the vectorised scan does.
func readBandwidth(size, passes int) (best, median, plain float64) {
	buf := make([]float32, size/4)
	for i := range buf {
		buf[i] = float32(i & 1023)
	}
	var rates []float64
	var sink float32
	for range passes {
		t := time.Now()
		sink += vectors.ReadProbe(buf)
		rates = append(rates, float64(size)/time.Since(t).Seconds())
	}
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&buf[0])), len(buf)/2)
	var usink uint64
	for range 3 {
		t := time.Now()
		var s0, s1, s2, s3 uint64
		for i := 0; i+4 <= len(words); i += 4 {
			s0 += words[i]
			s1 += words[i+1]
			s2 += words[i+2]
			s3 += words[i+3]
		}
		usink += s0 + s1 + s2 + s3
		plain = max(plain, float64(size)/time.Since(t).Seconds())
	}
	if sink == 1 || usink == 1 {
		fmt.Print("") // keeps the sums live
	}
	slices.Sort(rates)
	return rates[len(rates)-1], rates[len(rates)/2], plain
}

func quantileMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return float64(s[max(0, min(i, len(s)-1))]) / 1e6
}

// leaderAddr is the client address of the node the cluster names leader.
func leaderAddr(ctx context.Context, c *cluster) (string, error) {
	cl := client.New(c.clients[0], client.WithRetries(0), client.WithTimeout(5*time.Second))
	defer cl.CloseIdleConnections()
	st, err := cl.Status(ctx)
	if err != nil {
		return "", err
	}
	if st.Leader == 0 || int(st.Leader) > len(c.clients) {
		return "", fmt.Errorf("status names leader %d of %d nodes", st.Leader, len(c.clients))
	}
	return c.clients[st.Leader-1], nil
}
