package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	gproc "github.com/shirou/gopsutil/v4/process"

	"github.com/tidaldb/tidal/bench/closedloop"
	"github.com/tidaldb/tidal/bench/relay/probe"
	"github.com/tidaldb/tidal/harness/process"
	"github.com/tidaldb/tidal/tcp-relay/control"
)

// The side-by-side benchmark (-side-by-side; `make bench-compare`):
// tidal-server against etcd, and tcp-relay against direct loopback and
// Toxiproxy, measured one after the other on this machine with the same
// tools, in alternating rounds, and reported as medians. ci/bench installs
// etcd and Toxiproxy first when they are absent.

// sbsOptions are the -side-by-side flags.
type sbsOptions struct {
	rounds        int
	clients       string
	warmup        time.Duration
	duration      time.Duration
	opTimeout     time.Duration
	etcdConns     int
	batchClients  int
	batchSize     int
	relayDuration time.Duration
	etcd          string
	toxiproxy     string
	skipStores    bool
	skipRelay     bool
	// baseline, when set, is another tidal-server binary measured in
	// etcd's place: an A/B of two builds with the same rounds, loads and
	// report (rows then read "baseline" where they say etcd).
	baseline string
	// tidalFlags are extra tidal-server flags of the measured build (not
	// the baseline's), e.g. "--pack-proposals".
	tidalFlags string
	// protocol is how the measured tidal is written: http or grpc (its
	// nodes then serve --grpc-addr); baselineProtocol the same for the
	// baseline build. An A/B of HTTP against the ingest stream is one
	// build in both slots: -baseline BIN -baseline-protocol http
	// -protocol grpc.
	protocol         string
	baselineProtocol string
	grpcStreams      int
	// tlsAB measures this build twice: plaintext in etcd's place and
	// secured (--certs-dir on every node, storeload over TLS with a
	// writer certificate) in tidal's: the cost of TLS.
	// Both are written with protocol (-tls-ab -protocol grpc: the stream
	// in plaintext against the stream over TLS). tlsHTTP1 keeps the
	// secured HTTP clients on HTTP/1.1.
	tlsAB    bool
	tlsHTTP1 bool
}

// abBaseline reports whether etcd's place holds a tidal-server (an A/B).
func (so sbsOptions) abBaseline() bool { return so.baseline != "" || so.tlsAB }

// protocolOf is how the tidal-server in system's slot is written: the
// measured build (tidal's slot) with -protocol; etcd's slot, holding a
// tidal-server in an A/B, with -baseline-protocol for -baseline and with
// -protocol for -tls-ab (the same build and transport, only TLS differs).
func (so sbsOptions) protocolOf(system string) string {
	if system == "etcd" && !so.tlsAB {
		return so.baselineProtocol
	}
	return so.protocol
}

// checkProtocols refuses transports that do not exist and combinations
// that cannot be measured as asked.
func (so sbsOptions) checkProtocols() error {
	for _, f := range []struct{ name, value string }{{"-protocol", so.protocol}, {"-baseline-protocol", so.baselineProtocol}} {
		if f.value != "http" && f.value != "grpc" {
			return fmt.Errorf("%s: expected http or grpc, found %q", f.name, f.value)
		}
	}
	if so.tlsHTTP1 && so.protocol == "grpc" {
		// gRPC is HTTP/2 only: the stream cannot be moved to HTTP/1.1.
		return errors.New("-tls-http1 and -protocol grpc: expected one, found both (the ingest stream is always HTTP/2)")
	}
	return nil
}

// sharedMachineNote goes into every side-by-side file.
const sharedMachineNote = "the machine is shared with other engineers' builds and tests and is noisy: " +
	"read each figure against the load averages of its round, compare only figures of the same file, " +
	"and treat ratios near 1 as level; no test asserts any of these timings"

// relayTargets are the relay comparison's targets, in the summary's order.
var relayTargets = []string{"direct", "tcp-relay", "toxiproxy"}

