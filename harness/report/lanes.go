package report

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// Node lanes: under the charts, one row per node on the
// same time axis saying what the nemesis did to it — its process (down,
// paused, power cut, removed, restarted), its network (isolated, cut from
// some nodes, slow links), its disk (the disk fault's kind) and its clock
// (the offset) — and one row saying who led, with a tick at every term
// change. Everything is derived from the history's nemesis ops and the
// lag samples; nothing is read from the nodes.

// Bands of a node's row; the process band is the row's background.
const (
	bandProcess = iota
	bandNetwork
	bandDisk
	bandClock
)

// laneSpan is one stretch of one band of one node's row.
type laneSpan struct {
	node     string
	band     int
	from, to float64 // seconds since start
	state    string  // colour key (laneColors)
	label    string  // drawn inside the span when it fits
	title    string  // tooltip: the fault window
}

// laneColors colour each state; up is the row's background.
var laneColors = map[string]string{
	"up":        "#ebfbee",
	"down":      "#e03131",
	"paused":    "#9c36b5",
	"power-cut": "#5f1313",
	"removed":   "#868e96",
	"restart":   "#e8590c",
	"isolated":  "#3b5bdb",
	"cut":       "#748ffc",
	"slow":      "#0c8599",
	"disk":      "#a0522d",
	"clock":     "#f08c00",
	"crashed":   "#212529",
}

// laneLegend is the legend's order.
var laneLegend = []string{"up", "down", "paused", "power-cut", "removed", "restart", "crashed", "isolated", "cut", "slow", "disk", "clock"}

// nodeSpans turns fault windows into lane spans for the given nodes. It
// matches a window by its history f, the constants package nemesis
// records its kinds with (history.FKill, history.FPowerCut, ...), never by
// a kind's name: every kind of an f gets its lane, and a new or renamed
// kind of a known f cannot lose it (TestEveryNemesisKindHasALane).
func nodeSpans(windows []checker.FaultWindow, values []history.FaultValue, nodes []string) []laneSpan {
	var out []laneSpan
	for i, w := range windows {
		v := values[i]
		from, to := sec(w.Start), sec(w.End)
		add := func(node string, band int, state, label string) {
			out = append(out, laneSpan{node: node, band: band, from: from, to: to, state: state, label: label, title: w.String()})
		}
		targets := v.Targets
		if len(targets) == 0 {
			targets = w.Targets
		}
		switch {
		case w.F == history.FKill:
			for _, n := range targets {
				add(n, bandProcess, "down", "killed")
			}
		case w.F == history.FStop:
			for _, n := range targets {
				add(n, bandProcess, "down", "stopped (SIGTERM)")
			}
		case w.F == history.FPause:
			for _, n := range targets {
				add(n, bandProcess, "paused", "paused")
			}
		case w.F == history.FPowerCut || w.F == history.FStopPowerCut:
			for _, n := range targets {
				add(n, bandProcess, "power-cut", "power cut")
			}
		case w.F == history.FRemoveMember:
			for _, n := range targets {
				add(n, bandProcess, "removed", "removed")
			}
		case w.F == history.FRestart:
			for _, n := range targets {
				add(n, bandProcess, "restart", "restart")
			}
		case w.F == history.FPartition:
			if len(v.Grudge) == 0 {
				label := "partitioned"
				if strings.HasPrefix(v.Kind, "isolate") {
					label = "isolated"
				}
				for _, n := range targets {
					add(n, bandNetwork, "cut", label)
				}
				continue
			}
			for _, n := range nodes {
				hears := v.Grudge[n]
				switch {
				case len(hears) == 0:
				case len(hears) >= len(nodes)-1:
					add(n, bandNetwork, "isolated", "isolated")
				default:
					add(n, bandNetwork, "cut", "cut from "+strings.Join(hears, ","))
				}
			}
		case w.F == history.FSlow:
			slowed := targets
			if len(slowed) == 0 {
				slowed = nodes // every peer link
			}
			for _, n := range slowed {
				add(n, bandNetwork, "slow", "slow links ("+v.Kind+")")
			}
		case w.F == history.FDisk:
			for _, n := range targets {
				add(n, bandDisk, "disk", v.Kind)
			}
		case w.F == history.FClock:
			var p history.ClockParams
			_ = json.Unmarshal(v.Params, &p)
			for _, n := range targets {
				label := "clock moved"
				if off, ok := p.OffsetsMS[n]; ok {
					label = signedDuration(time.Duration(off) * time.Millisecond)
				}
				add(n, bandClock, "clock", label)
			}
		}
	}
	return out
}

