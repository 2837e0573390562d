package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/bench/closedloop"
	"github.com/tidaldb/tidal/bench/relay/probe"
)

// rec is one storeload record with the figures the table reads.
func rec(system string, clients, batch int, opsPerSec float64, p99 time.Duration, errs int64) closedloop.Record {
	r := closedloop.Record{System: system, Batch: batch}
	r.Clients = clients
	r.OpsPerSec, r.EventsPerSec = opsPerSec, opsPerSec*float64(batch)
	r.Latency = closedloop.Latencies{P50: p99 / 4, P99: p99, P999: 2 * p99}
	r.Errors = errs
	// 10 s windows; etcd spends 100 µs of server and 30 µs of load-tool
	// CPU per request, tidal 150 and 40.
	r.Ops = int64(opsPerSec * 10)
	serverUs, toolUs := 100.0, 30.0
	if system == "tidal" {
		serverUs, toolUs = 150, 40
	}
	r.ServerCPUSeconds, r.ToolCPUSeconds = float64(r.Ops)*serverUs/1e6, float64(r.Ops)*toolUs/1e6
	return r
}

// sampleRounds: three alternating rounds; at 1 client etcd makes 100, 300,
// 200 writes/s and tidal 250, 150, 400, so the medians are 200 and 250
// (ratio 1.25) whatever the order; 64 clients were only run on etcd.
func sampleRounds() []storeRound {
	ms := time.Millisecond
	return []storeRound{
		{System: "etcd", Round: 1, LoadStart: "5.00 6.00 7.00", LoadEnd: "5.50 6.00 7.00", Runs: []closedloop.Record{
			rec("etcd", 1, 1, 100, 3*ms, 0), rec("etcd", 64, 1, 5000, 30*ms, 0)}},
		{System: "tidal", Round: 1, Runs: []closedloop.Record{
			rec("tidal", 1, 1, 250, 2*ms, 1), rec("tidal", 16, 100, 900, 40*ms, 0)}},
		{System: "etcd", Round: 2, Runs: []closedloop.Record{rec("etcd", 1, 1, 300, 1*ms, 0)}},
		{System: "tidal", Round: 2, Runs: []closedloop.Record{
			rec("tidal", 1, 1, 150, 4*ms, 2), rec("tidal", 16, 100, 1100, 60*ms, 0)}},
		{System: "etcd", Round: 3, Runs: []closedloop.Record{rec("etcd", 1, 1, 200, 2*ms, 0)}},
		{System: "tidal", Round: 3, Runs: []closedloop.Record{
			func() closedloop.Record { r := rec("tidal", 1, 1, 400, 3*ms, 0); r.LeaderChanged = true; return r }(),
			rec("tidal", 16, 100, 1000, 50*ms, 0)}},
	}
}

func TestStoreRowsMediansAndRatio(t *testing.T) {
	rows := storeRows(sampleRounds(), []int{1, 64})
	if len(rows) != 2 {
		t.Fatalf("expected one row per client count, found %+v", rows)
	}
	one := rows[0]
	if one.Etcd.OpsPerSec != 200 || one.Tidal.OpsPerSec != 250 {
		t.Errorf("expected medians 200 (etcd) and 250 (tidal), found %g and %g", one.Etcd.OpsPerSec, one.Tidal.OpsPerSec)
	}
	if one.Ratio != 1.25 {
		t.Errorf("expected ratio tidal/etcd 1.25, found %g", one.Ratio)
	}
	if one.Etcd.OpsMin != 100 || one.Etcd.OpsMax != 300 || one.Tidal.Rounds != 3 {
		t.Errorf("expected etcd's range 100–300 and 3 tidal rounds, found %+v / %+v", one.Etcd, one.Tidal)
	}
	if one.Etcd.P99 != 2*time.Millisecond || one.Tidal.P99 != 3*time.Millisecond {
		t.Errorf("expected p99 medians 2 ms and 3 ms, found %s and %s", one.Etcd.P99, one.Tidal.P99)
	}
	if math.Round(one.Etcd.ServerCPUus) != 100 || math.Round(one.Tidal.ToolCPUus) != 40 {
		t.Errorf("expected CPU per write 100 µs (etcd's servers) and 40 µs (tidal's load tool), found %g and %g", one.Etcd.ServerCPUus, one.Tidal.ToolCPUus)
	}
	if one.Tidal.Errors != 3 || one.Tidal.LeaderChanges != 1 {
		t.Errorf("expected tidal's 3 errors summed and 1 leader change counted, found %d and %d", one.Tidal.Errors, one.Tidal.LeaderChanges)
	}
	// The batched runs (batch 100) are not single-event writes.
	if rows[1].Tidal.Rounds != 0 || rows[1].Ratio != 0 || rows[1].Etcd.OpsPerSec != 5000 {
		t.Errorf("expected 64 clients measured on etcd only, with no ratio, found %+v", rows[1])
	}
	batch := statOf(sampleRounds(), "tidal", 16, 100)
	if batch.Rounds != 3 || batch.EventsPerSec != 100000 || batch.P99 != 50*time.Millisecond {
		t.Errorf("expected the batched median 100,000 events/s, p99 50 ms over 3 rounds, found %+v", batch)
	}
}

