package report

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// latencyChart plots every completed client operation at its invoke time
// against its latency, log scale, coloured by outcome. Points falling on
// the same pixel cell with the same outcome are drawn once: a long run
// has hundreds of thousands of operations and the picture is the same.
// Operations that never completed have no latency and are only counted.
// Marks (lost or doubled writes, at their ack) are drawn along the top
// of the plot, so each one sits under the fault that explains it.
func latencyChart(pairs []history.Pair, faults []checker.FaultWindow, marks []mark, tmax float64) string {
	type point struct {
		t, ms float64
		typ   history.Type
	}
	var pts []point
	counts := map[history.Type]int{}
	pending := 0
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() {
			continue
		}
		if p.Pending {
			pending++
			continue
		}
		msv := math.Max(float64(p.Completion.Time-p.Invoke.Time)/1e6, 0.001)
		pts = append(pts, point{sec(p.Invoke.Time), msv, p.Type()})
		counts[p.Type()]++
		lo, hi = math.Min(lo, msv), math.Max(hi, msv)
	}
	if len(pts) == 0 {
		lo, hi = 1, 1000
	}
	y := axis{lo: math.Pow(10, math.Floor(math.Log10(lo))), hi: math.Pow(10, math.Floor(math.Log10(hi))+1), log: true}
	if y.hi <= y.lo {
		y.hi = y.lo * 10
	}
	c := newChart("Latency of client operations (at invoke time)", tmax, y, faults)
	ticks := decadeTicks(y.lo, y.hi)
	if len(ticks) <= 3 { // a narrow range: decades alone leave the axis bare
		ticks = nil
		for _, d := range decadeTicks(y.lo, y.hi) {
			for _, m := range []float64{1, 2, 5} {
				if v := d * m; v <= y.hi {
					ticks = append(ticks, v)
				}
			}
		}
	}
	c.axes("time since start (s)", "latency", ticks, latencyLabel)
	radius := "1.8"
	if len(pts) < 2000 {
		radius = "3"
	}
	// Failures and unknowns last, so they stay visible on top of the oks.
	for _, typ := range []history.Type{history.OK, history.Info, history.Fail} {
		col := outcomeColor(typ)
		seen := map[[2]int]bool{}
		fmt.Fprintf(&c.b, `<g class="points %s" fill="%s" fill-opacity="0.6">`, typ, col)
		for _, p := range pts {
			if p.typ != typ {
				continue
			}
			px, py := c.x.at(p.t), c.y.at(p.ms)
			cell := [2]int{int(px / 2), int(py / 2)}
			if seen[cell] {
				continue
			}
			seen[cell] = true
			fmt.Fprintf(&c.b, `<circle cx="%s" cy="%s" r="%s"/>`, f1(px), f1(py), radius)
		}
		c.b.WriteString(`</g>`)
	}
	for _, m := range marks {
		px := c.x.at(m.t)
		fmt.Fprintf(&c.b, `<g class="mark"><title>%s</title><line x1="%s" x2="%s" y1="%s" y2="%s" stroke="%s" stroke-dasharray="2 2"/>`+
			`<path d="M%s %s l-5 -9 h10 z" fill="%s"/></g>`,
			esc(m.label), f1(px), f1(px), f1(c.top), f1(c.bottom), colorFail, f1(px), f1(c.top+9), colorFail)
	}
	legend := [][2]string{
		{fmt.Sprintf("ok (%d)", counts[history.OK]), colorOK},
		{fmt.Sprintf("fail (%d)", counts[history.Fail]), colorFail},
		{fmt.Sprintf("info (%d)", counts[history.Info]), colorInfo},
	}
	if len(marks) > 0 {
		legend = append(legend, [2]string{fmt.Sprintf("lost write ▼ (%d)", len(marks)), colorFail})
	}
	if pending > 0 {
		legend = append(legend, [2]string{fmt.Sprintf("never completed (%d, not shown)", pending), "#adb5bd"})
	}
	c.legend(legend)
	return c.svg()
}

// mark is an anomaly to point at on the timeline.
type mark struct {
	t     float64 // seconds
	label string
}

