// Package stress is an open-loop load generator for tidal-server.
//
// Open loop: op i of a stage is due at i/rate after the stage starts,
// whatever happened to the ops before it, and its latency is measured from
// that due time — not from when a worker or a connection became free. A
// server that stalls for a second therefore shows as up to a second of
// latency on every op that came due during the stall, never as a lower
// offered rate (no coordinated omission).
//
// Invariants, per stage, once Run returns:
//   - Scheduled == OK + Errors.Total(): every op that came due ended in
//     exactly one outcome.
//   - Every op sent has its latency in exactly one histogram: Latency
//     (succeeded) or FailedLatency (503, 504, timeout, any other status,
//     transport error), so no failure can make a stage look faster than
//     its clients saw it.
//   - Shed ops (the generator's own in-flight limit was reached when they
//     came due) were never sent and are in no latency histogram; they are
//     counted apart from the server's errors.
//   - Achieved rates divide by the time the stage's ops took: the stage's
//     duration plus the drain after it (Drain), so past saturation, where
//     ops complete long after the stage's schedule ended, achieved stays
//     below offered.
//   - Latencies include the generator's own dispatch delay, which is also
//     reported alone (DispatchDelay) so a saturated generator is visible.
package stress

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"github.com/tidaldb/tidal/harness/latency"

	"github.com/tidaldb/tidal/tidal-server/client"
)

// Config describes a run. The zero value of a field means its default.
type Config struct {
	Targets      []string // node client addresses ("127.0.0.1:7071" or a URL); ops go round-robin
	Mix          Mix      // default writes
	ReadFraction float64  // share of reads in MixMixed; default 0.5
	Batch        int      // events per POST /v1/signals; default 1
	EmbeddingDim int      // > 0: writes are embedding puts of vectors of this dimension
	// BinaryVectors sends embedding puts as application/octet-stream
	// (little-endian float32s) instead of JSON.
	BinaryVectors bool
	Entities      uint64 // entity ids are uniform in [1, Entities]; default 100000
	Consistency   string // reads: "linearizable" (default) or "local"

	// MaxInFlight bounds the ops sent and not yet answered; an op that comes
	// due while that many are outstanding is shed. Default 4096.
	MaxInFlight int
	// Connections caps the connections per target; default 64. HTTP/1.1
	// carries one request at a time per connection, so this also caps
	// per-target concurrency; ops beyond it wait for a connection, and the
	// wait is in their latency. Without a cap, a slow start (every op
	// dialling its own connection) feeds on itself: dialling costs CPU,
	// ops pile up, more dial, until the generator sheds — its own limit
	// mistaken for the server's.
	Connections int
	Timeout     time.Duration // per op; default 10s
	Seed        uint64        // entity choice and vectors; default from the clock
	RunID       string        // event id prefix, unique per run; default random

	SLO SLO // stages are judged against it; default MaxErrorRate 1%, no p99 bound
	// StopAfterFailures ends a multi-stage plan after this many consecutive
	// stages failed the SLO (0: run every stage): past the knee, more load
	// only queues up and lengthens the run.
	StopAfterFailures int

	// Progress, when set, is called about once a second with the last
	// second's figures, from a goroutine of Run's.
	Progress func(Progress)
	// Client, when set, sends the requests (tests); otherwise Run builds
	// one with a transport sized for MaxInFlight.
	Client *http.Client

	// TLS, when set, makes the targets https:// (unless given with a
	// scheme) and the built transport speak TLS with it; HTTP/2 unless
	// HTTP1. Token, when set, is sent as Authorization: Bearer.
	TLS   *tls.Config
	HTTP1 bool
	Token string

	// GRPCTargets, when set, are the nodes' gRPC ingest addresses
	// (--grpc-addr), one per target in Targets' order: signal writes go
	// on the ingest stream of the target they are for, GRPCStreams
	// streams per target (default 1) shared by the workers; reads and
	// embedding puts stay on HTTP.
	GRPCTargets []string
	GRPCStreams int
}