// crashSpans marks, on the process band, every exit of a node the nodes
// checker found unasked for (a crash), at the time it exited.
func crashSpans(results []checker.Result) []laneSpan {
	r, ok := resultNamed(results, "nodes")
	if !ok {
		return nil
	}
	d, ok := detailsAs[checker.NodesDetails](r)
	if !ok {
		return nil
	}
	var out []laneSpan
	for _, c := range d.Crashes {
		if c.Time < 0 {
			continue // found down after the final heal: no time to mark
		}
		out = append(out, laneSpan{node: c.Node, band: bandProcess, from: sec(c.Time), to: sec(c.Time), state: "crashed", label: "crashed",
			title: fmt.Sprintf("crashed at %s: %s", history.FormatTime(c.Time), c.Reason)})
	}
	return out
}

func signedDuration(d time.Duration) string {
	if d > 0 {
		return "+" + d.String()
	}
	return d.String()
}

// leaderSpan is a stretch of one term: who led it ("" while none was
// known).
type leaderSpan struct {
	from, to float64
	node     string
	term     uint64
}

// leaderSpans reads who led when from the lag samples: each node reports
// the leader it knows and its term. A higher term starts a span (with no
// leader until some node names one in that term); reports of a lower term
// are stale and ignored. termChanges are the times the term went up.
func leaderSpans(samples []checker.LagSample, tmax float64) (spans []leaderSpan, termChanges []float64) {
	samples = slices.Clone(samples)
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].Time < samples[j].Time })
	names := map[uint64]string{}
	for _, s := range samples {
		if s.ID != 0 {
			names[s.ID] = s.Node
		}
	}
	name := func(id uint64) string {
		if n, ok := names[id]; ok {
			return n
		}
		return "id " + strconv.FormatUint(id, 10)
	}
	var cur *leaderSpan
	start := func(at float64, node string, term uint64) {
		if cur != nil {
			cur.to = at
			spans = append(spans, *cur)
		}
		cur = &leaderSpan{from: at, node: node, term: term}
	}
	for _, s := range samples {
		at := sec(s.Time)
		switch {
		case cur == nil || s.Term > cur.term:
			if cur != nil {
				termChanges = append(termChanges, at)
			}
			node := ""
			if s.Leader != 0 {
				node = name(s.Leader)
			}
			start(at, node, s.Term)
		case s.Term == cur.term && cur.node == "" && s.Leader != 0:
			start(at, name(s.Leader), s.Term)
		}
	}
	if cur != nil {
		cur.to = math.Max(tmax, cur.from)
		spans = append(spans, *cur)
	}
	return spans, termChanges
}

// notLeading are the process states in which a node cannot be leading:
// its process is gone or its disk is cut from under it.
var notLeading = map[string]bool{"down": true, "power-cut": true, "removed": true}

