package report

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"

	"github.com/tidaldb/tidal/harness/checker"
)

// The charts are plain SVG written here rather than by a plotting library:
// report.html must be one file that opens anywhere, offline, years later.
// Every chart shares the time axis of the history (seconds since start)
// and shades the fault windows, so a latency spike, a throughput hole and
// a lagging follower line up with the fault that caused them.

const (
	chartWidth  = 1000
	plotLeft    = 64 // room for y tick labels
	plotRight   = 16
	plotBottom  = 36 // x tick labels and axis title
	laneHeight  = 15 // one row of fault labels
	plotHeight  = 240
	minLabelGap = 4
)

var (
	colorOK   = "#2f9e44"
	colorFail = "#e03131"
	colorInfo = "#f08c00"
)

// faultColor gives each kind of fault a stable colour across charts.
func faultColor(f string) string {
	switch f {
	case "partition":
		return "#3b5bdb"
	case "kill":
		return "#c92a2a"
	case "pause":
		return "#9c36b5"
	case "restart":
		return "#e8590c"
	case "slow":
		return "#0c8599"
	case "transfer-leader":
		return "#5c940d"
	case "remove-member", "add-member":
		return "#495057"
	case "clock":
		return "#f08c00" // as the clock band of the node lanes
	}
	palette := []string{"#1864ab", "#862e9c", "#a61e4d", "#2b8a3e", "#d9480f", "#5f3dc4"}
	h := 0
	for _, c := range f {
		h = h*31 + int(c)
	}
	return palette[(h%len(palette)+len(palette))%len(palette)]
}

// seriesColor colours one line per node.
func seriesColor(i int) string {
	palette := []string{"#1971c2", "#e8590c", "#2f9e44", "#9c36b5", "#c2255c", "#0c8599", "#5c940d", "#495057"}
	return palette[i%len(palette)]
}

// axis maps data values to pixels along one dimension.
type axis struct {
	lo, hi   float64 // data range
	from, to float64 // pixel range
	log      bool
}

func (a axis) at(v float64) float64 {
	if a.log {
		v, lo, hi := math.Log10(math.Max(v, a.lo)), math.Log10(a.lo), math.Log10(a.hi)
		return a.from + (v-lo)/(hi-lo)*(a.to-a.from)
	}
	if a.hi == a.lo {
		return a.from
	}
	return a.from + (v-a.lo)/(a.hi-a.lo)*(a.to-a.from)
}

// chart is one SVG plot with a time x axis and fault windows shaded.
type chart struct {
	b        strings.Builder
	x, y     axis
	top      float64 // y pixel of the plot area's top
	bottom   float64 // y pixel of the plot area's bottom
	height   int
	faultTop float64
}

// newChart lays out a chart for times 0..tmax seconds with fault labels
// in lanes above the plot area.
func newChart(title string, tmax float64, y axis, faults []checker.FaultWindow) *chart {
	lanes := faultLanes(faults, tmax)
	nLanes := 0
	for _, l := range lanes {
		nLanes = max(nLanes, l+1)
	}
	c := &chart{faultTop: 22}
	c.top = c.faultTop + float64(nLanes*laneHeight) + 6
	c.bottom = c.top + plotHeight
	c.height = int(c.bottom) + plotBottom
	c.x = axis{lo: 0, hi: tmax, from: plotLeft, to: chartWidth - plotRight}
	y.from, y.to = c.bottom, c.top
	c.y = y
	fmt.Fprintf(&c.b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`,
		chartWidth, c.height, chartWidth, c.height, esc(title))
	fmt.Fprintf(&c.b, `<text x="%d" y="14" class="title">%s</text>`, plotLeft, esc(title))
	c.shadeFaults(faults, lanes)
	return c
}

// faultLanes assigns each window a label row so labels do not overlap:
// the first row whose previous label ends before this window starts.
func faultLanes(faults []checker.FaultWindow, tmax float64) []int {
	x := axis{lo: 0, hi: tmax, from: plotLeft, to: chartWidth - plotRight}
	var laneEnd []float64
	lanes := make([]int, len(faults))
	for i, w := range faults {
		start := x.at(sec(w.Start))
		end := math.Max(x.at(sec(w.End)), start+float64(len(w.Label()))*6.2+minLabelGap)
		lane := -1
		for l, e := range laneEnd {
			if e <= start {
				lane = l
				break
			}
		}
		if lane < 0 {
			lane = len(laneEnd)
			laneEnd = append(laneEnd, 0)
		}
		laneEnd[lane] = end
		lanes[i] = lane
	}
	return lanes
}

func (c *chart) shadeFaults(faults []checker.FaultWindow, lanes []int) {
	for i, w := range faults {
		x0, x1 := c.x.at(sec(w.Start)), c.x.at(sec(w.End))
		width := math.Max(x1-x0, 1.5)
		col := faultColor(w.F)
		fmt.Fprintf(&c.b, `<g class="fault" data-f="%s"><title>%s</title>`, esc(w.F), esc(w.String()))
		fmt.Fprintf(&c.b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s" fill-opacity="0.13"/>`,
			f1(x0), f1(c.top), f1(width), f1(c.bottom-c.top), col)
		if w.Effective >= 0 {
			// Solid edge where the nemesis saw the fault take effect.
			xe := c.x.at(sec(w.Effective))
			fmt.Fprintf(&c.b, `<line x1="%s" x2="%s" y1="%s" y2="%s" stroke="%s" stroke-width="1"/>`, f1(xe), f1(xe), f1(c.top), f1(c.bottom), col)
		}
		if !w.Healed {
			fmt.Fprintf(&c.b, `<line x1="%s" x2="%s" y1="%s" y2="%s" stroke="%s" stroke-dasharray="3 3"/>`, f1(x1), f1(x1), f1(c.top), f1(c.bottom), col)
		}
		ly := c.faultTop + float64(lanes[i]*laneHeight)
		fmt.Fprintf(&c.b, `<rect x="%s" y="%s" width="%s" height="3" fill="%s"/>`, f1(x0), f1(ly+laneHeight-4), f1(width), col)
		label := w.Label()
		if !w.Healed {
			label += " (never healed)"
		}
		fmt.Fprintf(&c.b, `<text x="%s" y="%s" class="fault-label" fill="%s">%s</text></g>`, f1(x0+1), f1(ly+laneHeight-6), col, esc(label))
	}
}

