package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tidaldb/tidal/bench/closedloop"
	"github.com/tidaldb/tidal/bench/relay/probe"
)

// sideBySideKind marks a results file as a side-by-side run; the cluster
// benchmark's comparison with earlier runs skips such files.
const sideBySideKind = "side-by-side"

// sideBySide is bench/results/<date>-<commit>-side-by-side.json: every
// round as measured, and the medians the summary shows.
type sideBySide struct {
	Schema  int       `json:"schema"`
	Kind    string    `json:"kind"`
	Time    time.Time `json:"time"`
	Quick   bool      `json:"quick,omitempty"`
	Seconds float64   `json:"seconds"`
	Env     env       `json:"env"`
	Config  sbsConfig `json:"config"`
	// Versions of what tidal is compared with, as their binaries say.
	EtcdVersion      string `json:"etcd_version,omitempty"`
	ToxiproxyVersion string `json:"toxiproxy_version,omitempty"`
	Note             string `json:"note"`

	StoreRounds []storeRound `json:"store_rounds,omitempty"`
	RelayRounds []relayRound `json:"relay_rounds,omitempty"`

	Stores []storeRow  `json:"stores,omitempty"` // medians per client count
	Batch  *storeStat  `json:"batch,omitempty"`  // tidal, batched ingestion
	Relay  []relayStat `json:"relay,omitempty"`  // medians per target
}

// sbsConfig is how the run was made.
type sbsConfig struct {
	Rounds        int           `json:"rounds"`
	Clients       []int         `json:"clients"`
	Warmup        time.Duration `json:"warmup_ns"`
	Duration      time.Duration `json:"duration_ns"`
	OpTimeout     time.Duration `json:"op_timeout_ns"`
	EtcdConns     int           `json:"etcd_conns"`
	BatchClients  int           `json:"batch_clients"`
	BatchSize     int           `json:"batch_size"`
	RelayDuration time.Duration `json:"relay_duration_ns"`
	// TidalFlags are the measured tidal-server's extra flags; Baseline,
	// when set, the other tidal-server build measured in etcd's place.
	TidalFlags string `json:"tidal_flags,omitempty"`
	Baseline   string `json:"baseline,omitempty"`
	// Protocol is how the measured tidal was written (http, grpc: the
	// ingest stream); BaselineProtocol how etcd's slot was, when it held a
	// tidal-server (-baseline, or -tls-ab: then the same as Protocol);
	// GRPCStreams the streams the gRPC workers shared. "" in older files:
	// http.
	Protocol         string `json:"protocol,omitempty"`
	BaselineProtocol string `json:"baseline_protocol,omitempty"`
	GRPCStreams      int    `json:"grpc_streams,omitempty"`
	// TLSAB: etcd's place held this build in plaintext, tidal's the same
	// build secured (--certs-dir); TLSHTTP1: its clients spoke HTTP/1.1.
	TLSAB        bool     `json:"tls_ab,omitempty"`
	TLSHTTP1     bool     `json:"tls_http1,omitempty"`
	ToxiproxyEnv []string `json:"toxiproxy_env,omitempty"`
}

// storeRound is one system's round: a fresh 3-member cluster, then one
// closed-loop run per client count (and, for tidal, the batched run).
type storeRound struct {
	System    string              `json:"system"`
	Round     int                 `json:"round"`
	LoadStart string              `json:"load_avg_start"`
	LoadEnd   string              `json:"load_avg_end"`
	Runs      []closedloop.Record `json:"runs"`
}

// relayRound is one round of the relay comparison: every target measured
// once, in an order that rotates from round to round.
type relayRound struct {
	Round     int                 `json:"round"`
	LoadStart string              `json:"load_avg_start"`
	LoadEnd   string              `json:"load_avg_end"`
	Runs      []probe.Measurement `json:"runs"`
}