// clipLeaders ends each leader span where its node's process went down
// (killed, power cut, removed) and resumes it where the node came back,
// if the term had not moved on. The samples alone cannot show this: a
// cluster with no node up sends none, so the last leader seen would seem
// to lead through the outage. The gap is drawn as no leader in that term.
func clipLeaders(leaders []leaderSpan, spans []laneSpan) []leaderSpan {
	var out []leaderSpan
	for _, l := range leaders {
		if l.node == "" {
			out = append(out, l)
			continue
		}
		var downs [][2]float64
		for _, s := range spans {
			if s.node == l.node && s.band == bandProcess && notLeading[s.state] && s.to > l.from && s.from < l.to {
				downs = append(downs, [2]float64{math.Max(s.from, l.from), math.Min(s.to, l.to)})
			}
		}
		sort.Slice(downs, func(i, j int) bool { return downs[i][0] < downs[j][0] })
		at := l.from
		for _, d := range downs {
			if d[0] > at {
				out = append(out, leaderSpan{from: at, to: d[0], node: l.node, term: l.term})
			}
			if d[1] > at {
				out = append(out, leaderSpan{from: math.Max(at, d[0]), to: d[1], term: l.term})
				at = d[1]
			}
		}
		if at < l.to {
			out = append(out, leaderSpan{from: at, to: l.to, node: l.node, term: l.term})
		}
	}
	return out
}

// laneNodes are the nodes to draw rows for: every node the history or the
// samples name, in natural order (n2 before n10).
func laneNodes(ops []history.Op, values []history.FaultValue, samples []checker.LagSample) []string {
	seen := map[string]bool{}
	for _, op := range ops {
		if op.Node != "" {
			seen[op.Node] = true
		}
	}
	for _, v := range values {
		for _, t := range v.Targets {
			seen[t] = true
		}
	}
	for _, s := range samples {
		seen[s.Node] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool {
		if len(out[i]) != len(out[j]) {
			return len(out[i]) < len(out[j])
		}
		return out[i] < out[j]
	})
	return out
}

const (
	laneRow    = 34 // one node's row
	laneGap    = 4
	leaderRow  = 20
	lanesTop   = 40 // title and legend
	bandHeight = 9
)