// anomalyMarks points at the lost writes (at their ack) that the ledger
// result lists.
func anomalyMarks(results []checker.Result) []mark {
	r, ok := resultNamed(results, "ledger")
	if !ok {
		return nil
	}
	d, ok := detailsAs[checker.LedgerDetails](r)
	if !ok {
		return nil
	}
	var marks []mark
	for _, l := range d.Lost.Examples {
		marks = append(marks, mark{t: sec(l.Ack.Time), label: fmt.Sprintf("lost write %s: acked by %s seq %d term %d at %s, missing on %s",
			l.ID, l.Ack.Node, l.Ack.Seq, l.Ack.Term, history.FormatTime(l.Ack.Time), strings.Join(l.MissingOn, ","))})
	}
	return marks
}

func outcomeColor(t history.Type) string {
	switch t {
	case history.OK:
		return colorOK
	case history.Fail:
		return colorFail
	}
	return colorInfo
}

// bucketSeconds picks a throughput bucket so a run has at most about 300
// of them.
func bucketSeconds(tmax float64) float64 {
	for _, b := range []float64{1, 2, 5, 10, 15, 30, 60, 120, 300, 600} {
		if tmax/b <= 300 {
			return b
		}
	}
	return math.Ceil(tmax / 300)
}

// throughputChart plots client completions per second, by completion
// time, ok stacked under fail under info.
func throughputChart(pairs []history.Pair, faults []checker.FaultWindow, tmax float64) string {
	width := bucketSeconds(tmax)
	n := int(math.Ceil(tmax/width)) + 1
	buckets := make([][3]int, n) // ok, fail, info
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() || p.Pending {
			continue
		}
		i := min(int(sec(p.Completion.Time)/width), n-1)
		switch p.Type() {
		case history.OK:
			buckets[i][0]++
		case history.Fail:
			buckets[i][1]++
		default:
			buckets[i][2]++
		}
	}
	peak := 1.0
	for _, b := range buckets {
		peak = math.Max(peak, float64(b[0]+b[1]+b[2])/width)
	}
	ticks := linearTicks(0, peak, 5)
	y := axis{lo: 0, hi: math.Max(peak, ticks[len(ticks)-1])}
	title := "Throughput: completions per second"
	if width != 1 {
		title += fmt.Sprintf(" (averaged over %gs buckets)", width)
	}
	c := newChart(title, tmax, y, faults)
	c.axes("time since start (s)", "ops/s", ticks, trimFloat)
	cols := [3]string{colorOK, colorFail, colorInfo}
	for i, b := range buckets {
		t0 := float64(i) * width
		x0, x1 := c.x.at(t0), c.x.at(math.Min(t0+width, tmax))
		if x1 <= x0 {
			continue
		}
		base := 0.0
		for k, count := range b {
			if count == 0 {
				continue
			}
			top := base + float64(count)/width
			y0, y1 := c.y.at(base), c.y.at(top)
			fmt.Fprintf(&c.b, `<rect class="bar" x="%s" y="%s" width="%s" height="%s" fill="%s"><title>%gs–%gs: %d %s</title></rect>`,
				f1(x0), f1(y1), f1(math.Max(x1-x0-0.5, 0.5)), f1(y0-y1), cols[k], t0, t0+width, count, [3]string{"ok", "fail", "info"}[k])
			base = top
		}
	}
	c.legend([][2]string{{"ok", colorOK}, {"fail", colorFail}, {"info", colorInfo}})
	return c.svg()
}