// TestStoreRowsEvenRounds: with an even number of rounds the median is
// the mean of the middle two, and the ratio follows.
func TestStoreRowsEvenRounds(t *testing.T) {
	rounds := sampleRounds()[:4] // two of each
	row := storeRows(rounds, []int{1})[0]
	if row.Etcd.OpsPerSec != 200 || row.Tidal.OpsPerSec != 200 || row.Ratio != 1 {
		t.Errorf("expected medians (100+300)/2 and (250+150)/2, ratio 1, found %+v", row)
	}
}

func sampleRelayRounds() []relayRound {
	m := func(target string, p50, bulk, conns float64) probe.Measurement {
		return probe.Measurement{Target: target, RTTP50us: p50, RTTP99us: 2 * p50, RTTP999us: 3 * p50, BulkMBps: bulk, ConnsPerSec: conns, ParallelConnsPerSec: 2 * conns}
	}
	return []relayRound{
		{Round: 1, LoadStart: "4.00 4.00 4.00", LoadEnd: "4.50 4.00 4.00", Runs: []probe.Measurement{
			m("direct", 20, 2000, 6000), m("tcp-relay", 50, 1000, 3000), m("toxiproxy", 80, 400, 1500)}},
		{Round: 2, Runs: []probe.Measurement{
			m("tcp-relay", 70, 1200, 2000), m("toxiproxy", 100, 600, 1000), m("direct", 30, 3000, 5000)}},
		{Round: 3, Runs: []probe.Measurement{
			m("toxiproxy", 90, 500, 2000), m("direct", 25, 2500, 7000), m("tcp-relay", 60, 1250, 2500)}},
	}
}

func TestRelayStatsMedians(t *testing.T) {
	stats := relayStats(sampleRelayRounds(), []string{"direct", "tcp-relay", "toxiproxy", "absent"})
	want := map[string]relayStat{
		"direct":    {Target: "direct", Rounds: 3, RTTP50us: 25, RTTP99us: 50, RTTP999us: 75, BulkMBps: 2500, ConnsPerSec: 6000, ParallelConnsPerSec: 12000},
		"tcp-relay": {Target: "tcp-relay", Rounds: 3, RTTP50us: 60, RTTP99us: 120, RTTP999us: 180, BulkMBps: 1200, ConnsPerSec: 2500, ParallelConnsPerSec: 5000},
		"toxiproxy": {Target: "toxiproxy", Rounds: 3, RTTP50us: 90, RTTP99us: 180, RTTP999us: 270, BulkMBps: 500, ConnsPerSec: 1500, ParallelConnsPerSec: 3000},
		"absent":    {Target: "absent"},
	}
	if len(stats) != 4 {
		t.Fatalf("expected one stat per target, found %+v", stats)
	}
	for _, st := range stats {
		if st != want[st.Target] {
			t.Errorf("%s: expected %+v, found %+v", st.Target, want[st.Target], st)
		}
	}
}