func (c Config) withDefaults() (Config, error) {
	if len(c.Targets) == 0 {
		return c, errors.New("stress: expected at least one target address, found none")
	}
	if c.Mix == "" {
		c.Mix = MixWrites
	}
	if _, err := ParseMix(string(c.Mix)); err != nil {
		return c, fmt.Errorf("stress: %w", err)
	}
	if c.ReadFraction == 0 {
		c.ReadFraction = 0.5
	}
	if c.ReadFraction < 0 || c.ReadFraction > 1 {
		return c, fmt.Errorf("stress: read fraction: expected a share in [0, 1], found %g", c.ReadFraction)
	}
	if c.Batch == 0 {
		c.Batch = 1
	}
	if c.Batch < 0 {
		return c, fmt.Errorf("stress: batch: expected >= 1 events per write, found %d", c.Batch)
	}
	if c.EmbeddingDim < 0 {
		return c, fmt.Errorf("stress: embedding dim: expected >= 0, found %d", c.EmbeddingDim)
	}
	if c.Entities == 0 {
		c.Entities = 100000
	}
	if c.Consistency == "" {
		c.Consistency = "linearizable"
	}
	if c.Consistency != "linearizable" && c.Consistency != "local" {
		return c, fmt.Errorf("stress: consistency: expected linearizable or local, found %q", c.Consistency)
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 4096
	}
	if c.Connections == 0 {
		c.Connections = 64
	}
	if c.MaxInFlight < 0 || c.Connections < 0 {
		return c, fmt.Errorf("stress: expected max in-flight and connections >= 0, found %d and %d", c.MaxInFlight, c.Connections)
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.RunID == "" {
		var b [4]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
		c.RunID = "st" + hex.EncodeToString(b[:])
	}
	if c.SLO.MaxErrorRate == 0 {
		c.SLO.MaxErrorRate = 0.01
	}
	if len(c.GRPCTargets) > 0 && len(c.GRPCTargets) != len(c.Targets) {
		return c, fmt.Errorf("stress: expected one gRPC ingest address per target (%d), found %d", len(c.Targets), len(c.GRPCTargets))
	}
	if c.GRPCStreams <= 0 {
		c.GRPCStreams = 1
	}
	return c, nil
}

func (c Config) record() RunConfig {
	rc := RunConfig{
		Targets: c.Targets, Mix: c.Mix, Batch: c.Batch, EmbeddingDim: c.EmbeddingDim,
		Entities: c.Entities, Consistency: c.Consistency,
		MaxInFlight: c.MaxInFlight, Connections: c.Connections, Timeout: c.Timeout,
		SLOP99: c.SLO.P99, MaxErrorRate: c.SLO.MaxErrorRate, Protocol: "http/1.1",
	}
	if c.TLS != nil {
		rc.Protocol = "https h2"
		if c.HTTP1 {
			rc.Protocol = "https http/1.1"
		}
	}
	if len(c.GRPCTargets) > 0 {
		rc.Protocol = "grpc ingest stream"
		if c.TLS != nil {
			rc.Protocol = "grpc ingest stream, TLS"
		}
	}
	if c.Mix == MixMixed {
		rc.ReadFraction = c.ReadFraction
	}
	return rc
}

// NewTransport is the transport Run uses unless Config.Client is set: at
// most connsPerTarget connections per target, every one kept alive when
// idle (a connection closed for lack of an idle slot is a reconnect on the
// next op, which the server would be blamed for), no proxy, no
// compression.
func NewTransport(connsPerTarget int) *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: connsPerTarget,
		MaxConnsPerHost:     connsPerTarget,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
}

// Progress is one second of a run, as the progress line shows it.
type Progress struct {
	Elapsed    time.Duration // since Run started
	Stage      int           // index into the plan
	Stages     int
	TargetRate float64
	Sent       int64 // ops handed to workers in the second
	OK         int64 // ops answered with success in the second
	Errors     int64 // ops answered with an error, or failed, in the second
	Shed       int64
	InFlight   int64 // at the end of the second
	Latency    Latencies
}

func (p Progress) String() string {
	return fmt.Sprintf("%6.1fs stage %d/%d @%.0f/s  sent %d ok %d err %d shed %d in-flight %d  p50 %s p99 %s max %s",
		p.Elapsed.Seconds(), p.Stage+1, p.Stages, p.TargetRate, p.Sent, p.OK, p.Errors, p.Shed, p.InFlight,
		fmtDur(p.Latency.P50), fmtDur(p.Latency.P99), fmtDur(p.Latency.Max))
}

// op is one scheduled request.
type op struct {
	seq   uint64
	due   time.Time
	stage *stageStats
}

// stageStats accumulates one stage; workers record into it concurrently.
type stageStats struct {
	mu       sync.Mutex
	latency  [numKinds]*hdrhistogram.Histogram
	failed   *hdrhistogram.Histogram // ops sent that did not succeed
	dispatch *hdrhistogram.Histogram
	errs     Errors
	ok       int64
	events   int64
	lastDone time.Time // when the stage's last op ended
	// scheduled and shed are written by the scheduler alone.
	scheduled, shed int64
	pending         sync.WaitGroup
}