// followerLagPoints computes, per node, follower lag in milliseconds over
// time the way the lag checker defines it: how long before the sample
// the leader's commit index first covered the entry after the follower's
// applied index, interpolating the commit index linearly between leader
// samples. Samples a node took while it was leader end its line: a nil
// point marks the break. The names returned are the nodes that were ever
// followers, sorted.
func followerLagPoints(samples []checker.LagSample) (map[string][]*[2]float64, []string) {
	samples = append([]checker.LagSample(nil), samples...)
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].Time < samples[j].Time })
	var times []int64
	var commits []uint64
	for _, s := range samples {
		if s.Leader == 0 || s.Leader != s.ID {
			continue
		}
		c := s.Commit
		if n := len(commits); n > 0 && commits[n-1] > c {
			c = commits[n-1] // a deposed leader's stale report
		}
		times, commits = append(times, s.Time), append(commits, c)
	}
	reached := func(idx uint64) (int64, bool) {
		i := sort.Search(len(commits), func(i int) bool { return commits[i] >= idx })
		if i == len(commits) {
			return 0, false
		}
		if i == 0 || commits[i] == commits[i-1] {
			return times[i], true
		}
		t0, t1 := float64(times[i-1]), float64(times[i])
		c0, c1 := float64(commits[i-1]), float64(commits[i])
		return int64(t0 + (t1-t0)*(float64(idx)-c0)/(c1-c0)), true
	}
	out := map[string][]*[2]float64{}
	for _, s := range samples {
		if s.Leader != 0 && s.Leader == s.ID {
			out[s.Node] = append(out[s.Node], nil)
			continue
		}
		if len(times) == 0 || s.Time < times[0] {
			continue
		}
		lag := 0.0
		if at, ok := reached(s.Applied + 1); ok && at < s.Time {
			lag = float64(s.Time-at) / 1e6
		}
		out[s.Node] = append(out[s.Node], &[2]float64{sec(s.Time), lag})
	}
	var followers []string
	for _, n := range sortedKeys(out) {
		for _, p := range out[n] {
			if p != nil {
				followers = append(followers, n)
				break
			}
		}
	}
	return out, followers
}

// lagScale is the top of the lag chart's y axis: the highest lag, unless
// a few outage spikes would flatten everything else, SLO line included.
// Then the scale stops at max(4 × SLO, the 95th percentile of the lags) and
// the spikes are drawn at the top and named in a note; the lag checker,
// not the chart, is where their size is judged.
func lagScale(values []float64, sloMs float64) float64 {
	peak := sloMs
	for _, v := range values {
		peak = math.Max(peak, v)
	}
	if sloMs > 0 && peak > 4*sloMs && len(values) > 0 {
		sorted := slices.Clone(values)
		slices.Sort(sorted)
		p95 := sorted[min(len(sorted)-1, len(sorted)*95/100)]
		peak = math.Min(peak, math.Max(4*sloMs, p95))
	}
	return math.Max(peak*1.05, 1)
}