func parseClients(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-sbs-clients: expected positive integers separated by commas, found %q", s)
		}
		out = append(out, n)
	}
	return out, nil
}

func runSideBySide(ctx context.Context, o options) (err error) {
	so := o.sbs
	clients, err := parseClients(so.clients)
	if err != nil {
		return err
	}
	if so.rounds < 1 {
		return fmt.Errorf("-rounds: expected at least 1, found %d", so.rounds)
	}
	switch {
	case so.tlsAB && so.baseline != "":
		return errors.New("-tls-ab and -baseline: expected one, found both (-tls-ab compares this build with itself)")
	case so.tlsHTTP1 && !so.tlsAB:
		return errors.New("-tls-http1: needs -tls-ab")
	}
	if err := so.checkProtocols(); err != nil {
		return err
	}
	repo, outDir, work, err := workspace(o.repo, o.out, "tidal-bench-sbs-")
	if err != nil {
		return err
	}
	defer removeWork(work, o.keep, &err)

	started := time.Now()
	res := &sideBySide{Schema: 1, Kind: sideBySideKind, Time: started.UTC(), Quick: o.quick, Note: sharedMachineNote,
		Config: sbsConfig{TidalFlags: so.tidalFlags, Baseline: so.baseline, TLSAB: so.tlsAB, TLSHTTP1: so.tlsHTTP1,
			Protocol: so.protocol, BaselineProtocol: so.protocolOf("etcd"), GRPCStreams: so.grpcStreams, Rounds: so.rounds, Clients: clients, Warmup: so.warmup, Duration: so.duration, OpTimeout: so.opTimeout,
			EtcdConns: so.etcdConns, BatchClients: so.batchClients, BatchSize: so.batchSize, RelayDuration: so.relayDuration}}
	if res.Env, err = environment(ctx, repo); err != nil {
		return err
	}
	stem := res.Time.Format("2006-01-02") + "-" + res.Env.Commit + "-" + sideBySideKind
	fmt.Printf("tidal-bench: side by side %s, %s, %d cores, load %s\n", stem, res.Env.CPUModel, res.Env.Cores, res.Env.LoadStart)

	bin := filepath.Join(work, "bin")
	for name, pkg := range map[string]string{"tidal-server": "./tidal-server", "tcp-relay": "./tcp-relay", "relay-bench": "./bench/relay"} {
		if err := build(ctx, repo, pkg, filepath.Join(bin, name)); err != nil {
			return err
		}
	}
	// storeload is its own module (etcd's client stays out of go.mod).
	if err := build(ctx, filepath.Join(repo, "bench", "storeload"), ".", filepath.Join(bin, "storeload")); err != nil {
		return err
	}

	if !so.skipStores {
		var etcdBin string
		if so.tlsAB {
			etcdBin = filepath.Join(bin, "tidal-server")
			res.EtcdVersion = "plaintext tidal-server (this build)"
			stem += "-tls"
			if so.tlsHTTP1 {
				stem += "-h1"
			}
			if so.protocol == "grpc" {
				stem += "-grpc"
			}
		} else if so.baseline != "" {
			if etcdBin, err = filepath.Abs(so.baseline); err != nil {
				return err
			}
			res.EtcdVersion = "baseline tidal-server " + etcdBin
			stem += "-ab"
		} else if etcdBin, err = exec.LookPath(so.etcd); err != nil {
			return fmt.Errorf("etcd binary %q: %w (./ci/bench -side-by-side installs etcd-server from Debian)", so.etcd, err)
		} else {
			res.EtcdVersion = firstLine(ctx, etcdBin, "--version")
		}
		for round := 1; round <= so.rounds; round++ {
			for _, system := range []string{"etcd", "tidal"} {
				rd, err := storeRoundOf(ctx, so, clients, system, round, etcdBin, bin, filepath.Join(work, fmt.Sprintf("%s-r%d", system, round)))
				if err != nil {
					return err
				}
				res.StoreRounds = append(res.StoreRounds, rd)
			}
		}
		res.Stores = storeRows(res.StoreRounds, clients)
		if so.batchClients > 0 {
			bt := statOf(res.StoreRounds, "tidal", so.batchClients, so.batchSize)
			res.Batch = &bt
		}
	}
	if !so.skipRelay {
		if so.toxiproxy == "" {
			return errors.New("-toxiproxy: expected the path of Toxiproxy's server binary (./ci/bench -side-by-side builds it into bin/toxiproxy)")
		}
		res.ToxiproxyVersion = moduleVersion(ctx, so.toxiproxy)
		res.Config.ToxiproxyEnv = toxiproxyEnv
		if res.RelayRounds, err = relayRounds(ctx, so, bin, filepath.Join(work, "relay")); err != nil {
			return err
		}
		res.Relay = relayStats(res.RelayRounds, relayTargets)
	}
	res.Env.LoadEnd = loadAvg()
	res.Seconds = time.Since(started).Seconds()

	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	jsonPath := filepath.Join(outDir, stem+".json")
	if err := os.WriteFile(jsonPath, append(data, '\n'), 0o644); err != nil {
		return err
	}
	md := sideBySideSummary(res)
	mdPath := filepath.Join(outDir, stem+".md")
	if err := os.WriteFile(mdPath, []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print("\n", md)
	fmt.Printf("tidal-bench: wrote %s and %s in %.0fs\n", jsonPath, mdPath, res.Seconds)
	return nil
}

// renderSideBySide rewrites the summary of a side-by-side results file.
func renderSideBySide(path string, data []byte) error {
	var r sideBySide
	if err := json.Unmarshal(data, &r); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(strings.TrimSuffix(path, ".json")+".md", []byte(sideBySideSummary(&r)), 0o644)
}

// storeCluster is what a round needs of an etcd or tidal cluster.
type storeCluster interface {
	endpoints() []string
	members() []*process.Process
	stop() error
}

func (c *etcdCluster) endpoints() []string         { return c.clients }
func (c *cluster) endpoints() []string             { return c.clients }
func (c *etcdCluster) members() []*process.Process { return c.nodes }
func (c *cluster) members() []*process.Process     { return c.nodes }

// clusterCPUSeconds is the user + system CPU time the members have used so
// far, all together.
func clusterCPUSeconds(c storeCluster) (float64, error) {
	var sum float64
	for _, p := range c.members() {
		gp, err := gproc.NewProcess(int32(p.PID()))
		if err != nil {
			return 0, fmt.Errorf("%s (pid %d): %w", p.Name(), p.PID(), err)
		}
		t, err := gp.Times()
		if err != nil {
			return 0, fmt.Errorf("%s (pid %d): CPU times: %w", p.Name(), p.PID(), err)
		}
		sum += t.User + t.System
	}
	return sum, nil
}

// storeRoundOf starts a fresh cluster of system, runs storeload at every
// client count (and, for tidal, the batched run), and stops the cluster.
func storeRoundOf(ctx context.Context, so sbsOptions, clients []int, system string, round int, etcdBin, bin, dir string) (rd storeRound, err error) {
	rd = storeRound{System: system, Round: round, LoadStart: loadAvg()}
	label := roundName(sbsConfig{TLSAB: so.tlsAB, Baseline: so.baseline}, system)
	fmt.Printf("tidal-bench: round %d, %s (load %s)\n", round, label, rd.LoadStart)
	var c storeCluster
	var secure *clusterCerts
	loadSystem := system
	switch {
	case system == "etcd" && so.abBaseline():
		// The A/B baseline: another tidal-server build, or this one in
		// plaintext, in etcd's slot.
		c, err = startCluster(ctx, etcdBin, dir, 3, nodeOptions{grpc: so.protocolOf(system) == "grpc"})
		loadSystem = "tidal"
	case system == "etcd":
		c, err = startEtcd(ctx, etcdBin, dir, 3)
	default:
		if so.tlsAB {
			if secure, err = makeClusterCerts(filepath.Join(dir, "certs"), 3); err != nil {
				return rd, err
			}
		}
		c, err = startCluster(ctx, filepath.Join(bin, "tidal-server"), dir, 3,
			nodeOptions{secure: secure, grpc: so.protocolOf(system) == "grpc", extra: strings.Fields(so.tidalFlags)})
	}
	if err != nil {
		return rd, err
	}
	defer func() {
		if stopErr := c.stop(); err == nil && stopErr != nil {
			err = fmt.Errorf("stopping the %s cluster of round %d: %w", system, round, stopErr)
		}
	}()
	type run struct{ clients, batch int }
	runs := []run{}
	for _, n := range clients {
		runs = append(runs, run{n, 1})
	}
	if (system == "tidal" || so.abBaseline()) && so.batchClients > 0 {
		runs = append(runs, run{so.batchClients, so.batchSize})
	}
	for _, r := range runs {
		cpu0, err := clusterCPUSeconds(c)
		if err != nil {
			return rd, err
		}
		lt := loadTarget{system: loadSystem, protocol: so.protocolOf(system), endpoints: c.endpoints(), secure: secure}
		if tc, ok := c.(*cluster); ok {
			lt.grpcEndpoints = tc.grpc
		}
		rec, err := storeload(ctx, so, filepath.Join(bin, "storeload"), lt, r.clients, r.batch, dir)
		if err != nil {
			return rd, err
		}
		cpu1, err := clusterCPUSeconds(c)
		if err != nil {
			return rd, err
		}
		rec.ServerCPUSeconds = cpu1 - cpu0
		fmt.Printf("tidal-bench:   %s %3d clients × %d events: %s writes/s, p50 %s p99 %s p99.9 %s, %d errors; CPU µs/write: servers %.0f, load tool %.0f\n",
			label, r.clients, r.batch, fmtRate(rec.OpsPerSec), ms(rec.Latency.P50), ms(rec.Latency.P99), ms(rec.Latency.P999), rec.Errors,
			1e6*rec.CPUPerOp(rec.ServerCPUSeconds), 1e6*rec.CPUPerOp(rec.ToolCPUSeconds))
		rd.Runs = append(rd.Runs, rec)
	}
	rd.LoadEnd = loadAvg()
	return rd, nil
}

// loadTarget is what one storeload run writes to: storeload's -system, the
// transport (tidal only), the members' client and gRPC ingest addresses,
// and a secured cluster's certificates (nil: plaintext).
type loadTarget struct {
	system, protocol string
	endpoints        []string
	grpcEndpoints    []string
	secure           *clusterCerts
}

// storeloadArgs are storeload's flags for one run: TLS and the transport
// are independent (-tls-ab -protocol grpc writes the stream over TLS).
func storeloadArgs(so sbsOptions, lt loadTarget, clients, batch int, jsonPath string) []string {
	args := []string{"-system", lt.system, "-endpoints", strings.Join(lt.endpoints, ","),
		"-clients", strconv.Itoa(clients), "-batch", strconv.Itoa(batch),
		"-warmup", so.warmup.String(), "-duration", so.duration.String(), "-timeout", so.opTimeout.String(),
		"-json", jsonPath}
	if lt.system == "etcd" {
		args = append(args, "-etcd-conns", strconv.Itoa(so.etcdConns))
	}
	if lt.system == "tidal" && lt.protocol == "grpc" {
		args = append(args, "-protocol", "grpc", "-grpc-endpoints", strings.Join(lt.grpcEndpoints, ","), "-grpc-streams", strconv.Itoa(max(so.grpcStreams, 1)))
	}
	if lt.secure != nil {
		args = append(args, "-certs-dir", lt.secure.clientDir, "-cert-name", benchClientName)
		if so.tlsHTTP1 {
			args = append(args, "-http1")
		}
	}
	return args
}

// storeload runs the load tool once and reads its record.
func storeload(ctx context.Context, so sbsOptions, bin string, lt loadTarget, clients, batch int, dir string) (closedloop.Record, error) {
	var rec closedloop.Record
	label := fmt.Sprintf("storeload-c%d-b%d", clients, batch)
	jsonPath := filepath.Join(dir, label+".json")
	args := storeloadArgs(so, lt, clients, batch, jsonPath)
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return rec, fmt.Errorf("storeload %s: %w: %s (cluster logs in %s)", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()), dir)
	}
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, fmt.Errorf("%s: %w", jsonPath, err)
	}
	return rec, nil
}