func newStageStats() *stageStats {
	s := &stageStats{dispatch: newHistogram(), failed: newHistogram()}
	for k := range s.latency {
		s.latency[k] = newHistogram()
	}
	s.errs.ByStatus = map[int]int64{}
	return s
}

// interval is the progress line's window; reset once a second. sent and
// shed are counted by the scheduler, the rest by workers under mu.
type interval struct {
	sent, shed atomic.Int64
	mu         sync.Mutex
	latency    *hdrhistogram.Histogram
	ok, errs   int64
}

type generator struct {
	cfg    Config
	work   *workload
	client *http.Client
	// streams[t] are target t's ingest streams (Config.GRPCTargets).
	streams  [][]*client.IngestStream
	ops      chan op
	inFlight atomic.Int64
	// started counts workers; only the scheduler reads or writes it.
	started int
	workers sync.WaitGroup
	window  interval
}

// Run drives the plan's stages one after another against cfg.Targets and
// returns what each measured. Between stages it waits for the previous
// stage's ops to finish, so every stage is judged on its own load. A
// cancelled ctx ends the run early: the stage under way is cut short and
// reported for the time it ran; the error is then ctx's.
func Run(ctx context.Context, cfg Config, plan []Stage) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if len(plan) == 0 {
		return nil, errors.New("stress: expected a plan of at least one stage, found none")
	}
	for i, s := range plan {
		if s.Rate <= 0 || s.Duration <= 0 {
			return nil, fmt.Errorf("stress: stage %d: expected rate > 0 and duration > 0, found %g ops/s for %s", i+1, s.Rate, s.Duration)
		}
	}
	g := &generator{cfg: cfg, work: newWorkload(cfg), client: cfg.Client}
	g.window.latency = newHistogram()
	if len(cfg.GRPCTargets) > 0 {
		opts := []client.Option{client.WithRetries(0), client.WithTimeout(cfg.Timeout)}
		if cfg.TLS != nil {
			opts = append(opts, client.WithTLS(cfg.TLS))
		}
		if cfg.Token != "" {
			opts = append(opts, client.WithToken(cfg.Token))
		}
		for _, addr := range cfg.GRPCTargets {
			var ss []*client.IngestStream
			for range cfg.GRPCStreams {
				s, err := client.NewIngestStream(addr, opts...)
				if err != nil {
					return nil, err
				}
				defer s.Close()
				ss = append(ss, s)
			}
			g.streams = append(g.streams, ss)
		}
	}
	if g.client == nil {
		t := NewTransport(cfg.Connections)
		if cfg.TLS != nil {
			t.TLSClientConfig = cfg.TLS.Clone()
			// A custom TLS configuration turns net/http's automatic
			// HTTP/2 off; with it, Connections caps HTTP/2 connections,
			// each carrying up to the server's stream limit.
			t.ForceAttemptHTTP2 = !cfg.HTTP1
			if cfg.HTTP1 {
				t.TLSClientConfig.NextProtos = []string{"http/1.1"}
			}
		}
		defer t.CloseIdleConnections()
		g.client = &http.Client{Transport: t}
	}
	// Workers are started as concurrency grows, so there is always one per
	// op in flight: an op never waits for a worker, and the only
	// generator-side queueing is dispatch delay. The channel holds
	// MaxInFlight, so the scheduler's send never blocks.
	g.ops = make(chan op, cfg.MaxInFlight)
	defer func() {
		close(g.ops)
		g.workers.Wait()
	}()

	res := &Result{RunID: cfg.RunID, Config: cfg.record(), Started: time.Now()}
	var current atomic.Int64
	progressDone := make(chan struct{})
	stopProgress := make(chan struct{})
	go func() {
		defer close(progressDone)
		g.reportProgress(stopProgress, res.Started, plan, &current)
	}()
	defer func() {
		close(stopProgress)
		<-progressDone
	}()

	var seq uint64
	failures := 0
	for i, stage := range plan {
		current.Store(int64(i))
		st := newStageStats()
		start, elapsed := g.schedule(ctx, stage, st, &seq)
		st.pending.Wait()
		sr := g.finish(i, stage, start, elapsed, st)
		res.Stages = append(res.Stages, sr)
		if ctx.Err() != nil {
			break
		}
		if sr.Pass {
			failures = 0
		} else if failures++; cfg.StopAfterFailures > 0 && failures >= cfg.StopAfterFailures {
			break
		}
	}
	if len(plan) > 1 {
		if k, ok := Knee(res.Stages, cfg.SLO); ok {
			res.Knee = &k
		}
	}
	return res, ctx.Err()
}