// storeStat is one system at one client count over the rounds: medians of
// the rounds' figures (not a merged histogram: each round is one sample
// of a noisy machine), and the rounds' range of writes/s.
type storeStat struct {
	Rounds        int           `json:"rounds"`
	OpsPerSec     float64       `json:"ops_per_s"` // median
	OpsMin        float64       `json:"ops_per_s_min"`
	OpsMax        float64       `json:"ops_per_s_max"`
	EventsPerSec  float64       `json:"events_per_s"` // median
	P50           time.Duration `json:"p50_ns"`
	P99           time.Duration `json:"p99_ns"`
	P999          time.Duration `json:"p999_ns"`
	Errors        int64         `json:"errors"` // over all rounds
	LeaderChanges int           `json:"leader_changes"`
	// Medians of CPU µs per request (every member together; the load
	// tool), over the whole run (closedloop.Record.CPUPerOp).
	ServerCPUus float64 `json:"server_cpu_us_per_op"`
	ToolCPUus   float64 `json:"tool_cpu_us_per_op"`
}

// storeRow is one line of the store table.
type storeRow struct {
	Clients int       `json:"clients"`
	Etcd    storeStat `json:"etcd"`
	Tidal   storeStat `json:"tidal"`
	// Ratio is tidal's median writes/s over etcd's (0: one is missing).
	Ratio float64 `json:"ratio"`
}

// relayStat is one relay target over the rounds: medians.
type relayStat struct {
	Target      string  `json:"target"`
	Rounds      int     `json:"rounds"`
	RTTP50us    float64 `json:"rtt_p50_us"`
	RTTP99us    float64 `json:"rtt_p99_us"`
	RTTP999us   float64 `json:"rtt_p999_us"`
	BulkMBps    float64 `json:"bulk_mb_per_s"`
	ConnsPerSec float64 `json:"conns_per_s"`
	// With probe.ParallelClients clients at once; 0 in results from
	// before the phase was measured.
	ParallelConnsPerSec float64 `json:"parallel_conns_per_s,omitempty"`
	ConnErrors          int     `json:"conn_errors"` // over all rounds
}

// statOf summarises the runs of system at clients and batch size batch
// over every round.
func statOf(rounds []storeRound, system string, clients, batch int) storeStat {
	var ops, events, p50, p99, p999, server, tool []float64
	var st storeStat
	for _, r := range rounds {
		if r.System != system {
			continue
		}
		for _, run := range r.Runs {
			if run.Clients != clients || run.Batch != batch {
				continue
			}
			st.Rounds++
			ops = append(ops, run.OpsPerSec)
			events = append(events, run.EventsPerSec)
			p50 = append(p50, float64(run.Latency.P50))
			p99 = append(p99, float64(run.Latency.P99))
			p999 = append(p999, float64(run.Latency.P999))
			server = append(server, 1e6*run.CPUPerOp(run.ServerCPUSeconds))
			tool = append(tool, 1e6*run.CPUPerOp(run.ToolCPUSeconds))
			st.Errors += run.Errors
			if run.LeaderChanged {
				st.LeaderChanges++
			}
		}
	}
	if st.Rounds == 0 {
		return st
	}
	st.OpsPerSec, st.EventsPerSec = median(ops), median(events)
	st.OpsMin, st.OpsMax = slices.Min(ops), slices.Max(ops)
	st.P50, st.P99, st.P999 = time.Duration(median(p50)), time.Duration(median(p99)), time.Duration(median(p999))
	st.ServerCPUus, st.ToolCPUus = median(server), median(tool)
	return st
}

// storeRows is the store table: one row per client count.
func storeRows(rounds []storeRound, clients []int) []storeRow {
	var rows []storeRow
	for _, c := range clients {
		row := storeRow{Clients: c, Etcd: statOf(rounds, "etcd", c, 1), Tidal: statOf(rounds, "tidal", c, 1)}
		if row.Etcd.OpsPerSec > 0 && row.Tidal.Rounds > 0 {
			row.Ratio = row.Tidal.OpsPerSec / row.Etcd.OpsPerSec
		}
		rows = append(rows, row)
	}
	return rows
}

