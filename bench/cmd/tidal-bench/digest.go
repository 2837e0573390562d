package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/tidal-server/client"
)

// The digest mode: does a reader hashing the whole state stall writes?
// For each build (the -digest-baseline binary, then this tree's), it
// starts a fresh one-node cluster, loads -digest-vectors vectors of
// -digest-dim through the API, then runs open-loop single-event signal
// writes at -digest-rate for -digest-duration twice: alone, and with
// -digest-readers clients each looping on GET /v1/audit/digest. Write
// latency is measured from each write's intended start, so a write that
// waits behind a digest counts all of its wait. The figure of merit is
// the ratio of write p99 with the digest loop to write p99 without, in
// the same run on the same node.

type digestOptions struct {
	baseline string
	vectors  int
	dim      int
	clients  int
	rate     float64
	duration time.Duration
	readers  int
	flags    string
	// embedRate: embedding overwrites per second in both phases (not
	// timed), so that the vector store changes between digests and no
	// digest can reuse the last one's vector hash.
	embedRate float64
}

type digestPhase struct {
	Readers     int     `json:"readers"`
	Writes      int64   `json:"writes"`
	Errors      int64   `json:"errors"`
	WriteP50Ms  float64 `json:"write_p50_ms"`
	WriteP99Ms  float64 `json:"write_p99_ms"`
	WriteMaxMs  float64 `json:"write_max_ms"`
	Digests     int64   `json:"digests"`
	DigestP50Ms float64 `json:"digest_p50_ms,omitempty"`
	EmbedErrors int64   `json:"embedding_overwrite_errors,omitempty"`
	Load        string  `json:"load_after"`
}

type digestBuild struct {
	Build       string      `json:"build"` // "old" (the baseline binary) or "new" (this tree)
	Binary      string      `json:"binary"`
	LoadSeconds float64     `json:"load_seconds"`
	Quiet       digestPhase `json:"without_digests"`
	Digest      digestPhase `json:"with_digests"`
	P99Ratio    float64     `json:"p99_ratio"` // with ÷ without
}

type digestResult struct {
	Time      time.Time     `json:"time"`
	Commit    string        `json:"commit"`
	Vectors   int           `json:"vectors"`
	Dim       int           `json:"dim"`
	Rate      float64       `json:"write_rate"`
	Duration  string        `json:"phase_duration"`
	Readers   int           `json:"digest_readers"`
	EmbedRate float64       `json:"embedding_overwrites_per_sec"`
	Flags     string        `json:"flags,omitempty"`
	Builds    []digestBuild `json:"builds"`
	LoadStart string        `json:"load_start"`
	LoadEnd   string        `json:"load_end"`
}