// lagChart plots each follower's lag with the SLO's p99 bound as a
// dashed line. A line breaks where the node led or was not sampled for
// over a second (paused, killed, partitioned from the poller). Each
// catch-up window the lag checker measured after a heal
// is drawn in the follower's colour, shaded over the plot and as a bar
// along its foot, so a lag spike the checker allowed is visibly inside
// one; a follower that never caught up gets a dashed bar to the end.
func lagChart(samples []checker.LagSample, faults []checker.FaultWindow, tmax, sloMs float64, catchUps []checker.CatchUp) string {
	series, nodes := followerLagPoints(samples)
	var values []float64
	for _, pts := range series {
		for _, p := range pts {
			if p != nil {
				values = append(values, p[1])
			}
		}
	}
	peak := lagScale(values, sloMs)
	ticks := linearTicks(0, peak, 5)
	y := axis{lo: 0, hi: math.Max(peak, ticks[len(ticks)-1])}
	c := newChart("Follower replication lag (time behind the leader's commit)", tmax, y, faults)
	c.axes("time since start (s)", "lag", ticks, latencyLabel)
	if highest := slices.Max(append(values, 0)); highest > y.hi {
		fmt.Fprintf(&c.b, `<text x="%s" y="%s" class="tick off-scale" text-anchor="start">▲ peaks off scale, up to %s (drawn at the top)</text>`,
			f1(c.x.from+4), f1(c.top+11), esc(latencyLabel(highest)))
	}
	if sloMs > 0 {
		py := c.y.at(sloMs)
		fmt.Fprintf(&c.b, `<line class="slo" x1="%s" x2="%s" y1="%s" y2="%s" stroke="#212529" stroke-dasharray="6 4"/>`, f1(c.x.from), f1(c.x.to), f1(py), f1(py))
		fmt.Fprintf(&c.b, `<text x="%s" y="%s" class="tick" text-anchor="end">SLO p99 %s</text>`, f1(c.x.to-4), f1(py-4), esc(latencyLabel(sloMs)))
	}
	drawCatchUps(c, nodes, catchUps, tmax)
	var legend [][2]string
	for i, n := range nodes {
		col := seriesColor(i)
		legend = append(legend, [2]string{n, col})
		fmt.Fprintf(&c.b, `<g class="lag-series" data-node="%s" stroke="%s" fill="none" stroke-width="1.5"><title>%s</title>`, esc(n), col, esc(n))
		var line [][2]float64 // pixels
		flush := func() {
			switch len(line) {
			case 0:
			case 1: // a lone sample between breaks
				fmt.Fprintf(&c.b, `<circle r="1.5" fill="%s" cx="%s" cy="%s"/>`, col, f1(line[0][0]), f1(line[0][1]))
			default:
				fmt.Fprintf(&c.b, `<polyline points="`)
				for i, p := range line {
					if i > 0 {
						c.b.WriteByte(' ')
					}
					c.b.WriteString(f1(p[0]) + "," + f1(p[1]))
				}
				c.b.WriteString(`"/>`)
			}
			line = line[:0]
		}
		last := -1.0
		for _, p := range series[n] {
			if p == nil || (last >= 0 && p[0]-last > 1) {
				flush()
			}
			if p == nil {
				last = -1
				continue
			}
			line = append(line, [2]float64{c.x.at(p[0]), c.y.at(math.Min(p[1], y.hi))})
			last = p[0]
		}
		flush()
		c.b.WriteString(`</g>`)
	}
	if len(nodes) == 0 {
		fmt.Fprintf(&c.b, `<text x="%s" y="%s" class="empty" text-anchor="middle">no follower samples</text>`, f1((c.x.from+c.x.to)/2), f1((c.top+c.bottom)/2))
	}
	c.legend(legend)
	return c.svg()
}

// drawCatchUps draws the catch-up windows of the lag checker on c: the
// followers' colours follow nodes' order, as the lines do.
func drawCatchUps(c *chart, nodes []string, catchUps []checker.CatchUp, tmax float64) {
	color := map[string]string{}
	for i, n := range nodes {
		color[n] = seriesColor(i)
	}
	row := map[string]int{} // one bar row per follower at the plot's foot
	for _, n := range nodes {
		row[n] = len(row)
	}
	for _, cu := range catchUps {
		col, ok := color[cu.Node]
		if !ok {
			col = "#495057"
			row[cu.Node] = len(row)
		}
		x0 := c.x.at(sec(cu.HealedAt))
		end, label, dash := tmax, "", ""
		switch {
		case cu.CaughtUpAt >= 0:
			end = sec(cu.CaughtUpAt)
			label = fmt.Sprintf("%s caught up %s after the heal of %s", cu.Node, latencyLabel(cu.Ms), cu.Fault)
		case cu.Interrupted:
			label = fmt.Sprintf("%s had not caught up after the heal of %s when the next fault began", cu.Node, cu.Fault)
			dash = ` stroke-dasharray="3 2"`
		default:
			label = fmt.Sprintf("%s did not catch up after the heal of %s", cu.Node, cu.Fault)
			dash = ` stroke-dasharray="3 2"`
		}
		x1 := math.Max(c.x.at(end), x0+2)
		by := c.bottom - float64(row[cu.Node]+1)*5
		fmt.Fprintf(&c.b, `<g class="catch-up" data-follower="%s"><title>%s</title>`, esc(cu.Node), esc(label))
		if cu.CaughtUpAt >= 0 {
			fmt.Fprintf(&c.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s" fill-opacity="0.10"/>`, f1(x0), f1(c.top), f1(x1-x0), f1(c.bottom-c.top), col)
		}
		fmt.Fprintf(&c.b, `<line x1="%s" x2="%s" y1="%s" y2="%s" stroke="%s" stroke-width="3"%s/>`, f1(x0), f1(x1), f1(by), f1(by), col, dash)
		c.b.WriteString(`</g>`)
	}
}