func TestSideBySideSummary(t *testing.T) {
	rounds := sampleRounds()
	r := &sideBySide{Schema: 1, Kind: sideBySideKind, Time: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC), Note: sharedMachineNote,
		Env:         env{Commit: "abc123", Cores: 2, CPUModel: "AMD EPYC", LoadStart: "5.00 6.00 7.00", LoadEnd: "6.00 6.00 7.00"},
		Config:      sbsConfig{Rounds: 3, Clients: []int{1, 64}, Warmup: time.Second, Duration: 5 * time.Second, EtcdConns: 1, BatchClients: 16, BatchSize: 100, RelayDuration: 2 * time.Second},
		StoreRounds: rounds, Stores: storeRows(rounds, []int{1, 64}),
		EtcdVersion: "etcd Version: 3.4.23", RelayRounds: sampleRelayRounds(),
		Relay: relayStats(sampleRelayRounds(), relayTargets)}
	bt := statOf(rounds, "tidal", 16, 100)
	r.Batch = &bt
	md := sideBySideSummary(r)
	for _, want := range []string{
		"commit abc123", "machine is shared", "etcd Version: 3.4.23", "5.00 6.00 7.00 at start",
		"| clients | etcd writes/s | tidal writes/s | ratio | p50 etcd / tidal | p99 etcd / tidal | p99.9 etcd / tidal |",
		"| 1 | 200 (100–300) | 250 (150–400) | 1.25 | 0.50 ms / 0.75 ms | 2.0 ms / 3.0 ms | 4.0 ms / 6.0 ms | 0 / 3 (leader changed in 1) |",
		"| 64 | 5,000 | - | - |",
		"**100,000 events/s** (median of 3 rounds: 90,000–110,000)",
		"servers' CPU 1.5 µs/event (150 µs/request)",
		"| 1 | 100 / 150 | 1.50 | 30 / 40 |",
		"| 64 | 100 / - | - | 30 / - |",
		"| etcd | 1 | 5.00 6.00 7.00 → 5.50 6.00 7.00 | 1 | 1 | 100 |",
		"| 1-byte round trip p50 (µs) | 25.0 | 60.0 | 90.0 | +35.0 µs | +65.0 µs | -30.0 µs |",
		"| bulk, 1 connection (MB/s) | 2500 | 1200 | 500 | ×0.48 | ×0.20 | ×2.40 |",
		"| connections/s | 6000 | 2500 | 1500 | ×0.42 | ×0.25 | ×1.67 |",
		"| connections/s, 16 clients | 12000 | 5000 | 3000 | ×0.42 | ×0.25 | ×1.67 |",
		"Ceiling of tcp-relay vs Toxiproxy for connections/s on this machine (a relay cannot beat direct): direct vs Toxiproxy, ×4.00 one client, ×4.00 with 16 clients.",
		"| 1 | 4.00 4.00 4.00 → 4.50 4.00 4.00 | direct | 20.0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("expected the summary to contain %q, found:\n%s", want, md)
		}
	}
}

// Results from before the 16-client phase render without its row.
func TestSideBySideSummaryWithoutParallelConns(t *testing.T) {
	rounds := sampleRelayRounds()
	for i := range rounds {
		for j := range rounds[i].Runs {
			rounds[i].Runs[j].ParallelConnsPerSec = 0
		}
	}
	r := &sideBySide{Schema: 1, Kind: sideBySideKind, RelayRounds: rounds, Relay: relayStats(rounds, relayTargets)}
	md := sideBySideSummary(r)
	if strings.Contains(md, "\n| connections/s, 16 clients |") {
		t.Errorf("expected no 16-client row without its measurements, found:\n%s", md)
	}
	if !strings.Contains(md, "direct vs Toxiproxy, ×4.00.") {
		t.Errorf("expected the one-client ceiling alone, found:\n%s", md)
	}
}