func runDigest(ctx context.Context, o options) (err error) {
	do := o.digest
	if do.baseline == "" {
		return fmt.Errorf("-digest needs -digest-baseline: the old tidal-server binary to compare with")
	}
	repo, err := filepath.Abs(o.repo)
	if err != nil {
		return err
	}
	outDir := o.out
	if !filepath.IsAbs(outDir) {
		outDir = filepath.Join(repo, outDir)
	}
	work, err := os.MkdirTemp("", "tidal-bench-digest-")
	if err != nil {
		return err
	}
	defer removeWork(work, o.keep, &err)
	envr, err := environment(ctx, repo)
	if err != nil {
		return err
	}
	res := digestResult{Time: time.Now().UTC(), Commit: envr.Commit, Vectors: do.vectors, Dim: do.dim, Rate: do.rate,
		Duration: do.duration.String(), Readers: do.readers, EmbedRate: do.embedRate, Flags: do.flags, LoadStart: loadAvg()}
	newBin := filepath.Join(work, "bin", "tidal-server")
	if err := build(ctx, repo, "./tidal-server", newBin); err != nil {
		return err
	}
	for _, b := range []struct{ name, bin string }{{"old", do.baseline}, {"new", newBin}} {
		r, err := digestRun(ctx, do, b.name, b.bin, filepath.Join(work, b.name))
		if err != nil {
			return fmt.Errorf("%s build (%s): %w", b.name, b.bin, err)
		}
		res.Builds = append(res.Builds, r)
	}
	res.LoadEnd = loadAvg()
	md := digestSummary(res)
	fmt.Print("\n", md)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	stem := res.Time.Format("2006-01-02") + "-" + res.Commit + "-digest-ab"
	if do.embedRate > 0 {
		stem += "-embed"
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

// digestRun measures one build on a fresh one-node cluster.
func digestRun(ctx context.Context, do digestOptions, name, bin, dir string) (digestBuild, error) {
	out := digestBuild{Build: name, Binary: bin}
	c, err := startCluster(ctx, bin, dir, 1, nodeOptions{extra: strings.Fields(do.flags)})
	if err != nil {
		return out, err
	}
	defer c.stop()
	addr := c.clients[0]
	fmt.Printf("tidal-bench: digest: %s build, loading %d × %d-dim vectors (load %s)\n", name, do.vectors, do.dim, loadAvg())
	start := time.Now()
	var next, errs atomic.Int64
	var wg sync.WaitGroup
	for range do.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := client.New(addr, client.WithBinaryVectors(), client.WithRetries(3), client.WithTimeout(30*time.Second))
			defer cl.CloseIdleConnections()
			vec := make([]float32, do.dim)
			for {
				e := next.Add(1)
				if e > int64(do.vectors) || ctx.Err() != nil {
					return
				}
				fillVector(vec, uint64(e))
				if _, err := cl.PutEmbedding(ctx, uint64(e), fmt.Sprintf("embed-%d", e), vec); err != nil && errs.Add(1) <= 3 {
					fmt.Fprintf(os.Stderr, "tidal-bench: put %d: %v\n", e, err)
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return out, err
	}
	if n := errs.Load(); n > 0 {
		return out, fmt.Errorf("loading vectors: %d of %d puts failed", n, do.vectors)
	}
	out.LoadSeconds = time.Since(start).Seconds()
	for _, readers := range []int{0, do.readers} {
		p, err := digestPhaseRun(ctx, do, addr, readers, fmt.Sprintf("%s-r%d", name, readers))
		if err != nil {
			return out, err
		}
		fmt.Printf("tidal-bench: digest: %s build, %d digest readers: %d writes (%d errors), write p50 %.1f ms p99 %.1f ms max %.1f ms, %d digests (p50 %.0f ms)\n",
			name, readers, p.Writes, p.Errors, p.WriteP50Ms, p.WriteP99Ms, p.WriteMaxMs, p.Digests, p.DigestP50Ms)
		if readers == 0 {
			out.Quiet = p
		} else {
			out.Digest = p
		}
	}
	if out.Quiet.WriteP99Ms > 0 {
		out.P99Ratio = out.Digest.WriteP99Ms / out.Quiet.WriteP99Ms
	}
	return out, nil
}

// digestPhaseRun runs open-loop writes for do.duration with readers
// clients looping on the digest meanwhile, and waits for every write.
func digestPhaseRun(ctx context.Context, do digestOptions, addr string, readers int, idPrefix string) (digestPhase, error) {
	p := digestPhase{Readers: readers}
	stopReaders := make(chan struct{})
	var rwg sync.WaitGroup
	var dmu sync.Mutex
	var dlat []time.Duration
	var derr atomic.Value
	var embedErrs atomic.Int64
	for range readers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			cl := client.New(addr, client.WithRetries(0), client.WithTimeout(5*time.Minute))
			defer cl.CloseIdleConnections()
			for {
				select {
				case <-stopReaders:
					return
				default:
				}
				t := time.Now()
				if _, err := cl.Digest(ctx); err != nil {
					derr.Store(err)
					return
				}
				dmu.Lock()
				dlat = append(dlat, time.Since(t))
				dmu.Unlock()
			}
		}()
	}
	if do.embedRate > 0 {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			cl := client.New(addr, client.WithBinaryVectors(), client.WithRetries(3), client.WithTimeout(60*time.Second))
			defer cl.CloseIdleConnections()
			vec := make([]float32, do.dim)
			tick := time.NewTicker(time.Duration(float64(time.Second) / do.embedRate))
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stopReaders:
					return
				case <-tick.C:
				}
				e := uint64(1 + (i*7919)%do.vectors)
				fillVector(vec, e+uint64(do.vectors)*uint64(i+1))
				if _, err := cl.PutEmbedding(ctx, e, fmt.Sprintf("%s-embed-%d", idPrefix, i), vec); err != nil {
					embedErrs.Add(1) // shed (503) behind a digest on the old build: counted, not fatal
				}
			}
		}()
	}
	cl := client.New(addr, client.WithRetries(0), client.WithTimeout(60*time.Second))
	defer cl.CloseIdleConnections()
	interval := time.Duration(float64(time.Second) / do.rate)
	n := int(do.duration / interval)
	lat := make([]time.Duration, n)
	var errs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				return p, ctx.Err()
			case <-time.After(d):
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev := client.Event{ID: fmt.Sprintf("%s-%d", idPrefix, i), Entity: uint64(1 + i%1000), Signal: "view", Weight: 1}
			if _, err := cl.WriteSignals(ctx, []client.Event{ev}); err != nil {
				if errs.Add(1) <= 3 {
					fmt.Fprintf(os.Stderr, "tidal-bench: write %s: %v\n", ev.ID, err)
				}
			}
			lat[i] = time.Since(due)
		}()
	}
	wg.Wait()
	close(stopReaders)
	rwg.Wait()
	if err, ok := derr.Load().(error); ok {
		return p, fmt.Errorf("digest reader: %w", err)
	}
	p.Writes, p.Errors = int64(n), errs.Load()
	p.WriteP50Ms, p.WriteP99Ms, p.WriteMaxMs = quantileMs(lat, 0.5), quantileMs(lat, 0.99), quantileMs(lat, 1)
	p.Digests, p.DigestP50Ms = int64(len(dlat)), quantileMs(dlat, 0.5)
	p.EmbedErrors = embedErrs.Load()
	p.Load = loadAvg()
	return p, nil
}

