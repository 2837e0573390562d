package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/bench/relay/probe"
	"github.com/tidaldb/tidal/tcp-relay/control"
)

// ab compares relay builds side by side, one phase at a time: the A/B
// numbers of bench/results/history-2026-12.md. Every target is its own
// process (the servers run in this one), each relay created through its
// HTTP API, and the measuring client is a fresh process per phase, so the
// relay's CPU time over a phase (/proc/<pid>/stat) is the cost of that
// phase's work alone: per round trip, per MB, per connection. CPU per unit of work
// moves far less with the machine's load than the timings do.
//
//	relay-bench -ab old=/tmp/tcp-relay-old,new=bin/tcp-relay [-toxiproxy bin/toxiproxy/server] -rounds 5 -duration 2s
type abTarget struct {
	name   string
	binary string // "" for direct
	toxi   bool
	cmd    *exec.Cmd
	echo   string
	sink   string
}

type abRun struct {
	Round  int               `json:"round"`
	Target string            `json:"target"`
	Phase  string            `json:"phase"`
	Load   string            `json:"load_start"`
	M      probe.Measurement `json:"measurement"`
	CPUSec float64           `json:"relay_cpu_s"` // of the relay process over the phase; 0 for direct
}

// abResult is what -ab-out writes.
type abResult struct {
	Time      time.Time         `json:"time"`
	Targets   map[string]string `json:"targets"` // name -> binary
	Rounds    int               `json:"rounds"`
	Duration  string            `json:"duration"`
	LoadStart string            `json:"load_start"`
	LoadEnd   string            `json:"load_end"`
	Runs      []abRun           `json:"runs"`
}

func runAB(spec, toxiproxy string, rounds int, d time.Duration, phases []string, out string) error {
	ctx := context.Background()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	e, err := probe.Listen("127.0.0.1:0", probe.Echo)
	if err != nil {
		return err
	}
	defer e.Close()
	s, err := probe.Listen("127.0.0.1:0", probe.Sink)
	if err != nil {
		return err
	}
	defer s.Close()
	targets := []*abTarget{{name: "direct", echo: e.Addr().String(), sink: s.Addr().String()}}
	for _, kv := range strings.Split(spec, ",") {
		name, bin, ok := strings.Cut(kv, "=")
		if !ok || name == "" || bin == "" {
			return fmt.Errorf("-ab: expected name=binary[,name=binary...], found %q", kv)
		}
		targets = append(targets, &abTarget{name: name, binary: bin})
	}
	if toxiproxy != "" {
		targets = append(targets, &abTarget{name: "toxiproxy", binary: toxiproxy, toxi: true})
	}
	defer func() {
		for _, t := range targets {
			if t.cmd != nil && t.cmd.Process != nil {
				_ = t.cmd.Process.Signal(syscall.SIGTERM)
				_ = t.cmd.Wait()
			}
		}
	}()
	for _, t := range targets[1:] {
		port, err := freePort()
		if err != nil {
			return err
		}
		api := fmt.Sprintf("127.0.0.1:%d", port)
		if t.toxi {
			t.cmd = exec.Command(t.binary, "-host", "127.0.0.1", "-port", strconv.Itoa(port))
			t.cmd.Env = append(os.Environ(), "LOG_LEVEL=warn")
		} else {
			t.cmd = exec.Command(t.binary, "--control", api, "--log-level", "warn")
		}
		t.cmd.Stderr = os.Stderr
		if err := t.cmd.Start(); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		if err := waitDial(api, 30*time.Second); err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		for i, up := range []string{e.Addr().String(), s.Addr().String()} {
			name := []string{"echo", "sink"}[i]
			var addr string
			if t.toxi {
				addr, err = createToxiproxy(ctx, api, name, up)
			} else {
				var info control.RelayInfo
				info, err = control.NewClient(api, nil).CreateRelay(ctx, control.RelayConfig{Name: name, Listen: "127.0.0.1:0", Upstream: up})
				addr = info.Listen
			}
			if err != nil {
				return fmt.Errorf("%s: creating relay %s: %w", t.name, name, err)
			}
			if i == 0 {
				t.echo = addr
			} else {
				t.sink = addr
			}
		}
	}

	res := abResult{Time: time.Now().UTC(), Targets: map[string]string{}, Rounds: rounds, Duration: d.String(), LoadStart: loadAvg()}
	for _, t := range targets {
		res.Targets[t.name] = t.binary
	}
	for round := 1; round <= rounds; round++ {
		fmt.Fprintf(os.Stderr, "relay-bench: round %d (load %s)\n", round, loadAvg())
		for _, phase := range phases {
			for i := range targets {
				t := targets[(i+round-1)%len(targets)] // rotate the order
				run := abRun{Round: round, Target: t.name, Phase: phase, Load: loadAvg()}
				before := cpuOf(t)
				cmd := exec.Command(self, "-measure", "-phases", phase, "-target", t.name, "-echo", t.echo, "-sink", t.sink, "-duration", d.String())
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				outb, err := cmd.Output()
				if err != nil {
					return fmt.Errorf("measure %s %s: %w: %s", t.name, phase, err, strings.TrimSpace(stderr.String()))
				}
				run.CPUSec = cpuOf(t) - before
				if err := json.Unmarshal(outb, &run.M); err != nil {
					return fmt.Errorf("measure %s %s: %w", t.name, phase, err)
				}
				res.Runs = append(res.Runs, run)
			}
		}
	}
	res.LoadEnd = loadAvg()
	fmt.Print(abSummary(res, targets))
	if out != "" {
		data, _ := json.MarshalIndent(res, "", "  ")
		return os.WriteFile(out, append(data, '\n'), 0o644)
	}
	return nil
}