// TestSideBySideSummaryOfTLSAB: a -tls-ab file names its sides plaintext
// and TLS (etcd appears nowhere in its store section) and says how the
// TLS clients connected; the rounds' table names the mode of each round.
func TestSideBySideSummaryOfTLSAB(t *testing.T) {
	rounds := sampleRounds()
	for _, h1 := range []bool{false, true} {
		r := &sideBySide{Schema: 1, Kind: sideBySideKind, Time: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC), Note: sharedMachineNote,
			Env:         env{Commit: "abc123", Cores: 2},
			Config:      sbsConfig{TLSAB: true, TLSHTTP1: h1, Rounds: 3, Clients: []int{1, 64}, Warmup: time.Second, Duration: 5 * time.Second},
			StoreRounds: rounds, Stores: storeRows(rounds, []int{1, 64}), EtcdVersion: "plaintext tidal-server (this build)"}
		md := sideBySideSummary(r)
		store := md[strings.Index(md, "## Replicated writes"):]
		want := []string{
			"**Plaintext against TLS, one build**:",
			"## Replicated writes: tidal-server in plaintext and with TLS",
			"ratio = TLS / plaintext",
			"| clients | plaintext writes/s | TLS writes/s | ratio | p50 plaintext / TLS |",
			"| 1 | 200 (100–300) | 250 (150–400) | 1.25 |",
			"| clients | servers' CPU µs/write plaintext / TLS | TLS / plaintext |",
			"| plaintext | 1 | 5.00 6.00 7.00 → 5.50 6.00 7.00 | 1 | 1 | 100 |",
			"| TLS | 1 |",
		}
		if h1 {
			want = append(want, "TLS 1.3 with HTTP/1.1", "TLS clients HTTP/1.1 over TLS, one keep-alive connection each")
		} else {
			want = append(want, "TLS 1.3 with HTTP/2", "TLS clients HTTP/2 over TLS, all of them multiplexed on one connection")
		}
		for _, w := range want {
			if !strings.Contains(md, w) {
				t.Errorf("http1=%v: expected the summary to contain %q, found:\n%s", h1, w, md)
			}
		}
		if strings.Contains(store, "etcd") {
			t.Errorf("http1=%v: expected no mention of etcd in the store section of a TLS A/B, found:\n%s", h1, store)
		}
	}
}

// TestPreviousResultsSkipsSideBySide: the cluster benchmark compares with
// the newest cluster results file, never with a side-by-side one (which
// would read as a run without workloads), and -render recognises both.
func TestPreviousResultsSkipsSideBySide(t *testing.T) {
	dir := t.TempDir()
	cluster := &results{Schema: 1, Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), Env: env{Commit: "aaa"}}
	sbs := &sideBySide{Schema: 1, Kind: sideBySideKind, Time: time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), Env: env{Commit: "bbb"}}
	for name, v := range map[string]any{"2026-01-01-aaa.json": cluster, "2026-01-02-bbb-side-by-side.json": sbs} {
		data, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	prev, path := previousResults(dir, "2026-01-03-ccc", time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC))
	if prev == nil || filepath.Base(path) != "2026-01-01-aaa.json" {
		t.Errorf("expected the cluster file, found %q", path)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "2026-01-02-bbb-side-by-side.json"))
	if !isSideBySide(data) {
		t.Errorf("expected the side-by-side file recognised")
	}
	data, _ = os.ReadFile(filepath.Join(dir, "2026-01-01-aaa.json"))
	if isSideBySide(data) {
		t.Errorf("expected a cluster file not taken for a side-by-side one")
	}
	if err := render(t.Context(), options{render: filepath.Join(dir, "2026-01-02-bbb-side-by-side.json")}); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "2026-01-02-bbb-side-by-side.md"))
	if err != nil || !strings.Contains(string(md), "# tidal side by side") {
		t.Errorf("expected -render to write the side-by-side summary, found %q (%v)", md, err)
	}
}

func TestParseClients(t *testing.T) {
	got, err := parseClients("1, 16,64,256")
	if err != nil || len(got) != 4 || got[0] != 1 || got[3] != 256 {
		t.Errorf("expected [1 16 64 256], found %v (%v)", got, err)
	}
	for _, bad := range []string{"", "1,,2", "0", "x", "-4"} {
		if _, err := parseClients(bad); err == nil {
			t.Errorf("expected %q refused", bad)
		}
	}
}