func digestSummary(r digestResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Write latency under a digest loop: %d × %d-dim vectors, one node (commit %s, %s)\n\n", r.Vectors, r.Dim, r.Commit, r.Time.Format(time.RFC3339))
	fmt.Fprintf(&b, "Open-loop single-event writes at %.0f/s for %s, without and with %d clients looping on `GET /v1/audit/digest`; latency from each write's intended start. Embedding overwrites (untimed) at %.1f/s in both phases. Flags: `%s`. Load average %s at start, %s at end.\n\n",
		r.Rate, r.Duration, r.Readers, r.EmbedRate, r.Flags, r.LoadStart, r.LoadEnd)
	fmt.Fprintf(&b, "| build | write p99 without | write p99 with digests | ratio | p50 without / with | max with | digests (p50) | errors |\n|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.Builds {
		fmt.Fprintf(&b, "| %s | %.1f ms | %.1f ms | %.2f× | %.1f / %.1f ms | %.0f ms | %d (%.0f ms) | %d / %d |\n",
			x.Build, x.Quiet.WriteP99Ms, x.Digest.WriteP99Ms, x.P99Ratio, x.Quiet.WriteP50Ms, x.Digest.WriteP50Ms,
			x.Digest.WriteMaxMs, x.Digest.Digests, x.Digest.DigestP50Ms, x.Quiet.Errors, x.Digest.Errors)
	}
	fmt.Fprintf(&b, "\nold = `%s`, new = built from this tree.\n", r.Builds[0].Binary)
	return b.String()
}