func abSummary(res abResult, targets []*abTarget) string {
	var b strings.Builder
	fmt.Fprintf(&b, "relay A/B %s, %d rounds, %s per phase, load %s -> %s; medians over rounds\n\n",
		res.Time.Format(time.RFC3339), res.Rounds, res.Duration, res.LoadStart, res.LoadEnd)
	med := func(target, phase string, f func(r abRun) float64) float64 {
		var xs []float64
		for _, r := range res.Runs {
			if r.Target == target && r.Phase == phase {
				xs = append(xs, f(r))
			}
		}
		return median(xs)
	}
	fmt.Fprintf(&b, "| target | RTT p50 µs | p99 µs | p99.9 µs | added p50 µs | relay CPU µs/RTT | bulk MB/s | ×direct | relay CPU µs/MB | conns/s | ×direct | relay CPU µs/conn |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	dp50 := med("direct", "rtt", func(r abRun) float64 { return r.M.RTTP50us })
	dbulk := med("direct", "bulk", func(r abRun) float64 { return r.M.BulkMBps })
	dconn := med("direct", "conns", func(r abRun) float64 { return r.M.ConnsPerSec })
	for _, t := range targets {
		p50 := med(t.name, "rtt", func(r abRun) float64 { return r.M.RTTP50us })
		cpu := func(phase string, per func(m probe.Measurement) float64) string {
			if t.binary == "" {
				return "-"
			}
			return fmt.Sprintf("%.1f", med(t.name, phase, func(r abRun) float64 { return r.CPUSec * 1e6 / max(per(r.M), 1) }))
		}
		bulk := med(t.name, "bulk", func(r abRun) float64 { return r.M.BulkMBps })
		conns := med(t.name, "conns", func(r abRun) float64 { return r.M.ConnsPerSec })
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %+.1f | %s | %.0f | %.2f | %s | %.0f | %.2f | %s |\n", t.name,
			p50, med(t.name, "rtt", func(r abRun) float64 { return r.M.RTTP99us }), med(t.name, "rtt", func(r abRun) float64 { return r.M.RTTP999us }),
			p50-dp50, cpu("rtt", func(m probe.Measurement) float64 { return float64(m.RTTCount) }),
			bulk, bulk/dbulk, cpu("bulk", func(m probe.Measurement) float64 { return float64(m.BulkBytes) / 1e6 }),
			conns, conns/dconn, cpu("conns", func(m probe.Measurement) float64 { return float64(m.Conns) }))
	}
	if slices.ContainsFunc(res.Runs, func(r abRun) bool { return r.Phase == "conns16" }) {
		dpar := med("direct", "conns16", func(r abRun) float64 { return r.M.ParallelConnsPerSec })
		fmt.Fprintf(&b, "\n| target | conns/s, %d clients | ×direct | relay CPU µs/conn |\n|---|---|---|---|\n", probe.ParallelClients)
		for _, t := range targets {
			c := med(t.name, "conns16", func(r abRun) float64 { return r.M.ParallelConnsPerSec })
			cpu := "-"
			if t.binary != "" {
				cpu = fmt.Sprintf("%.1f", med(t.name, "conns16", func(r abRun) float64 { return r.CPUSec * 1e6 / max(float64(r.M.Conns), 1) }))
			}
			fmt.Fprintf(&b, "| %s | %.0f | %.2f | %s |\n", t.name, c, c/dpar, cpu)
		}
	}
	b.WriteString("\n| round | phase | target | load at start | RTT p50 µs | bulk MB/s | conns/s | relay CPU s |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range res.Runs {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %.1f | %.0f | %.0f | %.2f |\n", r.Round, r.Phase, r.Target, r.Load, r.M.RTTP50us, r.M.BulkMBps, max(r.M.ConnsPerSec, r.M.ParallelConnsPerSec), r.CPUSec)
	}
	return b.String()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cpuOf is the CPU time (user + system) the target's process has used, in
// seconds; 0 for direct.
func cpuOf(t *abTarget) float64 {
	if t.cmd == nil || t.cmd.Process == nil {
		return 0
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", t.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: fields count from the
	// closing parenthesis. utime and stime are fields 14 and 15.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ is 100 on Linux
}

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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func waitDial(addr string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("expected %s to accept connections within %s, found: %v", addr, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createToxiproxy creates a proxy through Toxiproxy's HTTP API and
// returns the address it listens on (as tidal-bench -side-by-side does).
func createToxiproxy(ctx context.Context, api, name, upstream string) (string, error) {
	body, _ := json.Marshal(map[string]any{"name": name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+api+"/proxies", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("expected 201, found %s: %s", resp.Status, data)
	}
	var p struct {
		Listen string `json:"listen"`
	}
	if err := json.Unmarshal(data, &p); err != nil || p.Listen == "" {
		return "", fmt.Errorf("expected the listen address in the answer, found %s", data)
	}
	return p.Listen, nil
}