// axes draws the frame, grid and tick labels. yLabel formats a y tick.
func (c *chart) axes(xTitle, yTitle string, yTicks []float64, yLabel func(float64) string) {
	fmt.Fprintf(&c.b, `<rect x="%s" y="%s" width="%s" height="%s" class="frame"/>`, f1(c.x.from), f1(c.top), f1(c.x.to-c.x.from), f1(c.bottom-c.top))
	for _, t := range linearTicks(c.x.lo, c.x.hi, 10) {
		px := c.x.at(t)
		fmt.Fprintf(&c.b, `<line x1="%s" x2="%s" y1="%s" y2="%s" class="grid"/>`, f1(px), f1(px), f1(c.top), f1(c.bottom))
		fmt.Fprintf(&c.b, `<text x="%s" y="%s" class="tick" text-anchor="middle">%s</text>`, f1(px), f1(c.bottom+14), esc(trimFloat(t)))
	}
	for _, v := range yTicks {
		py := c.y.at(v)
		fmt.Fprintf(&c.b, `<line x1="%s" x2="%s" y1="%s" y2="%s" class="grid"/>`, f1(c.x.from), f1(c.x.to), f1(py), f1(py))
		fmt.Fprintf(&c.b, `<text x="%s" y="%s" class="tick" text-anchor="end">%s</text>`, f1(c.x.from-4), f1(py+4), esc(yLabel(v)))
	}
	fmt.Fprintf(&c.b, `<text x="%s" y="%s" class="axis-title" text-anchor="middle">%s</text>`, f1((c.x.from+c.x.to)/2), f1(c.bottom+30), esc(xTitle))
	fmt.Fprintf(&c.b, `<text x="12" y="%s" class="axis-title" text-anchor="middle" transform="rotate(-90 12 %s)">%s</text>`,
		f1((c.top+c.bottom)/2), f1((c.top+c.bottom)/2), esc(yTitle))
}

// legend draws colour keys at the top right.
func (c *chart) legend(items [][2]string) {
	x := float64(chartWidth - plotRight)
	for i := len(items) - 1; i >= 0; i-- {
		label, col := items[i][0], items[i][1]
		x -= float64(len(label))*6.2 + 22
		fmt.Fprintf(&c.b, `<rect x="%s" y="5" width="10" height="10" fill="%s"/><text x="%s" y="14" class="legend">%s</text>`,
			f1(x), col, f1(x+14), esc(label))
	}
}

func (c *chart) svg() string { return c.b.String() + "</svg>" }

// linearTicks returns about n round tick values within [lo, hi].
func linearTicks(lo, hi float64, n int) []float64 {
	if hi <= lo {
		return []float64{lo}
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ticks []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		ticks = append(ticks, math.Round(v/step)*step)
	}
	return ticks
}

// decadeTicks returns the powers of ten within [lo, hi] (lo > 0).
func decadeTicks(lo, hi float64) []float64 {
	var ticks []float64
	for e := math.Ceil(math.Log10(lo) - 1e-9); math.Pow(10, e) <= hi*(1+1e-9); e++ {
		ticks = append(ticks, math.Pow(10, e))
	}
	return ticks
}

func sec(ns int64) float64 { return float64(ns) / 1e9 }

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func trimFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func esc(s string) string { return html.EscapeString(s) }

// latencyLabel renders a latency tick given in milliseconds.
func latencyLabel(msv float64) string {
	switch {
	case msv == 0:
		return "0"
	case msv >= 1000:
		return trimFloat(msv/1000) + "s"
	case msv >= 1:
		return trimFloat(msv) + "ms"
	}
	return trimFloat(msv*1000) + "µs"
}