// toxiproxyEnv quiets Toxiproxy's per-connection log line ("Accepted
// client", at info with the caller's file and line), which would otherwise
// be a cost tcp-relay (debug level) does not pay: it gets its best setting.
var toxiproxyEnv = []string{"LOG_LEVEL=warn"}

// relayRounds starts the servers, tcp-relay and Toxiproxy as processes,
// creates an echo and a sink relay in each through its HTTP API, and runs
// the measuring client against every target in every round.
func relayRounds(ctx context.Context, so sbsOptions, bin, dir string) (_ []relayRound, err error) {
	ports, err := freePorts(4)
	if err != nil {
		return nil, err
	}
	echoAddr, sinkAddr := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	relayAPI, toxiAPI := fmt.Sprintf("127.0.0.1:%d", ports[2]), fmt.Sprintf("127.0.0.1:%d", ports[3])
	var procs []*process.Process
	defer func() {
		for _, p := range procs {
			tctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if stopErr := p.Terminate(tctx); err == nil && stopErr != nil {
				err = stopErr
			}
			cancel()
		}
	}()
	start := func(name, binary string, env []string, args ...string) error {
		p, err := process.Start(process.Spec{Name: name, Binary: binary, Args: args, Dir: dir,
			LogPath: filepath.Join(dir, name+".log"), Env: env}, nil)
		if err != nil {
			return err
		}
		procs = append(procs, p)
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := start("servers", filepath.Join(bin, "relay-bench"), nil, "-serve", "-echo", echoAddr, "-sink", sinkAddr); err != nil {
		return nil, err
	}
	if err := start("tcp-relay", filepath.Join(bin, "tcp-relay"), nil, "--control", relayAPI, "--log-level", "warn"); err != nil {
		return nil, err
	}
	if err := start("toxiproxy", so.toxiproxy, toxiproxyEnv, "-host", "127.0.0.1", "-port", strconv.Itoa(ports[3])); err != nil {
		return nil, err
	}
	for _, addr := range []string{echoAddr, sinkAddr, relayAPI, toxiAPI} {
		if err := waitListening(ctx, addr, 30*time.Second, procs); err != nil {
			return nil, err
		}
	}
	api := control.NewClient(relayAPI, nil)
	addrs := map[string][2]string{"direct": {echoAddr, sinkAddr}}
	var relayed, toxied [2]string
	for i, up := range []string{echoAddr, sinkAddr} {
		name := []string{"echo", "sink"}[i]
		info, err := api.CreateRelay(ctx, control.RelayConfig{Name: name, Listen: "127.0.0.1:0", Upstream: up})
		if err != nil {
			return nil, fmt.Errorf("tcp-relay: creating relay %s: %w", name, err)
		}
		relayed[i] = info.Listen
		if toxied[i], err = createToxiproxy(ctx, toxiAPI, name, up); err != nil {
			return nil, err
		}
	}
	addrs["tcp-relay"], addrs["toxiproxy"] = relayed, toxied

	var rounds []relayRound
	for round := 1; round <= so.rounds; round++ {
		rd := relayRound{Round: round, LoadStart: loadAvg()}
		fmt.Printf("tidal-bench: relay round %d (load %s)\n", round, rd.LoadStart)
		for i := range relayTargets {
			target := relayTargets[(i+round-1)%len(relayTargets)] // rotate the order
			m, err := measureRelay(ctx, filepath.Join(bin, "relay-bench"), target, addrs[target], so.relayDuration)
			if err != nil {
				return nil, err
			}
			fmt.Printf("tidal-bench:   %-9s p50 %.1f µs, p99 %.1f µs, bulk %.0f MB/s, %.0f connections/s\n", target, m.RTTP50us, m.RTTP99us, m.BulkMBps, m.ConnsPerSec)
			rd.Runs = append(rd.Runs, m)
		}
		rd.LoadEnd = loadAvg()
		rounds = append(rounds, rd)
	}
	for _, p := range procs {
		if !p.Running() {
			return nil, fmt.Errorf("%s exited during the relay rounds: %v (log %s)", p.Name(), p.ExitErr(), p.LogPath())
		}
	}
	return rounds, nil
}

// relayPhases are the measurements of every relay round: the default
// three, then connections/s with 16 clients at once (probe.ExtraPhases),
// the same client and concurrency for every target.
const relayPhases = "rtt,bulk,conns,conns16"

// measureRelay runs the measuring client as its own process.
func measureRelay(ctx context.Context, bin, target string, addrs [2]string, d time.Duration) (probe.Measurement, error) {
	var m probe.Measurement
	cmd := exec.CommandContext(ctx, bin, "-measure", "-phases", relayPhases, "-target", target, "-echo", addrs[0], "-sink", addrs[1], "-duration", d.String())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return m, fmt.Errorf("relay-bench -measure %s: %w: %s", target, err, strings.TrimSpace(stderr.String()))
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return m, fmt.Errorf("relay-bench -measure %s: expected one JSON measurement, found %q: %w", target, out, err)
	}
	return m, nil
}