// relayStats summarises every target over the rounds, in targets' order.
func relayStats(rounds []relayRound, targets []string) []relayStat {
	var out []relayStat
	for _, t := range targets {
		var p50, p99, p999, bulk, conns, parallel []float64
		st := relayStat{Target: t}
		for _, r := range rounds {
			for _, m := range r.Runs {
				if m.Target != t {
					continue
				}
				st.Rounds++
				p50, p99, p999 = append(p50, m.RTTP50us), append(p99, m.RTTP99us), append(p999, m.RTTP999us)
				bulk, conns = append(bulk, m.BulkMBps), append(conns, m.ConnsPerSec)
				parallel = append(parallel, m.ParallelConnsPerSec)
				st.ConnErrors += m.ConnErrors
			}
		}
		if st.Rounds > 0 {
			st.RTTP50us, st.RTTP99us, st.RTTP999us = median(p50), median(p99), median(p999)
			st.BulkMBps, st.ConnsPerSec, st.ParallelConnsPerSec = median(bulk), median(conns), median(parallel)
		}
		out = append(out, st)
	}
	return out
}

// sideBySideSummary renders the Markdown next to the results file.
func sideBySideSummary(r *sideBySide) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	dirty := ""
	if r.Env.Dirty {
		dirty = " (uncommitted changes)"
	}
	p("# tidal side by side %s, commit %s%s\n\n", r.Time.Format("2006-01-02 15:04 MST"), r.Env.Commit, dirty)
	p("- CPU: %s, %d cores, %s/%s; Go: %s\n", r.Env.CPUModel, r.Env.Cores, r.Env.OS, r.Env.Arch, r.Env.GoVersion)
	p("- load average (1/5/15 min): %s at start, %s at end; per round below\n", r.Env.LoadStart, r.Env.LoadEnd)
	p("- %s\n", r.Note)
	if r.Config.TidalFlags != "" {
		p("- tidal-server nodes ran with the extra flags `%s`\n", r.Config.TidalFlags)
	}
	switch {
	case r.Config.Protocol == "grpc" && r.Config.TLSAB:
		p("- both sides were written on the gRPC ingest stream (%d stream(s) shared by the workers), not HTTP\n", max(r.Config.GRPCStreams, 1))
	case r.Config.Protocol == "grpc":
		p("- the measured tidal-server was written on the gRPC ingest stream (%d stream(s) shared by the workers), not HTTP\n", max(r.Config.GRPCStreams, 1))
	}
	if r.Config.Baseline != "" && r.Config.BaselineProtocol != "" {
		p("- the baseline build was written over %s\n", r.Config.BaselineProtocol)
	}
	if r.Config.TLSAB {
		plain, proto := "plaintext, HTTP/1.1, one keep-alive connection per client", "TLS 1.3 with HTTP/2 (tidal-server/client's default: one connection, multiplexed)"
		switch {
		case r.Config.Protocol == "grpc":
			plain, proto = "plaintext, on the gRPC ingest stream", "TLS 1.3 on the gRPC ingest stream (HTTP/2)"
		case r.Config.TLSHTTP1:
			proto = "TLS 1.3 with HTTP/1.1 (one keep-alive connection per client, as in plaintext)"
		}
		p("- **Plaintext against TLS, one build**: the \"plaintext\" columns below are this build without `--certs-dir` (%s), the \"TLS\" columns the same build with `--certs-dir` on every node: mutual TLS between the nodes, and to the clients %s presenting a writer certificate (the JSON keeps the etcd and tidal slots: etcd is plaintext, tidal is TLS)\n", plain, proto)
	} else if r.Config.Baseline != "" {
		p("- **A/B of two tidal-server builds**: every \"etcd\" column below is the baseline build %s, every \"tidal\" column this commit\n", r.Config.Baseline)
	} else if r.EtcdVersion != "" {
		p("- etcd: %s\n", r.EtcdVersion)
	}
	if r.ToxiproxyVersion != "" {
		p("- Toxiproxy: %s\n", r.ToxiproxyVersion)
	}
	c := r.Config
	p("- %d rounds, alternating; %s warm-up + %s measured per run; duration %.0fs\n", c.Rounds, c.Warmup, c.Duration, r.Seconds)
	if r.Quick {
		p("- **-quick**: a smoke run with short rounds, not a record\n")
	}

	if len(r.Stores) > 0 {
		a, b := storeNames(c)
		switch {
		case c.TLSAB:
			p("\n## Replicated writes: tidal-server in plaintext and with TLS, 3 members each on loopback\n\n")
			p("Closed loop, every client one write in flight, single-event writes sent to the leader; a fresh cluster per mode and round, rounds alternating plaintext, TLS, plaintext, TLS… ")
			p("One load tool (bench/storeload) drives both; plaintext clients %s, TLS clients %s. ", plainClientsText(c.Protocol, c.GRPCStreams), tlsClientsText(c))
		case c.Baseline != "":
			p("\n## Replicated writes: two tidal-server builds, 3 members each on loopback\n\n")
			p("Closed loop, every client one write in flight, single-event writes sent to the leader; a fresh cluster per build and round, rounds alternating baseline, this build… ")
			p("One load tool (bench/storeload) drives both; the baseline's clients %s, this build's %s. ", plainClientsText(c.BaselineProtocol, c.GRPCStreams), plainClientsText(c.Protocol, c.GRPCStreams))
		default:
			p("\n## Replicated writes: etcd and tidal-server, 3 members each on loopback\n\n")
			p("Closed loop, every client one write in flight, single-event writes sent to the leader; ")
			p("both systems fsync every commit (their defaults); a fresh cluster per system and round, rounds alternating etcd, tidal, etcd, tidal… ")
			p("One load tool (bench/storeload) drives both with the same loop and clock; etcd's workers share %s, tidal's %s. ", etcdConnsText(c.EtcdConns), plainClientsText(c.Protocol, c.GRPCStreams))
		}
		p("Writes/s and percentiles are medians over the rounds (the range of writes/s in brackets); ratio = %s / %s.\n\n", b, a)
		p("| clients | %[1]s writes/s | %[2]s writes/s | ratio | p50 %[1]s / %[2]s | p99 %[1]s / %[2]s | p99.9 %[1]s / %[2]s | errors %[1]s / %[2]s |\n", a, b)
		p("|---|---|---|---|---|---|---|---|\n")
		for _, row := range r.Stores {
			p("| %d | %s | %s | %s | %s / %s | %s / %s | %s / %s | %s / %s |\n", row.Clients,
				rateRange(row.Etcd), rateRange(row.Tidal), ratioText(row.Ratio),
				ms(row.Etcd.P50), ms(row.Tidal.P50), ms(row.Etcd.P99), ms(row.Tidal.P99),
				ms(row.Etcd.P999), ms(row.Tidal.P999), errorsText(row.Etcd), errorsText(row.Tidal))
		}
		if hasCPU(r.Stores) {
			p("\n**CPU per write** (user + system seconds over the whole run, warm-up included, divided by the writes completed; medians over the rounds). ")
			p("It moves far less with the machine's load than writes/s do: the servers' column is what one replicated write costs the three members together.\n\n")
			p("| clients | servers' CPU µs/write %[1]s / %[2]s | %[2]s / %[1]s | load tool's CPU µs/write %[1]s / %[2]s |\n|---|---|---|---|\n", a, b)
			for _, row := range r.Stores {
				cpuRatio := "-"
				if row.Etcd.ServerCPUus > 0 && row.Tidal.ServerCPUus > 0 {
					cpuRatio = fmt.Sprintf("%.2f", row.Tidal.ServerCPUus/row.Etcd.ServerCPUus)
				}
				p("| %d | %s / %s | %s | %s / %s |\n", row.Clients, micro(row.Etcd, row.Etcd.ServerCPUus), micro(row.Tidal, row.Tidal.ServerCPUus), cpuRatio,
					micro(row.Etcd, row.Etcd.ToolCPUus), micro(row.Tidal, row.Tidal.ToolCPUus))
			}
		}
		if bt := r.Batch; bt != nil && bt.Rounds > 0 {
			p("\n**Batched ingestion, tidal alone** (%d-event requests, %d clients, closed loop, to the leader): ", c.BatchSize, c.BatchClients)
			spread := ""
			if bt.Rounds > 1 {
				spread = fmt.Sprintf(" (median of %d rounds: %s–%s)", bt.Rounds, fmtRate(bt.OpsMin*float64(c.BatchSize)), fmtRate(bt.OpsMax*float64(c.BatchSize)))
			}
			p("**%s events/s**%s, requests p50 %s, p99 %s, p99.9 %s, %s errors",
				fmtRate(bt.EventsPerSec), spread, ms(bt.P50), ms(bt.P99), ms(bt.P999), errorsText(*bt))
			if bt.ServerCPUus > 0 && c.BatchSize > 0 {
				p("; servers' CPU %.1f µs/event (%.0f µs/request)", bt.ServerCPUus/float64(c.BatchSize), bt.ServerCPUus)
			}
			p(".\n")
		}
		p("\n<details><summary>every round</summary>\n\n")
		p("| system | round | load avg start → end | clients | batch | writes/s | events/s | p50 | p99 | p99.9 | max | errors | leader changed |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, rd := range r.StoreRounds {
			for _, run := range rd.Runs {
				p("| %s | %d | %s → %s | %d | %d | %s | %s | %s | %s | %s | %s | %d | %v |\n", roundName(c, rd.System), rd.Round, rd.LoadStart, rd.LoadEnd,
					run.Clients, run.Batch, fmtRate(run.OpsPerSec), fmtRate(run.EventsPerSec),
					ms(run.Latency.P50), ms(run.Latency.P99), ms(run.Latency.P999), ms(run.Latency.Max), run.Errors, run.LeaderChanged)
			}
		}
		p("\n</details>\n")
	}

	if len(r.Relay) > 0 {
		p("\n## tcp-relay, direct and Toxiproxy\n\n")
		p("Echo and sink servers in one process, tcp-relay and Toxiproxy each in their own with relays created through their HTTP APIs, ")
		p("and the measuring client in another (bench/relay -measure). 1-byte ping-pong on one connection; bulk: one connection, 256 KiB writes, ")
		p("16 MiB transfers each acknowledged by the sink; connections: dial, 1-byte echo, close, one after another, and the same with %d clients at once, ", probe.ParallelClients)
		p("the same client and concurrency for every target. %s per measurement; medians over the rounds.\n\n", c.RelayDuration)
		byTarget := map[string]relayStat{}
		var header, sep []string
		for _, st := range r.Relay {
			byTarget[st.Target] = st
			header = append(header, st.Target)
			sep = append(sep, "---")
		}
		p("| measure | %s | tcp-relay vs direct | Toxiproxy vs direct | tcp-relay vs Toxiproxy |\n", strings.Join(header, " | "))
		p("|---|%s|---|---|---|\n", strings.Join(sep, "|"))
		d, rl, tx := byTarget["direct"], byTarget["tcp-relay"], byTarget["toxiproxy"]
		row := func(name string, f func(relayStat) float64, format string, cmp func(a, b float64) string) {
			var cells []string
			for _, st := range r.Relay {
				cells = append(cells, fmt.Sprintf(format, f(st)))
			}
			p("| %s | %s | %s | %s | %s |\n", name, strings.Join(cells, " | "), cmp(f(rl), f(d)), cmp(f(tx), f(d)), cmp(f(rl), f(tx)))
		}
		row("1-byte round trip p50 (µs)", func(s relayStat) float64 { return s.RTTP50us }, "%.1f", added)
		row("1-byte round trip p99 (µs)", func(s relayStat) float64 { return s.RTTP99us }, "%.1f", added)
		row("1-byte round trip p99.9 (µs)", func(s relayStat) float64 { return s.RTTP999us }, "%.1f", added)
		row("bulk, 1 connection (MB/s)", func(s relayStat) float64 { return s.BulkMBps }, "%.0f", times)
		row("connections/s", func(s relayStat) float64 { return s.ConnsPerSec }, "%.0f", times)
		if d.ParallelConnsPerSec > 0 {
			row(fmt.Sprintf("connections/s, %d clients", probe.ParallelClients), func(s relayStat) float64 { return s.ParallelConnsPerSec }, "%.0f", times)
		}
		if d.ConnsPerSec > 0 && tx.ConnsPerSec > 0 {
			// A relay in front of the echo server makes every connection
			// two, on the same machine: it cannot beat direct, so direct's
			// lead over Toxiproxy is the most tcp-relay's can be here.
			p("\nCeiling of tcp-relay vs Toxiproxy for connections/s on this machine (a relay cannot beat direct): direct vs Toxiproxy, %s", times(d.ConnsPerSec, tx.ConnsPerSec))
			if d.ParallelConnsPerSec > 0 && tx.ParallelConnsPerSec > 0 {
				p(" one client, %s with %d clients", times(d.ParallelConnsPerSec, tx.ParallelConnsPerSec), probe.ParallelClients)
			}
			p(".\n")
		}
		for _, st := range r.Relay {
			if st.ConnErrors > 0 {
				p("\n%s: %d connections failed over the rounds.\n", st.Target, st.ConnErrors)
			}
		}
		p("\n<details><summary>every round</summary>\n\n")
		p("| round | load avg start → end | target | p50 µs | p99 µs | p99.9 µs | bulk MB/s | connections/s | connections/s, %d clients | connection errors |\n", probe.ParallelClients)
		p("|---|---|---|---|---|---|---|---|---|---|\n")
		for _, rd := range r.RelayRounds {
			for _, m := range rd.Runs {
				p("| %d | %s → %s | %s | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f | %d |\n", rd.Round, rd.LoadStart, rd.LoadEnd,
					m.Target, m.RTTP50us, m.RTTP99us, m.RTTP999us, m.BulkMBps, m.ConnsPerSec, m.ParallelConnsPerSec, m.ConnErrors)
			}
		}
		p("\n</details>\n")
	}
	return b.String()
}