// lanesChart draws the node rows and the leader row on the charts' time
// axis.
func lanesChart(nodes []string, spans []laneSpan, leaders []leaderSpan, termChanges []float64, tmax float64) string {
	x := axis{lo: 0, hi: tmax, from: plotLeft, to: chartWidth - plotRight}
	leaderTop := float64(lanesTop + len(nodes)*(laneRow+laneGap) + 6)
	bottom := leaderTop + leaderRow
	height := int(bottom) + plotBottom
	var b strings.Builder
	const title = "Nodes: what the nemesis did to each, and who led"
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart lanes" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`,
		chartWidth, height, chartWidth, height, esc(title))
	fmt.Fprintf(&b, `<text x="%d" y="14" class="title">%s</text>`, plotLeft, esc(title))
	// Legend on its own line under the title: eleven keys do not fit
	// beside it.
	lx := float64(plotLeft)
	for _, k := range laneLegend {
		label := k
		if k == "cut" {
			label = "cut from some"
		}
		fmt.Fprintf(&b, `<rect x="%s" y="21" width="10" height="10" fill="%s" stroke="#ced4da"/><text x="%s" y="30" class="legend">%s</text>`,
			f1(lx), laneColors[k], f1(lx+14), esc(label))
		lx += float64(len(label))*6.2 + 24
	}
	for _, t := range linearTicks(0, tmax, 10) {
		px := x.at(t)
		fmt.Fprintf(&b, `<line x1="%s" x2="%s" y1="%d" y2="%s" class="grid"/>`, f1(px), f1(px), lanesTop, f1(bottom))
		fmt.Fprintf(&b, `<text x="%s" y="%s" class="tick" text-anchor="middle">%s</text>`, f1(px), f1(bottom+14), esc(trimFloat(t)))
	}
	fmt.Fprintf(&b, `<text x="%s" y="%s" class="axis-title" text-anchor="middle">time since start (s)</text>`, f1((x.from+x.to)/2), f1(bottom+30))

	bandY := map[int][2]float64{ // offset in the row, height
		bandProcess: {0, laneRow},
		bandNetwork: {2, bandHeight},
		bandDisk:    {2 + bandHeight + 2, bandHeight},
		bandClock:   {2 + 2*(bandHeight+2), bandHeight},
	}
	for i, n := range nodes {
		top := float64(lanesTop + i*(laneRow+laneGap))
		fmt.Fprintf(&b, `<g class="lane" data-node="%s">`, esc(n))
		fmt.Fprintf(&b, `<text x="%d" y="%s" class="tick" text-anchor="end">%s</text>`, plotLeft-6, f1(top+laneRow/2+4), esc(n))
		fmt.Fprintf(&b, `<rect x="%s" y="%s" width="%s" height="%d" fill="%s"><title>%s up</title></rect>`,
			f1(x.from), f1(top), f1(x.to-x.from), laneRow, laneColors["up"], esc(n))
		for _, band := range []int{bandProcess, bandNetwork, bandDisk, bandClock} {
			for _, s := range spans {
				if s.node != n || s.band != band {
					continue
				}
				x0, x1 := x.at(s.from), x.at(s.to)
				w := math.Max(x1-x0, 2)
				y := bandY[band]
				fmt.Fprintf(&b, `<g class="span" data-state="%s"><title>%s: %s (%s)</title><rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`,
					esc(s.state), esc(n), esc(s.label), esc(s.title), f1(x0), f1(top+y[0]), f1(w), f1(y[1]), laneColors[s.state])
				if band == bandProcess {
					if float64(len(s.label))*6.2+4 <= w {
						fmt.Fprintf(&b, `<text x="%s" y="%s" class="lane-label" style="fill:#fff">%s</text>`, f1(x0+2), f1(top+laneRow-3), esc(s.label))
					}
				} else if float64(len(s.label))*5.2+4 <= w {
					fmt.Fprintf(&b, `<text x="%s" y="%s" class="band-label">%s</text>`, f1(x0+2), f1(top+y[0]+y[1]-1), esc(s.label))
				}
				b.WriteString(`</g>`)
			}
		}
		b.WriteString(`</g>`)
	}

	fmt.Fprintf(&b, `<text x="%d" y="%s" class="tick" text-anchor="end">leader</text>`, plotLeft-6, f1(leaderTop+leaderRow/2+4))
	colors := map[string]string{}
	for i, n := range nodes {
		colors[n] = seriesColor(i)
	}
	for _, l := range leaders {
		x0, x1 := x.at(l.from), x.at(l.to)
		w := math.Max(x1-x0, 1)
		col, label := colors[l.node], l.node+" · term "+strconv.FormatUint(l.term, 10)
		if l.node == "" {
			col, label = "#dee2e6", "no leader · term "+strconv.FormatUint(l.term, 10)
		} else if col == "" {
			col = "#495057"
		}
		fmt.Fprintf(&b, `<g class="leader" data-node="%s"><title>%s, %ss–%ss</title><rect x="%s" y="%s" width="%s" height="%d" fill="%s" fill-opacity="0.85"/>`,
			esc(l.node), esc(label), trimFloat(math.Round(l.from*1000)/1000), trimFloat(math.Round(l.to*1000)/1000), f1(x0), f1(leaderTop), f1(w), leaderRow, col)
		if float64(len(label))*6.2+4 <= w {
			fill := "#fff"
			if l.node == "" {
				fill = "#495057"
			}
			fmt.Fprintf(&b, `<text x="%s" y="%s" class="lane-label" style="fill:%s">%s</text>`, f1(x0+3), f1(leaderTop+leaderRow-6), fill, esc(label))
		}
		b.WriteString(`</g>`)
	}
	for _, t := range termChanges {
		px := x.at(t)
		fmt.Fprintf(&b, `<line class="term-change" x1="%s" x2="%s" y1="%s" y2="%s" stroke="#212529" stroke-width="1.5"><title>term change at %ss</title></line>`,
			f1(px), f1(px), f1(leaderTop-3), f1(leaderTop+leaderRow+3), trimFloat(math.Round(t*1000)/1000))
	}
	if len(leaders) == 0 {
		fmt.Fprintf(&b, `<text x="%s" y="%s" class="empty" text-anchor="middle">no lag samples: who led is unknown</text>`, f1((x.from+x.to)/2), f1(leaderTop+leaderRow-6))
	}
	return b.String() + "</svg>"
}
