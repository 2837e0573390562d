package report

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// synthRun fills run with a deterministic, plausible 3-node ledger run
// of the given length: clients writing round-robin, n3 isolated from 8s
// to 14s (its clients time out: info), n2 killed from 18s to 22s (its
// clients are refused: fail), follower lag samples every 200ms, and audits
// in which one acknowledged write is missing on n3 and one id was applied
// twice on n1. It returns what the checkers say about it.
func synthRun(t testing.TB, run *Run, seconds float64, clients int) checker.Results {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 11))
	type event struct {
		at  int64
		seq int // tie-break: generation order
		op  history.Op
	}
	var events []event
	emit := func(op history.Op) { events = append(events, event{op.Time, len(events), op}) }
	sOf := func(s float64) int64 { return int64(s * 1e9) }
	isolated := func(at int64) bool { return at >= sOf(8) && at < sOf(14) }
	killed := func(at int64) bool { return at >= sOf(18) && at < sOf(22) }

	fault := func(f string, v history.FaultValue, start, effective float64) {
		b, _ := json.Marshal(v)
		emit(history.Op{Time: sOf(start), Process: history.Nemesis, Type: history.Invoke, F: f, Value: b})
		emit(history.Op{Time: sOf(effective), Process: history.Nemesis, Type: history.OK, F: f, Value: b})
	}
	heal := func(f string, start, done float64) {
		emit(history.Op{Time: sOf(start), Process: history.Nemesis, Type: history.Invoke, F: history.HealOf(f)})
		emit(history.Op{Time: sOf(done), Process: history.Nemesis, Type: history.OK, F: history.HealOf(f)})
	}
	if seconds > 14 {
		fault(history.FPartition, history.FaultValue{Kind: "isolate-one", Targets: []string{"n3"},
			Grudge: map[string][]string{"n3": {"n1", "n2"}, "n1": {"n3"}, "n2": {"n3"}}}, 8, 8.05)
		heal(history.FPartition, 14, 14.02)
	}
	if seconds > 22 {
		fault(history.FKill, history.FaultValue{Kind: "one", Targets: []string{"n2"}}, 18, 18.01)
		heal(history.FKill, 22, 22.4)
	}

	// Clients: closed loop, one op in flight each; an info retires the
	// process and a fresh one takes its place.
	type acked struct {
		id   string
		seq  uint64
		node string
		at   int64
	}
	var acks []acked
	var infos []string
	seq := uint64(100)
	nextProc := clients
	nodes := []string{"n1", "n2", "n3"}
	ev := 0
	for c := 0; c < clients; c++ {
		proc := c
		now := sOf(0.01 * float64(c))
		for now < sOf(seconds) {
			node := nodes[(ev+c)%3]
			ev++
			id := fmt.Sprintf("w-%d", ev)
			val, _ := json.Marshal(history.WriteValue{Events: []history.Event{{ID: id, Entity: uint64(ev % 97), Signal: "like"}}})
			emit(history.Op{Time: now, Process: history.Process(proc), Type: history.Invoke, F: history.FWrite, Value: val, Node: node})
			lat := int64(math.Exp(rng.NormFloat64()*0.6+math.Log(4)) * 1e6) // ~4ms lognormal
			done := history.Op{Process: history.Process(proc), F: history.FWrite, Value: val, Node: node}
			switch {
			case node == "n3" && isolated(now):
				lat = sOf(1)
				done.Type, done.Error = history.Info, "timeout after 1s"
				infos = append(infos, id)
			case node == "n2" && killed(now):
				lat = int64(200e3)
				done.Type, done.Error = history.Fail, "connection refused"
			default:
				seq++
				done.Type, done.Seq, done.Term = history.OK, seq, 3
				acks = append(acks, acked{id: id, seq: seq, node: node, at: now + lat})
			}
			done.Time = now + lat
			emit(done)
			if done.Type == history.Info {
				proc, nextProc = nextProc, nextProc+1
			}
			now += lat + int64(rng.IntN(3e6))
		}
	}
	sort.Slice(events, func(i, j int) bool {
		if events[i].at != events[j].at {
			return events[i].at < events[j].at
		}
		return events[i].seq < events[j].seq
	})
	ops := make([]history.Op, len(events))
	for i, e := range events {
		ops[i] = e.op
		ops[i].Index = int64(i)
	}
	writeJSONL(t, run.HistoryPath(), ops)

	// Audits: every ack everywhere, half the infos everywhere; plant a
	// lost write (acked during the partition, missing on n3) and a
	// doubled id on n1.
	sort.Slice(acks, func(i, j int) bool { return acks[i].seq < acks[j].seq })
	var lostID, dupID string
	for _, a := range acks {
		if lostID == "" && a.at > sOf(9) && a.node == "n1" {
			lostID = a.id
		}
	}
	dupID = acks[len(acks)/3].id
	for _, n := range nodes {
		var b strings.Builder
		for _, a := range acks {
			if a.id == lostID && n == "n3" {
				continue
			}
			fmt.Fprintf(&b, `{"id":%q,"index":%d,"term":3,"entity":1,"signal":"like"}`+"\n", a.id, a.seq)
			if a.id == dupID && n == "n1" {
				fmt.Fprintf(&b, `{"id":%q,"index":%d,"term":3,"entity":1,"signal":"like"}`+"\n", a.id, seq+1)
			}
		}
		for i, id := range infos {
			if i%2 == 0 {
				fmt.Fprintf(&b, `{"id":%q,"index":%d,"term":3,"entity":1,"signal":"like"}`+"\n", id, seq+10+uint64(i))
			}
		}
		if err := run.WriteAudit(n, strings.NewReader(b.String())); err != nil {
			t.Fatal(err)
		}
		dir := run.NodeDir(n)
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"node.log", "stdout.log", "stats.jsonl"} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte("{}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Lag samples: n1 leads; commit follows the acks. n3 stops applying
	// while isolated and catches up over 1.5s after the heal; n2 is not
	// sampled while dead and then needs 3s.
	commitAt := func(at int64) uint64 {
		i := sort.Search(len(acks), func(i int) bool { return acks[i].at > at })
		if i == 0 {
			return 100
		}
		return acks[i-1].seq
	}
	var samples []checker.LagSample
	for at := int64(0); at < sOf(seconds); at += sOf(0.2) {
		c := commitAt(at)
		samples = append(samples, checker.LagSample{Time: at, Node: "n1", ID: 1, Leader: 1, Term: 3, Commit: c, Applied: c})
		for i, n := range []string{"n2", "n3"} {
			applied := commitAt(at - sOf(0.03+0.02*float64(i)))
			switch {
			case n == "n2" && killed(at):
				continue
			case n == "n2" && at >= sOf(22) && at < sOf(25):
				applied = commitAt(sOf(18) + (at-sOf(22))*4/3)
			case n == "n3" && isolated(at):
				applied = commitAt(sOf(8))
			case n == "n3" && at >= sOf(14) && at < sOf(15.5):
				applied = commitAt(sOf(8) + (at-sOf(14))*4)
			}
			samples = append(samples, checker.LagSample{Time: at + int64(i+1)*1e6, Node: n, ID: uint64(i + 2), Leader: 1, Term: 3, Commit: applied, Applied: applied})
		}
	}
	if err := run.WriteLag(samples); err != nil {
		t.Fatal(err)
	}
	digests := map[string]checker.DigestSample{
		"n1": {AppliedIndex: seq + 40, Digest: "9f2c41d0aa"}, "n2": {AppliedIndex: seq + 40, Digest: "9f2c41d0aa"}, "n3": {AppliedIndex: seq + 40, Digest: "71be03e9c4"},
	}
	if err := run.WriteDigests(digests); err != nil {
		t.Fatal(err)
	}
	if err := run.WriteSeed(20261130); err != nil {
		t.Fatal(err)
	}
	if err := run.WriteConfig(map[string]any{"nodes": 3, "workload": "ledger", "nemesis": []string{"partition", "kill"}, "duration": fmt.Sprintf("%gs", seconds)}); err != nil {
		t.Fatal(err)
	}
	return checkRun(t, run)
}

// checkRun runs the checkers on what the store holds, the way analyze
// would.
func checkRun(t testing.TB, run *Run) checker.Results {
	t.Helper()
	ops, err := run.ReadHistory()
	if err != nil {
		t.Fatal(err)
	}
	audits, err := run.ReadAudits()
	if err != nil {
		t.Fatal(err)
	}
	lag, err := run.ReadLag()
	if err != nil {
		t.Fatal(err)
	}
	faults, err := checker.FaultWindows(ops)
	if err != nil {
		t.Fatal(err)
	}
	rs := []checker.Result{checker.Ledger(ops, audits, nil)}
	if digests, err := run.ReadDigests(); err == nil {
		rs = append(rs, checker.Convergence(digests))
	}
	rs = append(rs, checker.Lag(lag, faults, checker.SLO{CatchUp: 2 * time.Second}), checker.Stats(ops))
	return checker.NewResults(rs...)
}

func writeJSONL(t testing.TB, path string, ops []history.Op) {
	t.Helper()
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for i := range ops {
		if err := enc.Encode(&ops[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