// createToxiproxy creates a proxy through Toxiproxy's HTTP API (POST
// /proxies) and returns the address it listens on.
func createToxiproxy(ctx context.Context, api, name, upstream string) (string, error) {
	body, _ := json.Marshal(map[string]any{"name": name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/proxies", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: nil}}).Do(req)
	if err != nil {
		return "", fmt.Errorf("toxiproxy: creating proxy %s: %w", name, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("toxiproxy: creating proxy %s: expected 201, found %s: %s", name, resp.Status, data)
	}
	var p struct {
		Listen string `json:"listen"`
	}
	if err := json.Unmarshal(data, &p); err != nil || p.Listen == "" || strings.HasSuffix(p.Listen, ":0") {
		return "", fmt.Errorf("toxiproxy: creating proxy %s: expected the bound listen address in the answer, found %s", name, data)
	}
	return p.Listen, nil
}

// waitListening waits until addr accepts connections, failing early if one
// of procs exits.
func waitListening(ctx context.Context, addr string, within time.Duration, procs []*process.Process) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		for _, p := range procs {
			if !p.Running() {
				return fmt.Errorf("%s exited while starting: %v (log %s)", p.Name(), p.ExitErr(), p.LogPath())
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("expected %s to accept connections within %s, found: %v", addr, within, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// moduleVersion is the main module and Go version a Go binary was built
// from (`go version -m`): Toxiproxy built by go install reports its own
// version as "git".
func moduleVersion(ctx context.Context, binary string) string {
	out, err := exec.CommandContext(ctx, "go", "version", "-m", binary).Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	var goVersion, mod string
	for i, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case i == 0 && len(f) == 2:
			goVersion = f[1]
		case len(f) >= 3 && f[0] == "mod":
			mod = f[1] + " " + f[2]
		}
	}
	if mod == "" {
		return "unknown (no module information in " + binary + ")"
	}
	return fmt.Sprintf("%s (built with %s)", mod, goVersion)
}

// firstLine runs binary with args and returns the first line it prints.
func firstLine(ctx context.Context, binary string, args ...string) string {
	out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if err != nil && line == "" {
		return "unknown (" + err.Error() + ")"
	}
	return strings.TrimSpace(line)
}