func hasCPU(rows []storeRow) bool {
	for _, r := range rows {
		if r.Etcd.ServerCPUus > 0 || r.Tidal.ServerCPUus > 0 {
			return true
		}
	}
	return false
}

// micro is a CPU figure in µs, or "-" without rounds.
func micro(s storeStat, v float64) string {
	if s.Rounds == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

func etcdConnsText(n int) string {
	if n == 1 {
		return "one clientv3 client (one gRPC connection, HTTP/2 multiplexed)"
	}
	if n <= 0 {
		return "one gRPC connection per worker"
	}
	return fmt.Sprintf("%d gRPC connections", n)
}

// rateRange is "median (min–max)", or "-" without rounds.
func rateRange(s storeStat) string {
	if s.Rounds == 0 {
		return "-"
	}
	if s.Rounds == 1 {
		return fmtRate(s.OpsPerSec)
	}
	return fmt.Sprintf("%s (%s–%s)", fmtRate(s.OpsPerSec), fmtRate(s.OpsMin), fmtRate(s.OpsMax))
}

func ratioText(r float64) string {
	if r == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", r)
}

func errorsText(s storeStat) string {
	if s.Rounds == 0 {
		return "-"
	}
	t := fmt.Sprint(s.Errors)
	if s.LeaderChanges > 0 {
		t += fmt.Sprintf(" (leader changed in %d)", s.LeaderChanges)
	}
	return t
}

// added is a latency comparison: the difference in µs.
func added(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%+.1f µs", a-b)
}

// times is a rate comparison: the ratio.
func times(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("×%.2f", a/b)
}

// storeNames are the two columns' names: etcd and tidal, or the two
// sides of an A/B (the first held etcd's place).
func storeNames(c sbsConfig) (a, b string) {
	switch {
	case c.TLSAB:
		return "plaintext", "TLS"
	case c.Baseline != "":
		return "baseline", "this build"
	}
	return "etcd", "tidal"
}

// roundName is the name of a round's system in the report.
func roundName(c sbsConfig, system string) string {
	a, b := storeNames(c)
	if system == "etcd" {
		return a
	}
	return b
}

// plainClientsText says how plaintext tidal clients written with
// protocol connect ("" is http, as in files from before -protocol).
func plainClientsText(protocol string, grpcStreams int) string {
	if protocol == "grpc" {
		return fmt.Sprintf("share %d gRPC ingest stream(s), one connection each", max(grpcStreams, 1))
	}
	return "use one HTTP/1.1 keep-alive connection each"
}

// tlsClientsText says how the TLS side's clients connect.
func tlsClientsText(c sbsConfig) string {
	if c.Protocol == "grpc" {
		return fmt.Sprintf("share %d gRPC ingest stream(s) over TLS, one connection each", max(c.GRPCStreams, 1))
	}
	if c.TLSHTTP1 {
		return "HTTP/1.1 over TLS, one keep-alive connection each"
	}
	return "HTTP/2 over TLS, all of them multiplexed on one connection as tidal-server/client does"
}