// schedule issues the stage's ops at their due times and returns when the
// stage started and how long it ran (its Duration unless ctx ended it).
// Ops that are already due are dispatched together, each with its own due
// time, so a late wake-up costs latency — recorded — and never rate.
func (g *generator) schedule(ctx context.Context, stage Stage, st *stageStats, seq *uint64) (time.Time, time.Duration) {
	n := stage.Ops()
	start := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for i := int64(0); i < n; {
		now := time.Now()
		for ; i < n; i++ {
			due := start.Add(stage.Due(i))
			if due.After(now) {
				break
			}
			g.dispatch(op{seq: *seq, due: due, stage: st})
			*seq++
		}
		if i >= n {
			break
		}
		timer.Reset(time.Until(start.Add(stage.Due(i))))
		select {
		case <-ctx.Done():
			return start, time.Since(start)
		case <-timer.C:
		}
	}
	// The stage lasts its full duration even when its last op is due
	// earlier, so rates divide by the time the plan gave the stage.
	if rest := time.Until(start.Add(stage.Duration)); rest > 0 {
		timer.Reset(rest)
		select {
		case <-ctx.Done():
			return start, time.Since(start)
		case <-timer.C:
		}
	}
	return start, stage.Duration
}

// dispatch hands o to a worker, or sheds it when MaxInFlight ops are
// outstanding. Only the scheduler goroutine calls it.
func (g *generator) dispatch(o op) {
	st := o.stage
	st.scheduled++
	if g.inFlight.Load() >= int64(g.cfg.MaxInFlight) {
		st.shed++
		g.window.shed.Add(1)
		return
	}
	g.window.sent.Add(1)
	if n := g.inFlight.Add(1); n > int64(g.started) {
		g.started++
		g.workers.Add(1)
		go func(id uint64) {
			defer g.workers.Done()
			g.work1(id)
		}(uint64(g.started))
	}
	st.pending.Add(1)
	g.ops <- o
}

// work1 is one worker: it sends the ops it is handed, one at a time.
func (g *generator) work1(id uint64) {
	rng := mrand.New(mrand.NewPCG(g.cfg.Seed, id))
	for o := range g.ops {
		g.send(o, rng)
		g.inFlight.Add(-1)
		o.stage.pending.Done()
	}
}

// outcome of one op, for the books.
type outcome int

const (
	outcomeOK outcome = iota
	outcome503
	outcome504
	outcomeOtherStatus
	outcomeTimeout
	outcomeTransport
)

func (g *generator) send(o op, rng *mrand.Rand) {
	start := time.Now()
	kind := g.work.kind(rng)
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.Timeout)
	defer cancel()
	var res outcome
	var status int
	if g.streams != nil && kind == kindWrite && g.work.vectors == nil {
		res, status = g.sendStream(ctx, o.seq, rng)
	} else {
		res, status = g.sendHTTP(ctx, o.seq, kind, rng)
	}
	g.record(o, kind, start, res, status)
}

// sendStream writes op seq's events on its target's ingest stream.
func (g *generator) sendStream(ctx context.Context, seq uint64, rng *mrand.Rand) (outcome, int) {
	t, events := g.work.streamEvents(seq, rng)
	ss := g.streams[t]
	_, err := ss[seq%uint64(len(ss))].WriteSignals(ctx, events)
	var ae *client.APIError
	switch {
	case err == nil:
		return outcomeOK, 200
	case errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable:
		return outcome503, ae.Status
	case errors.As(err, &ae) && ae.Status == http.StatusGatewayTimeout:
		return outcome504, ae.Status
	case errors.As(err, &ae):
		return outcomeOtherStatus, ae.Status
	case errors.Is(err, context.DeadlineExceeded), client.IsTimeout(err):
		return outcomeTimeout, 0
	}
	return outcomeTransport, 0
}

