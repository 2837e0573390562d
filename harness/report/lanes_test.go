package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/nemesis"
	"golang.org/x/net/html"
)

// laneHistory is a hand-written 3-node history with one fault of every
// lane kind and writes every 100ms on n1 that fail from
// 10s to 12.5s:
//
//	kill n2 2-4s · pause n3 5-6s · isolate-one n1 7-8s (grudge) ·
//	power-cut one n2 9-11s · disk fsync-error n3 10-13s · clock jump n1
//	+2h 14-16s · slow links (all) 17-18s · restart n3 at 19s (instant)
func laneHistory(t *testing.T) []history.Op {
	t.Helper()
	var ops []history.Op
	at := func(s float64) int64 { return int64(s * 1e9) }
	push := func(op history.Op) { op.Index = int64(len(ops)); ops = append(ops, op) }
	val := func(v any) json.RawMessage {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	type fault struct {
		start, end float64
		f          string
		v          history.FaultValue
	}
	clock, _ := json.Marshal(history.ClockParams{OffsetsMS: map[string]int64{"n1": 7_200_000}, BoundMS: 60_000})
	faults := []fault{
		{2, 4, history.FKill, history.FaultValue{Kind: "one", Targets: []string{"n2"}}},
		{5, 6, history.FPause, history.FaultValue{Kind: "one", Targets: []string{"n3"}}},
		{7, 8, history.FPartition, history.FaultValue{Kind: "isolate-one", Targets: []string{"n1"}, Grudge: map[string][]string{"n1": {"n2", "n3"}, "n2": {"n1"}, "n3": {"n1"}}}},
		{9, 11, history.FPowerCut, history.FaultValue{Kind: "one", Targets: []string{"n2"}}},
		{10, 13, history.FDisk, history.FaultValue{Kind: "fsync-error", Targets: []string{"n3"}}},
		{14, 16, history.FClock, history.FaultValue{Kind: "jump", Targets: []string{"n1"}, Params: clock}},
		{17, 18, history.FSlow, history.FaultValue{Kind: "latency"}},
		{19, 19.2, history.FRestart, history.FaultValue{Kind: "one", Targets: []string{"n3"}, Instant: true}},
	}
	type event struct {
		t  float64
		op history.Op
	}
	var events []event
	for _, f := range faults {
		events = append(events,
			event{f.start, history.Op{Process: history.Nemesis, Type: history.Invoke, F: f.f, Value: val(f.v)}},
			event{f.start + 0.01, history.Op{Process: history.Nemesis, Type: history.OK, F: f.f, Value: val(f.v)}})
		if !f.v.Instant {
			events = append(events,
				event{f.end, history.Op{Process: history.Nemesis, Type: history.Invoke, F: history.HealOf(f.f)}},
				event{f.end + 0.01, history.Op{Process: history.Nemesis, Type: history.OK, F: history.HealOf(f.f)}})
		} else {
			events[len(events)-1].t = f.end
		}
	}
	for i := 0; i < 210; i++ {
		s := float64(i) / 10
		typ := history.OK
		if s >= 10 && s < 12.5 {
			typ = history.Fail
		}
		w := val(history.WriteValue{Events: []history.Event{{ID: fmt.Sprint(i), Entity: 1, Signal: "like"}}})
		events = append(events,
			event{s + 0.001, history.Op{Process: history.Process(i), Type: history.Invoke, F: history.FWrite, Node: "n1", Value: w}},
			event{s + 0.005, history.Op{Process: history.Process(i), Type: typ, F: history.FWrite, Node: "n1", Value: w}})
	}
	// Stable by time: generation order breaks ties.
	for i := 1; i < len(events); i++ {
		for j := i; j > 0 && events[j].t < events[j-1].t; j-- {
			events[j], events[j-1] = events[j-1], events[j]
		}
	}
	for _, e := range events {
		e.op.Time = at(e.t)
		push(e.op)
	}
	return ops
}

// Each fault lands in its node's row, in the band of
// what it acts on, with what a person needs to read it (the clock's
// offset, the disk fault's kind, whom a partition cut a node from).
func TestNodeSpans(t *testing.T) {
	ops := laneHistory(t)
	windows, values, err := checker.FaultWindowValues(ops)
	if err != nil {
		t.Fatal(err)
	}
	nodes := laneNodes(ops, values, nil)
	if fmt.Sprint(nodes) != "[n1 n2 n3]" {
		t.Fatalf("nodes %v; expected n1 n2 n3", nodes)
	}
	var got []string
	for _, s := range nodeSpans(windows, values, nodes) {
		got = append(got, fmt.Sprintf("%s %d %s %q %.2f-%.2f", s.node, s.band, s.state, s.label, s.from, s.to))
	}
	want := []string{
		`n2 0 down "killed" 2.00-4.01`,
		`n3 0 paused "paused" 5.00-6.01`,
		`n1 1 isolated "isolated" 7.00-8.01`,
		`n2 1 cut "cut from n1" 7.00-8.01`,
		`n3 1 cut "cut from n1" 7.00-8.01`,
		`n2 0 power-cut "power cut" 9.00-11.01`,
		`n3 2 disk "fsync-error" 10.00-13.01`,
		`n1 3 clock "+2h0m0s" 14.00-16.01`,
		`n1 1 slow "slow links (latency)" 17.00-18.01`,
		`n2 1 slow "slow links (latency)" 17.00-18.01`,
		`n3 1 slow "slow links (latency)" 17.00-18.01`,
		`n3 0 restart "restart" 19.00-19.20`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("spans:\n%s\nexpected:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// Who led when, from the lag samples. A higher term
// starts a span, with no leader until one is named in it; a report of an
// older term (a deposed leader, a node that has not heard yet) changes
// nothing.
func TestLeaderSpans(t *testing.T) {
	s := func(sec float64, node string, id, leader, term uint64) checker.LagSample {
		return checker.LagSample{Time: int64(sec * 1e9), Node: node, ID: id, Leader: leader, Term: term}
	}
	samples := []checker.LagSample{
		s(0.1, "n1", 1, 1, 2), s(0.2, "n2", 2, 1, 2), s(0.3, "n3", 3, 1, 2),
		s(3.0, "n2", 2, 0, 3), // n1 killed: n2 campaigns
		s(3.1, "n1", 1, 1, 2), // stale
		s(3.4, "n3", 3, 2, 3), // n2 won term 3
		s(6.0, "n3", 3, 3, 4), // n3 took over in term 4 (transfer)
	}
	spans, terms := leaderSpans(samples, 10)
	var got []string
	for _, l := range spans {
		got = append(got, fmt.Sprintf("%q t%d %.1f-%.1f", l.node, l.term, l.from, l.to))
	}
	want := `"n1" t2 0.1-3.0,"" t3 3.0-3.4,"n2" t3 3.4-6.0,"n3" t4 6.0-10.0`
	if strings.Join(got, ",") != want {
		t.Errorf("leader spans %s; expected %s", strings.Join(got, ","), want)
	}
	if fmt.Sprint(terms) != "[3 6]" {
		t.Errorf("term changes at %v; expected [3 6]", terms)
	}
}

// Availability per fault. Writes complete every 100ms
// (at .x05) but fail from 10s to 12.5s: the power cut (9-11s) shows the
// 2.6s from its last ok write (9.905s) to the next (12.505s), which comes
// 1.495s after its heal; the fsync error (10-13s) the 2.505s from its
// start, and writes at once (95ms) after its heal; faults that did not
// stop writes show only the 100ms between writes.
func TestAvailability(t *testing.T) {
	ops := laneHistory(t)
	windows, err := checker.FaultWindows(ops)
	if err != nil {
		t.Fatal(err)
	}
	pairs, err := history.Pairs(ops)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]faultAvailability{}
	for _, a := range availability(pairs, windows, ops[len(ops)-1].Time) {
		got[a.Window.F] = a
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 0.002 }
	for _, tc := range []struct {
		f               string
		outage, resumed float64
		oks             int
	}{
		{"power-cut", 2.6, 1.495, 10},
		{"disk", 2.505, 0.095, 6},
		{history.FKill, 0.1, 0.095, 21},
		{history.FClock, 0.1, 0.095, 21},
	} {
		a := got[tc.f]
		if !near(a.OutageS, tc.outage) || !near(a.ResumedS, tc.resumed) || a.OKWrites != tc.oks {
			t.Errorf("%s: outage %.3fs, resumed %.3fs after the heal, %d ok writes; expected %.3fs, %.3fs, %d",
				tc.f, a.OutageS, a.ResumedS, a.OKWrites, tc.outage, tc.resumed, tc.oks)
		}
	}
}

// The rendered page has the node lanes and the leader
// lane under the charts, the catch-up windows on the lag chart, and the
// availability table; every span's tooltip names its fault.
func TestLanesRendered(t *testing.T) {
	ops := laneHistory(t)
	var lag []checker.LagSample
	for i := 0; i < 200; i++ {
		at := int64(i) * 100e6
		leader, term := uint64(1), uint64(2)
		if at >= 7e9 {
			leader, term = 2, 3 // n1 isolated at 7s: n2 takes over
		}
		for id := uint64(1); id <= 3; id++ {
			applied := uint64(i)
			if id == 3 && at >= 5e9 && at < 6.5e9 {
				applied = 50 // n3 paused: behind until 6.5s
			}
			lag = append(lag, checker.LagSample{Time: at + int64(id)*1e6, Node: fmt.Sprintf("n%d", id), ID: id, Leader: leader, Term: term, Commit: uint64(i), Applied: applied})
		}
	}
	windows, _ := checker.FaultWindows(ops)
	results := []checker.Result{checker.Lag(lag, windows, checker.SLO{P99: 2 * time.Second, CatchUp: 10 * time.Second})}
	var buf bytes.Buffer
	if err := RenderHTML(&buf, Report{Results: RunResults{Test: "lanes", Results: results}, History: ops, Lag: lag}); err != nil {
		t.Fatal(err)
	}
	page := parsePage(t, buf.Bytes())
	svgs := page.all(func(n *html.Node) bool { return n.Data == "svg" && strings.HasPrefix(attr(n, "aria-label"), "Nodes") })
	if len(svgs) != 1 {
		t.Fatalf("expected one node lanes chart, found %d", len(svgs))
	}
	lanes := parsedPage{root: svgs[0]}
	for _, n := range []string{"n1", "n2", "n3"} {
		if len(lanes.all(func(x *html.Node) bool { return attr(x, "class") == "lane" && attr(x, "data-node") == n })) != 1 {
			t.Errorf("expected a lane for %s", n)
		}
	}
	states := map[string]int{}
	for _, g := range lanes.all(func(x *html.Node) bool { return attr(x, "class") == "span" }) {
		states[attr(g, "data-state")]++
		title := parsedPage{root: g}.all(tag("title"))
		if len(title) == 0 || !strings.Contains(title[0].FirstChild.Data, "..") {
			t.Errorf("span %s: expected a tooltip naming its fault window", attr(g, "data-state"))
		}
	}
	for _, s := range []string{"down", "paused", "isolated", "cut", "power-cut", "disk", "clock", "slow", "restart"} {
		if states[s] == 0 {
			t.Errorf("expected a %s span in the lanes, found states %v", s, states)
		}
	}
	// Regression: leader lane through a power cut. The samples name n2
	// leader from 7s to the end, but n2's disk was cut from 9s to 11s: the
	// lane shows no leader there, not n2.
	leaders := lanes.all(func(x *html.Node) bool { return attr(x, "class") == "leader" })
	var lane []string
	for _, l := range leaders {
		lane = append(lane, fmt.Sprintf("%q", attr(l, "data-node")))
	}
	if want := `"n1" "n2" "" "n2"`; strings.Join(lane, " ") != want {
		t.Errorf("leader lane %s; expected %s (n2 power cut 9s-11s)", strings.Join(lane, " "), want)
	}
	// Regression: unreadable power-cut label. The page's stylesheet sets
	// every chart text's fill, which beats a fill attribute: labels meant
	// white were drawn dark on the dark red of a power cut. They carry the
	// colour in a style attribute, which beats the stylesheet.
	labels := 0
	for _, g := range lanes.all(func(x *html.Node) bool { return attr(x, "class") == "span" && attr(x, "data-state") == "power-cut" }) {
		for _, text := range (parsedPage{root: g}).all(tag("text")) {
			labels++
			if attr(text, "style") != "fill:#fff" || attr(text, "fill") != "" {
				t.Errorf("power-cut label: style %q fill %q; expected style fill:#fff and no fill attribute", attr(text, "style"), attr(text, "fill"))
			}
		}
	}
	if labels == 0 {
		t.Error("expected the power-cut span to carry its label")
	}
	if n := len(lanes.all(func(x *html.Node) bool { return attr(x, "class") == "term-change" })); n != 1 {
		t.Errorf("expected one term change tick, found %d", n)
	}
	lagSVG := page.all(func(n *html.Node) bool {
		return n.Data == "svg" && strings.HasPrefix(attr(n, "aria-label"), "Follower replication lag")
	})
	if len(lagSVG) != 1 {
		t.Fatal("expected the lag chart")
	}
	catchUps := parsedPage{root: lagSVG[0]}.all(func(x *html.Node) bool { return attr(x, "class") == "catch-up" && attr(x, "data-follower") == "n3" })
	if len(catchUps) == 0 {
		t.Errorf("lag chart: expected n3's catch-up after the pause drawn")
	}
	if !strings.Contains(page.text, "Availability per fault") || !strings.Contains(page.text, "2.505s") {
		t.Errorf("expected the availability table with the power cut's 2.505s outage")
	}
}

// The clock checker's evidence is shown as a table of
// shifts, and a write acked with a clock beyond the bound is listed.
func TestClockCheckerRendered(t *testing.T) {
	ops := laneHistory(t)
	// Plant: n1 acks a write at 15s, while its clock is 2h off.
	w, _ := json.Marshal(history.WriteValue{Events: []history.Event{{ID: "planted", Entity: 1, Signal: "like"}}})
	var planted []history.Op
	for _, op := range ops {
		planted = append(planted, op)
		if op.Time == int64(15e9)+1e6 {
			planted = append(planted,
				history.Op{Process: 999, Type: history.Invoke, F: history.FWrite, Node: "n1", Value: w, Time: op.Time},
				history.Op{Process: 999, Type: history.OK, F: history.FWrite, Node: "n1", Value: w, Time: op.Time + 1})
		}
	}
	for i := range planted {
		planted[i].Index = int64(i)
	}
	res, ok := checker.Clock(planted)
	if !ok || res.Valid != checker.Invalid {
		t.Fatalf("clock checker on a planted ack: %v %s: %s", ok, res.Valid, res.Summary)
	}
	var buf bytes.Buffer
	if err := RenderHTML(&buf, Report{Results: RunResults{Test: "clock", Results: []checker.Result{res}}, History: planted}); err != nil {
		t.Fatal(err)
	}
	page := parsePage(t, buf.Bytes())
	for _, want := range []string{"+2h0m0s", "Writes acknowledged with a clock beyond the bound", "op "} {
		if !strings.Contains(page.text, want) {
			t.Errorf("expected the clock checker's section to show %q", want)
		}
	}
}

// A crash the nodes checker found (an exit nobody asked
// for) is marked on that node's row at the time it exited.
func TestCrashMarkedInLanes(t *testing.T) {
	spans := crashSpans(crashedRunResults().Results)
	if len(spans) != 1 || spans[0].node != "n2" || spans[0].state != "crashed" || spans[0].from != 7 || !strings.Contains(spans[0].title, "panicked") {
		t.Fatalf("crash spans %+v; expected n2 crashed at 7s, titled with why", spans)
	}
	svg := lanesChart([]string{"n1", "n2", "n3"}, spans, nil, nil, 10)
	if !strings.Contains(svg, `data-state="crashed"`) {
		t.Errorf("expected the crash drawn in the lanes")
	}
}

// Every fault kind the nemesis has gets a lane state when it is recorded
// as the nemesis records it (its f and sub-kind): the lanes match by the
// history f constants package nemesis records with, so a kind added or
// renamed cannot silently lose its colour. Leadership kinds are drawn on
// the leader lane (from the lag samples), not on a node's.
func TestEveryNemesisKindHasALane(t *testing.T) {
	bands := map[nemesis.Class][]int{
		nemesis.Network: {bandNetwork},
		nemesis.Links:   {bandNetwork},
		nemesis.Process: {bandProcess},
		nemesis.Disk:    {bandProcess, bandDisk}, // a power cut stops the process
		nemesis.Clock:   {bandClock},
	}
	nodes := []string{"n1", "n2", "n3"}
	for _, k := range nemesis.Kinds() {
		w := checker.FaultWindow{F: k.F, Kind: k.Sub, Targets: []string{"n2"}, Start: int64(time.Second), Effective: int64(time.Second), End: int64(2 * time.Second), Healed: true}
		v := history.FaultValue{Kind: k.Sub, Targets: []string{"n2"}, Instant: k.Instant}
		spans := nodeSpans([]checker.FaultWindow{w}, []history.FaultValue{v}, nodes)
		if k.Class == nemesis.Leadership {
			if len(spans) != 0 {
				t.Errorf("%s: leadership kinds belong on the leader lane, found node spans %+v", k.Name, spans)
			}
			continue
		}
		want, ok := bands[k.Class]
		if !ok {
			t.Errorf("%s: class %q has no lane band in this test; give it one in nodeSpans and here", k.Name, k.Class)
			continue
		}
		if len(spans) == 0 {
			t.Errorf("%s (f %q, kind %q): no lane span; nodeSpans does not know its f", k.Name, k.F, k.Sub)
			continue
		}
		for _, s := range spans {
			if _, ok := laneColors[s.state]; !ok || s.state == "up" {
				t.Errorf("%s: lane state %q has no colour of its own", k.Name, s.state)
			}
			if !slices.Contains(want, s.band) {
				t.Errorf("%s: drawn on band %d, expected one of %v for class %s", k.Name, s.band, want, k.Class)
			}
		}
	}
}

// Regression: an outage spike flattens the lag chart. One follower down
// for 30 s made the y axis 30 s tall, and the 2 s SLO line sat on the
// floor with every other sample. The scale stops at max(4 × SLO, p95);
// the spike is drawn at the top and named in a note.
func TestLagChartKeepsTheSLOLineReadableOverASpike(t *testing.T) {
	var samples []checker.LagSample
	for i := 0; i < 300; i++ {
		at := int64(i) * 100e6
		applied := uint64(i)
		if i >= 100 && i < 110 {
			applied = 0 // n2 stuck: lag grows to ~10 s
		}
		samples = append(samples,
			checker.LagSample{Time: at, Node: "n1", ID: 1, Leader: 1, Term: 2, Commit: uint64(i), Applied: uint64(i)},
			checker.LagSample{Time: at + 1e6, Node: "n2", ID: 2, Leader: 1, Term: 2, Commit: uint64(i), Applied: applied})
	}
	svg := lagChart(samples, nil, 30, 500, nil)
	if !strings.Contains(svg, "peaks off scale, up to") {
		t.Errorf("expected a note naming the off-scale peak in:\n%s", svg)
	}
	spike := make([]float64, 40)
	spike[17] = 10_000
	if got := lagScale(spike, 500); got > 4*500*1.05+1e-9 {
		t.Errorf("lagScale over a lone 10 s spike with a 500 ms SLO: %g; expected at most 4 × SLO (+5%%)", got)
	}
	if got := lagScale([]float64{100, 200, 300}, 500); got != 500*1.05 {
		t.Errorf("lagScale under the SLO: %g; expected the SLO (+5%%)", got)
	}
	if got := lagScale([]float64{100, 900}, 500); got != 900*1.05 {
		t.Errorf("lagScale with a peak under 4 × SLO: %g; expected the peak (+5%%)", got)
	}
}