// sendHTTP sends op seq as an HTTP request.
func (g *generator) sendHTTP(ctx context.Context, seq uint64, kind opKind, rng *mrand.Rand) (outcome, int) {
	method, url, body, size := g.work.request(seq, kind, rng)
	res, status := outcomeTransport, 0
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err == nil {
		if body != nil {
			req.ContentLength = size
			req.Header.Set("Content-Type", g.work.contentType())
		}
		if g.cfg.Token != "" {
			req.Header.Set("Authorization", "Bearer "+g.cfg.Token)
		}
		var resp *http.Response
		resp, err = g.client.Do(req)
		if err == nil {
			// Drain so the connection goes back to the pool.
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status = resp.StatusCode
			switch {
			case status >= 200 && status < 300:
				res = outcomeOK
			case status == http.StatusServiceUnavailable:
				res = outcome503
			case status == http.StatusGatewayTimeout:
				res = outcome504
			default:
				res = outcomeOtherStatus
			}
		} else if errors.Is(err, context.DeadlineExceeded) {
			res = outcomeTimeout
		}
	}
	return res, status
}

// record books one op's outcome.
func (g *generator) record(o op, kind opKind, start time.Time, res outcome, status int) {
	done := time.Now()
	took := done.Sub(o.due)

	st := o.stage
	st.mu.Lock()
	latency.Record(st.dispatch, start.Sub(o.due))
	if done.After(st.lastDone) {
		st.lastDone = done
	}
	if res == outcomeOK {
		latency.Record(st.latency[kind], took)
	} else {
		latency.Record(st.failed, took)
	}
	switch res {
	case outcomeOK:
		st.ok++
		st.events += int64(g.work.events(kind))
	case outcome503:
		st.errs.Unavailable++
	case outcome504:
		st.errs.Unknown++
	case outcomeOtherStatus:
		st.errs.OtherStatus++
		st.errs.ByStatus[status]++
	case outcomeTimeout:
		st.errs.Timeout++
	default:
		st.errs.Transport++
	}
	st.mu.Unlock()

	g.window.mu.Lock()
	if res == outcomeOK {
		g.window.ok++
		latency.Record(g.window.latency, took)
	} else {
		g.window.errs++
	}
	g.window.mu.Unlock()
}

// finish turns a stage's counters into its result. All its ops are done.
func (g *generator) finish(i int, stage Stage, start time.Time, elapsed time.Duration, st *stageStats) StageResult {
	ok := newHistogram()
	for _, h := range st.latency {
		ok.Merge(h)
	}
	sent := newHistogram()
	sent.Merge(ok)
	sent.Merge(st.failed)
	sr := StageResult{
		Index:         i,
		TargetRate:    stage.Rate,
		Duration:      elapsed,
		EventsPerOp:   g.work.events(kindWrite),
		Scheduled:     st.scheduled,
		OK:            st.ok,
		Events:        st.events,
		Errors:        st.errs,
		Latency:       latency.Summarize(ok),
		FailedLatency: latency.Summarize(st.failed),
		AllLatency:    latency.Summarize(sent),

		DispatchDelay: latency.Summarize(st.dispatch),
	}
	sr.Errors.Shed = st.shed
	if len(sr.Errors.ByStatus) == 0 {
		sr.Errors.ByStatus = nil
	}
	if end := start.Add(elapsed); st.lastDone.After(end) {
		sr.Drain = st.lastDone.Sub(end)
	}
	if secs := elapsed.Seconds(); secs > 0 {
		sr.OfferedRate = float64(sr.Scheduled) / secs
	}
	if secs := (elapsed + sr.Drain).Seconds(); secs > 0 {
		sr.AchievedRate = float64(sr.OK) / secs
		sr.AchievedEvents = float64(sr.Events) / secs
	}
	sr.MeanInFlight = sr.AchievedRate * sr.Latency.Mean.Seconds()
	if g.cfg.Mix == MixMixed {
		r, w := latency.Summarize(st.latency[kindRead]), latency.Summarize(st.latency[kindWrite])
		sr.Reads, sr.Writes = &r, &w
	}
	sr.Pass, sr.Reason = g.cfg.SLO.Judge(sr)
	return sr
}

// reportProgress calls cfg.Progress once a second until stop closes.
func (g *generator) reportProgress(stop <-chan struct{}, started time.Time, plan []Stage, current *atomic.Int64) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		w := &g.window
		w.mu.Lock()
		p := Progress{
			Elapsed: time.Since(started), Stage: int(current.Load()), Stages: len(plan),
			Sent: w.sent.Swap(0), OK: w.ok, Errors: w.errs, Shed: w.shed.Swap(0),
			InFlight: g.inFlight.Load(), Latency: latency.Summarize(w.latency),
		}
		w.ok, w.errs = 0, 0
		w.latency.Reset()
		w.mu.Unlock()
		p.TargetRate = plan[p.Stage].Rate
		if g.cfg.Progress != nil {
			g.cfg.Progress(p)
		}
	}
}
