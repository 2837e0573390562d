package report

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// Report is everything report.html shows. RenderHTML is a pure function
// of it; Run.WriteReport gathers it from the store.
type Report struct {
	Results RunResults
	History []history.Op
	Lag     []checker.LagSample
	// Dir is the run directory, shown in the header; links are relative
	// to it, so the directory can be copied or archived whole.
	Dir string
	// Files are run files to link (relative paths), e.g. history.jsonl.
	Files []string
	// NodeFiles are each node's logs and stats (relative paths), by node.
	NodeFiles map[string][]string
	// Visualizations are porcupine HTML files (relative paths).
	Visualizations []string
	// Problems are things that went wrong gathering the data (a history
	// that does not parse, a missing file); shown at the top.
	Problems []string
	// Sections are tables other tools added to the run (WriteSection).
	Sections []Section
}

// WriteReport renders report.html for rr from what the store holds
// (history, lag samples, node files, visualizations) and writes it
// atomically. Missing or unreadable data is reported in the page rather
// than failing it: a report on a broken run is when one is most needed.
func (r *Run) WriteReport(rr RunResults) error {
	rep := Report{Results: rr, Dir: r.dir}
	var err error
	if rep.History, err = r.ReadHistory(); err != nil {
		rep.Problems = append(rep.Problems, err.Error())
	}
	if rep.Lag, err = r.ReadLag(); err != nil {
		rep.Problems = append(rep.Problems, err.Error())
	}
	if rep.NodeFiles, err = r.NodeFiles(); err != nil {
		rep.Problems = append(rep.Problems, err.Error())
	}
	for _, name := range []string{HistoryFile, ResultsFile, ConfigFile, SeedFile, ScheduleFile, LagFile, DigestsFile, NodesFile} {
		if _, err := os.Stat(r.Path(name)); err == nil {
			rep.Files = append(rep.Files, name)
		}
	}
	audits, _ := filepath.Glob(filepath.Join(r.dir, auditsDir, "*.ndjson"))
	for _, a := range audits {
		rep.Files = append(rep.Files, runRelative(r.dir, a))
	}
	if rep.Sections, err = r.ReadSections(); err != nil {
		rep.Problems = append(rep.Problems, err.Error())
	}
	vis, _ := filepath.Glob(filepath.Join(r.LinearizableDir(), "*.html"))
	for _, v := range vis {
		rep.Visualizations = append(rep.Visualizations, runRelative(r.dir, v))
	}
	return writeAtomic(r.Path(ReportFile), func(w io.Writer) error { return RenderHTML(w, rep) })
}

// RenderHTML writes report.html: one self-contained page (inline CSS and
// SVG, no scripts, nothing fetched) with the verdict of every checker and
// its evidence, latency, throughput and follower lag over time with the
// fault windows shaded, and links to the node logs and visualizations.
func RenderHTML(w io.Writer, rep Report) error {
	return pageTemplate.Execute(w, buildPage(rep))
}

type link struct{ Href, Text string }

type checkerView struct {
	checker.Result
	Class   string
	Ledger  *checker.LedgerDetails
	Counter *checker.CounterDetails
	Lin     *checker.LinearizableDetails
	Conv    *checker.ConvergenceDetails
	Lag     *checker.LagDetails
	Stats   *checker.StatsDetails
	Nodes   *checker.NodesDetails
	Faults  *checker.FaultsDetails
	Clock   *checker.ClockDetails
	Raw     string
}

type nodeView struct {
	Name  string
	Files []link
}

type page struct {
	Test, Dir          string
	Verdict, Class     string
	Started, Ended     string
	Duration           string
	Seed               int64
	Repro              string
	Config             string
	Files              []link
	Problems           []string
	Checkers           []checkerView
	Charts             []template.HTML
	Faults             []checker.FaultWindow
	Availability       []faultAvailability
	Nodes              []nodeView
	Visualizations     []link
	HasLag, HasHistory bool
	Sections           []Section
}

func buildPage(rep Report) page {
	rr := rep.Results
	p := page{Test: rr.Test, Dir: rep.Dir, Verdict: verdictWord(rr.Valid), Class: validClass(rr.Valid), Seed: rr.Seed,
		Problems: rep.Problems, HasLag: len(rep.Lag) > 0, HasHistory: len(rep.History) > 0, Sections: rep.Sections}
	if !rr.Started.IsZero() {
		p.Started = rr.Started.UTC().Format(time.RFC3339Nano)
	}
	if !rr.Ended.IsZero() {
		p.Ended = rr.Ended.UTC().Format(time.RFC3339Nano)
		if !rr.Started.IsZero() {
			p.Duration = rr.Ended.Sub(rr.Started).Round(time.Millisecond).String()
		}
	}
	if rep.Dir != "" {
		p.Repro = "tidal-chaos repro " + rep.Dir
	}
	if len(rr.Config) > 0 {
		var v any
		if json.Unmarshal(rr.Config, &v) == nil {
			b, _ := json.MarshalIndent(v, "", "  ")
			p.Config = string(b)
		}
	}
	for _, f := range rep.Files {
		p.Files = append(p.Files, link{Href: f, Text: f})
	}
	for _, n := range sortedKeys(rep.NodeFiles) {
		nv := nodeView{Name: n}
		for _, f := range rep.NodeFiles[n] {
			nv.Files = append(nv.Files, link{Href: f, Text: filepath.Base(f)})
		}
		p.Nodes = append(p.Nodes, nv)
	}
	seenVis := map[string]bool{}
	for _, v := range rep.Visualizations {
		seenVis[v] = true
		p.Visualizations = append(p.Visualizations, link{Href: v, Text: v})
	}

	for _, r := range rr.Results {
		cv := checkerView{Result: r, Class: validClass(r.Valid)}
		// Known details are shown through their types, so the page does
		// not depend on whether they came fresh or from results.json.
		raw := r.Details
		switch r.Name {
		case "ledger":
			if d, ok := detailsAs[checker.LedgerDetails](r); ok {
				cv.Ledger, raw = &d, d
			}
		case "counter":
			if d, ok := detailsAs[checker.CounterDetails](r); ok {
				cv.Counter, raw = &d, d
			}
		case "linearizable":
			if d, ok := detailsAs[checker.LinearizableDetails](r); ok {
				for i, k := range d.Keys {
					if k.Visualization == "" {
						continue
					}
					rel := runRelative(rep.Dir, k.Visualization)
					d.Keys[i].Visualization = rel
					if !seenVis[rel] {
						seenVis[rel] = true
						p.Visualizations = append(p.Visualizations, link{Href: rel, Text: rel})
					}
				}
				cv.Lin, raw = &d, d
			}
		case "convergence":
			if d, ok := detailsAs[checker.ConvergenceDetails](r); ok {
				cv.Conv, raw = &d, d
			}
		case "lag":
			if d, ok := detailsAs[checker.LagDetails](r); ok {
				cv.Lag, raw = &d, d
			}
		case "stats":
			if d, ok := detailsAs[checker.StatsDetails](r); ok {
				cv.Stats, raw = &d, d
			}
		case "nodes":
			if d, ok := detailsAs[checker.NodesDetails](r); ok {
				cv.Nodes, raw = &d, d
			}
		case "faults":
			if d, ok := detailsAs[checker.FaultsDetails](r); ok {
				cv.Faults, raw = &d, d
			}
		case "clock":
			if d, ok := detailsAs[checker.ClockDetails](r); ok {
				cv.Clock, raw = &d, d
			}
		}
		if raw != nil {
			if b, err := json.MarshalIndent(raw, "", "  "); err == nil {
				const maxRaw = 256 << 10
				if len(b) > maxRaw {
					b = append(b[:maxRaw:maxRaw], "\n… (truncated; see results.json)"...)
				}
				cv.Raw = string(b)
			}
		}
		p.Checkers = append(p.Checkers, cv)
	}

	faults, values, err := checker.FaultWindowValues(rep.History)
	if err != nil {
		p.Problems = append(p.Problems, "fault windows: "+err.Error())
	}
	p.Faults = faults
	pairs, err := history.Pairs(rep.History)
	if err != nil {
		p.Problems = append(p.Problems, "latency and throughput: "+err.Error())
		pairs = nil
	}
	tmax := 1.0
	for _, op := range rep.History {
		tmax = math.Max(tmax, sec(op.Time))
	}
	for _, s := range rep.Lag {
		tmax = math.Max(tmax, sec(s.Time))
	}
	if rep.History != nil || rep.Lag != nil {
		p.Charts = append(p.Charts,
			template.HTML(latencyChart(pairs, faults, anomalyMarks(rr.Results), tmax)),
			template.HTML(throughputChart(pairs, faults, tmax)))
		slo := checker.DefaultSLO().P99
		if r, ok := resultNamed(rr.Results, "lag"); ok {
			if d, ok := detailsAs[checker.LagDetails](r); ok && d.SLO.P99 > 0 {
				slo = d.SLO.P99
			}
		}
		var catchUps []checker.CatchUp
		if r, ok := resultNamed(rr.Results, "lag"); ok {
			if d, ok := detailsAs[checker.LagDetails](r); ok {
				catchUps = d.CatchUps
			}
		}
		p.Charts = append(p.Charts, template.HTML(lagChart(rep.Lag, faults, tmax, float64(slo)/1e6, catchUps)))
		nodes := laneNodes(rep.History, values, rep.Lag)
		leaders, terms := leaderSpans(rep.Lag, tmax)
		spans := append(nodeSpans(faults, values, nodes), crashSpans(rr.Results)...)
		leaders = clipLeaders(leaders, spans)
		p.Charts = append(p.Charts, template.HTML(lanesChart(nodes, spans, leaders, terms, tmax)))
	}
	var end int64
	if n := len(rep.History); n > 0 {
		end = rep.History[n-1].Time
	}
	p.Availability = availability(pairs, faults, end)
	return p
}

func validClass(v checker.Validity) string {
	switch v {
	case checker.Valid:
		return "valid"
	case checker.Invalid:
		return "invalid"
	}
	return "unknown"
}

var pageFuncs = template.FuncMap{
	"t":      history.FormatTime,
	"ms":     ms,
	"offset": func(msv int64) string { return signedDuration(time.Duration(msv) * time.Millisecond) },
	"seconds": func(s float64) string {
		return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
	},
	"join": func(xs []string) string { return strings.Join(xs, ", ") },
	"indexes": func(m map[string][]uint64) string {
		return formatIndexes(m)
	},
	"faultList": func(ws []checker.FaultWindow) string {
		if len(ws) == 0 {
			return "none within " + checker.FaultMargin.String()
		}
		parts := make([]string, len(ws))
		for i, w := range ws {
			parts[i] = w.String()
		}
		return strings.Join(parts, "; ")
	},
	"effective": func(w checker.FaultWindow) string {
		if w.Effective < 0 {
			return "not confirmed"
		}
		return history.FormatTime(w.Effective)
	},
	"sortedF": func(m map[string]checker.Outcomes) []string { return sortedKeys(m) },
	"sortedNodes": func(m map[string]map[string]checker.Outcomes) []string {
		return sortedKeys(m)
	},
	"windowFollowers": func(m map[string]checker.LagStats) []string { return sortedKeys(m) },
	"digestRows":      func(m map[string]checker.DigestSample) []string { return sortedKeys(m) },
	"more": func(shown, count int) string {
		if count > shown {
			return fmt.Sprintf("showing the first %d of %d", shown, count)
		}
		return ""
	},
	"outcomes": func(m map[history.Type]int) string {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, string(k))
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%d %s", m[history.Type(k)], k)
		}
		return strings.Join(parts, ", ")
	},
}

var pageTemplate = template.Must(template.New("report").Funcs(pageFuncs).Parse(pageHTML))

const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Verdict}} · {{.Test}} · tidal chaos run</title>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #212529; margin: 24px auto; max-width: 1060px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 6px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #dee2e6; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { text-align: left; padding: 3px 10px 3px 0; vertical-align: top; border-bottom: 1px solid #f1f3f5; }
th { font-weight: 600; color: #495057; }
td.num, th.num { text-align: right; }
code, pre, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
pre { background: #f8f9fa; padding: 8px; overflow: auto; max-height: 420px; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 4px; font-weight: 700; color: #fff; }
.valid .badge, .badge.valid { background: #2f9e44; }
.invalid .badge, .badge.invalid { background: #e03131; }
.unknown .badge, .badge.unknown { background: #f08c00; }
.meta td:first-child { color: #495057; padding-right: 16px; }
.problem { background: #fff4e6; border-left: 4px solid #f08c00; padding: 6px 10px; margin: 6px 0; }
.bad { color: #e03131; font-weight: 600; }
.checker { margin: 14px 0; padding: 8px 12px; border-left: 4px solid #adb5bd; }
.checker.valid { border-color: #2f9e44; }
.checker.invalid { border-color: #e03131; background: #fff5f5; }
.checker.unknown { border-color: #f08c00; background: #fff9db; }
.summary { margin: 4px 0 8px; }
.chart { display: block; max-width: 100%; height: auto; margin: 8px 0 18px; }
.chart text { font: 11px system-ui, sans-serif; fill: #343a40; }
.chart .title { font-size: 13px; font-weight: 600; }
.chart .fault-label { font-size: 10.5px; font-weight: 600; }
.chart .frame { fill: none; stroke: #adb5bd; }
.chart .grid { stroke: #e9ecef; }
.chart .empty { fill: #868e96; }
.chart .lane-label { font-size: 10.5px; font-weight: 600; }
.chart .band-label { font-size: 8.5px; fill: #fff; font-weight: 700; }
details summary { cursor: pointer; color: #495057; }
</style>
</head>
<body>
<header class="{{.Class}}">
<h1><span class="badge">{{.Verdict}}</span> {{.Test}}</h1>
<table class="meta">
{{if .Dir}}<tr><td>run</td><td class="mono">{{.Dir}}</td></tr>{{end}}
{{if .Started}}<tr><td>started</td><td>{{.Started}}</td></tr>{{end}}
{{if .Ended}}<tr><td>ended</td><td>{{.Ended}}{{if .Duration}} ({{.Duration}}){{end}}</td></tr>{{end}}
<tr><td>seed</td><td class="mono">{{.Seed}}</td></tr>
{{if .Repro}}<tr><td>replay</td><td class="mono">{{.Repro}}</td></tr>{{end}}
{{if .Files}}<tr><td>files</td><td>{{range $i, $f := .Files}}{{if $i}} · {{end}}<a href="{{$f.Href}}">{{$f.Text}}</a>{{end}}</td></tr>{{end}}
</table>
</header>
{{range .Problems}}<div class="problem">{{.}}</div>{{end}}

<section id="verdicts">
<h2>Verdicts</h2>
<table>
<tr><th>checker</th><th>valid</th><th>summary</th></tr>
{{range .Checkers}}<tr class="{{.Class}}"><td><a href="#checker-{{.Name}}">{{.Name}}</a></td><td><span class="badge">{{.Valid}}</span></td><td>{{.Summary}}</td></tr>
{{else}}<tr><td colspan="3">no checker ran</td></tr>{{end}}
</table>
</section>

<section id="timeline">
<h2>Timeline</h2>
{{if .Charts}}{{range .Charts}}{{.}}
{{end}}{{else}}<p>No history or lag samples to plot.</p>{{end}}
<h3 id="faults">Faults</h3>
{{if .Faults}}<table>
<tr><th>fault</th><th>targets</th><th class="num">invoked</th><th class="num">took effect</th><th class="num">healed</th></tr>
{{range .Faults}}<tr><td>{{.Label}}</td><td>{{join .Targets}}</td><td class="num">{{t .Start}}</td><td class="num">{{effective .}}</td><td class="num">{{if .Healed}}{{t .End}}{{else}}<span class="bad">never</span>{{end}}</td></tr>
{{end}}</table>{{else}}<p>No faults were injected.</p>{{end}}
{{if .Availability}}<h3 id="availability">Availability per fault</h3>
<p>Writes as clients saw them (any node): the longest stretch without a successful write from the fault's invoke until writes succeeded again after its heal, and how long after the heal the first one succeeded; and the client ops (any kind) answered 503 (unavailable), 504 (outcome unknown) or 408 (body too slow) while the fault was in effect.</p>
<table>
<tr><th>fault</th><th>targets</th><th class="num">window</th><th class="num">ok writes during</th><th class="num">longest without an ok write</th><th class="num">first ok write after the heal</th><th class="num">503 / 504 / 408</th></tr>
{{range .Availability}}<tr><td>{{.Window.Label}}</td><td>{{join .Window.Targets}}</td><td class="num">{{t .Window.Start}}..{{t .Window.End}}</td><td class="num">{{.OKWrites}}</td><td class="num">{{seconds .OutageS}}{{if .OutageEnd}} (to the end){{end}}</td><td class="num">{{if ge .ResumedS 0.0}}{{seconds .ResumedS}}{{else}}<span class="bad">none</span>{{end}}</td><td class="num">{{.Refused.Unavailable}} / {{.Refused.Timeout}} / {{.Refused.BodyTimeout}}</td></tr>
{{end}}</table>{{end}}
</section>

{{range .Sections}}<section class="extra">
<h2>{{.Title}}</h2>
{{if .Text}}<p>{{.Text}}</p>{{end}}
<table>
<tr>{{range .Columns}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
</section>
{{end}}
<section id="checkers">
<h2>Checkers</h2>
{{range .Checkers}}<div class="checker {{.Class}}" id="checker-{{.Name}}">
<h3><span class="badge">{{.Valid}}</span> {{.Name}}</h3>
<p class="summary">{{.Summary}}</p>
{{with .Ledger}}{{template "ledger" .}}{{end}}
{{with .Counter}}{{template "counter" .}}{{end}}
{{with .Lin}}{{template "linearizable" .}}{{end}}
{{with .Conv}}{{template "convergence" .}}{{end}}
{{with .Lag}}{{template "lag" .}}{{end}}
{{with .Stats}}{{template "stats" .}}{{end}}
{{with .Nodes}}{{template "nodes" .}}{{end}}
{{with .Faults}}{{template "faults" .}}{{end}}
{{with .Clock}}{{template "clock" .}}{{end}}
{{if .Raw}}<details><summary>all details (JSON)</summary><pre>{{.Raw}}</pre></details>{{end}}
</div>
{{end}}
</section>

<section id="nodes">
<h2>Nodes</h2>
{{if .Nodes}}<table>
{{range .Nodes}}<tr><td>{{.Name}}</td><td>{{range $i, $f := .Files}}{{if $i}} · {{end}}<a href="{{$f.Href}}">{{$f.Text}}</a>{{else}}no files{{end}}</td></tr>
{{end}}</table>{{else}}<p>No node files in the store.</p>{{end}}
{{if .Visualizations}}<h3>Linearizability visualizations</h3><ul>
{{range .Visualizations}}<li><a href="{{.Href}}">{{.Text}}</a></li>{{end}}</ul>{{end}}
</section>

{{if .Config}}<section id="config"><h2>Configuration</h2><pre>{{.Config}}</pre></section>{{end}}
</body>
</html>
{{define "ledger"}}<table>
<tr><th>audited nodes</th><td>{{join .Nodes}}{{if .Removed}} (removed for good, not audited: {{join .Removed}}){{end}}</td></tr>
{{range .Missing}}<tr><th>not audited</th><td class="bad">{{.Node}}{{if .Crashed}} crashed{{end}}: {{.Reason}}</td></tr>{{end}}
<tr><th>write ops</th><td>{{outcomes .Outcomes}}</td></tr>
<tr><th>event ids</th><td>{{.IDs}} sent, {{.Acked}} acknowledged</td></tr>
<tr><th>lost</th><td{{if .Lost.Count}} class="bad"{{end}}>{{.Lost.Count}}</td></tr>
<tr><th>duplicated</th><td{{if .Dup.Count}} class="bad"{{end}}>{{.Dup.Count}}</td></tr>
<tr><th>failed but applied</th><td{{if .FailedApp.Count}} class="bad"{{end}}>{{.FailedApp.Count}}</td></tr>
<tr><th>on some nodes only</th><td{{if .Divergent.Count}} class="bad"{{end}}>{{.Divergent.Count}}</td></tr>
<tr><th>sent by no client</th><td{{if .Unexp.Count}} class="bad"{{end}}>{{.Unexp.Count}}</td></tr>
<tr><th>info writes</th><td>{{.Recovered.Count}} landed everywhere, {{.NotLanded}} nowhere</td></tr>
<tr><th>acked at another index, no duplicates (applied twice)</th><td{{if .DoubleApplied.Count}} class="bad"{{end}}>{{.DoubleApplied.Count}}</td></tr>
<tr><th>ack index mismatches of retries</th><td>{{.AckIndex.Count}} (informational)</td></tr>
<tr><th>id memory short of the applied state</th><td{{if .MemoryShort.Count}} class="unknown"{{end}}>{{.MemoryShort.Count}} acknowledged ids absent from the audit, their events in the entity counts{{range .MemoryGaps}}; {{.Node}} remembers {{.Remembered}} ids, holds {{.Applied}} events{{end}}</td></tr>
</table>
{{if .Lost.Count}}<h3 id="lost-writes">Lost writes</h3><p>{{more (len .Lost.Examples) .Lost.Count}}</p>
<table><tr><th>id</th><th>sent</th><th>acknowledged</th><th>missing on</th><th>present on</th><th>faults around it</th></tr>
{{range .Lost.Examples}}<tr><td class="mono">{{.ID}}</td><td>process {{.Process}} to {{.Node}} at {{t .Time}} (op {{.Invoke}})</td>
<td>by {{.Ack.Node}} seq {{.Ack.Seq}} term {{.Ack.Term}} at {{t .Ack.Time}}</td><td class="bad">{{join .MissingOn}}</td><td>{{join .PresentOn}}</td><td>{{faultList .Faults}}</td></tr>
{{end}}</table>{{end}}
{{if .Dup.Count}}<h3>Duplicated ids</h3><p>{{more (len .Dup.Examples) .Dup.Count}}</p>
<table><tr><th>id</th><th>reason</th><th>indexes</th></tr>
{{range .Dup.Examples}}<tr><td class="mono">{{.ID}}</td><td>{{.Reason}}</td><td>{{indexes .Indexes}}</td></tr>{{end}}</table>{{end}}
{{if .FailedApp.Count}}<h3>Failed writes that were applied</h3>{{template "landed" .FailedApp}}{{end}}
{{if .Divergent.Count}}<h3>Unacknowledged writes on some nodes only</h3>{{template "landed" .Divergent}}{{end}}
{{if .Unexp.Count}}<h3>Ids no client sent</h3><table><tr><th>id</th><th>index</th><th>nodes</th></tr>
{{range .Unexp.Examples}}<tr><td class="mono">{{.ID}}</td><td>{{.Index}}</td><td>{{join .Nodes}}</td></tr>{{end}}</table>{{end}}
{{end}}
{{define "landed"}}<p>{{more (len .Examples) .Count}}</p><table><tr><th>id</th><th>outcome</th><th>sent</th><th>index</th><th>present on</th><th>missing on</th></tr>
{{range .Examples}}<tr><td class="mono">{{.ID}}</td><td>{{.Outcome}}</td><td>process {{.Process}} to {{.Node}} at {{t .Time}}</td><td>{{.Index}}</td><td>{{join .PresentOn}}</td><td>{{join .MissingOn}}</td></tr>{{end}}</table>{{end}}
{{define "counter"}}<p>{{.Reads}} ok reads checked over {{.Keys}} keys; adds: {{outcomes .Adds}}.</p>
{{if .Violations.Count}}<h3>Reads outside the possible range</h3><p>{{more (len .Violations.Examples) .Violations.Count}}</p>
<table><tr><th>key</th><th>read</th><th>allowed</th><th>by</th><th>when</th><th>faults around it</th></tr>
{{range .Violations.Examples}}<tr><td>{{.Key}}</td><td class="bad">{{.Value}}</td><td>{{.Lower}}..{{.Upper}}</td><td>process {{.Process}} on {{.Node}}</td><td>{{t .Start}}..{{t .End}}</td><td>{{faultList .Faults}}</td></tr>{{end}}</table>{{end}}
{{end}}
{{define "linearizable"}}<p>{{len .Keys}} keys; {{.Illegal}} not linearizable, {{.Unknown}} undecided.</p>
{{if or .Illegal .Unknown}}<table><tr><th>key</th><th>ops</th><th>result</th><th>visualization</th></tr>
{{range .Keys}}{{if ne .Result "ok"}}<tr><td>{{.Key}}</td><td>{{.Ops}}</td><td{{if eq .Result "illegal"}} class="bad"{{end}}>{{.Result}}{{if .Error}} ({{.Error}}){{end}}</td><td>{{if .Visualization}}<a href="{{.Visualization}}">{{.Visualization}}</a>{{end}}</td></tr>{{end}}{{end}}</table>{{end}}
{{end}}
{{define "convergence"}}<table><tr><th>node</th><th>applied index</th><th>digest</th></tr>
{{$nodes := .Nodes}}{{range digestRows .Nodes}}{{$d := index $nodes .}}<tr><td>{{.}}</td><td>{{$d.AppliedIndex}}</td><td class="mono">{{$d.Digest}}</td></tr>{{end}}
{{range .Missing}}<tr><td>{{.Node}}</td><td colspan="2" class="bad">no digest{{if .Crashed}} (crashed){{end}}: {{.Reason}}</td></tr>{{end}}
{{range .Removed}}<tr><td>{{.}}</td><td colspan="2">removed for good, not compared</td></tr>{{end}}</table>
{{end}}
{{define "lag"}}<p>SLO: each follower's p99 lag outside fault windows ≤ {{.SLO.P99}}; catch-up after a heal ≤ {{.SLO.CatchUp}}.</p>
{{range .Violations}}<div class="problem">{{.}}</div>{{end}}
<table><tr><th>follower</th><th class="num">samples</th><th class="num">p50</th><th class="num">p99</th><th class="num">max</th><th class="num">max entries</th><th class="num">p99 outside faults</th><th>SLO</th></tr>
{{range .Followers}}<tr><td>{{.Node}}</td><td class="num">{{.Overall.Samples}}</td><td class="num">{{ms .Overall.P50Ms}}</td><td class="num">{{ms .Overall.P99Ms}}</td><td class="num">{{ms .Overall.MaxMs}}</td><td class="num">{{.Overall.MaxEntries}}</td><td class="num">{{ms .Outside.P99Ms}} ({{.Outside.Samples}} samples)</td><td>{{if .P99OK}}ok{{else}}<span class="bad">exceeded</span>{{end}}</td></tr>
{{end}}</table>
{{if .CatchUps}}<h3>Catch-up after heals</h3><table><tr><th>heal of</th><th>healed at</th><th>follower</th><th class="num">caught up after</th><th>SLO</th></tr>
{{range .CatchUps}}<tr><td>{{.Fault}}</td><td>{{t .HealedAt}}</td><td>{{.Node}}</td><td class="num">{{if ge .CaughtUpAt 0}}{{ms .Ms}}{{else if .Interrupted}}next fault began first{{else if .Undecided}}sampling ended first{{else}}never{{end}}</td><td>{{if .OK}}ok{{else}}<span class="bad">exceeded</span>{{end}}</td></tr>
{{end}}</table>{{end}}
{{if .Windows}}<h3>Lag during each fault</h3><table><tr><th>fault</th><th>follower</th><th class="num">p99</th><th class="num">max</th><th class="num">max entries</th></tr>
{{range .Windows}}{{$w := .Window}}{{$f := .Followers}}{{range windowFollowers .Followers}}{{$s := index $f .}}<tr><td>{{$w.Label}} {{t $w.Start}}..{{t $w.End}}</td><td>{{.}}</td><td class="num">{{ms $s.P99Ms}}</td><td class="num">{{ms $s.MaxMs}}</td><td class="num">{{$s.MaxEntries}}</td></tr>
{{end}}{{end}}</table>{{end}}
{{end}}
{{define "nodes"}}{{if .Crashes}}<h3 id="crashed-nodes">Crashed nodes</h3>
{{range .Crashes}}<div class="problem"><b>{{.Node}}</b> {{.Reason}}{{if ge .Time 0}} at {{t .Time}}{{end}}{{if .PID}} (pid {{.PID}}){{end}}{{with .Status}}; exit: <span class="mono">{{.Text}}</span>{{if ge .Code 0}}, code {{.Code}}{{end}}{{if .Signal}}, signal {{.Signal}}{{end}}{{end}}{{if .Panic}}; <span class="bad">panicked</span>{{end}}
{{range .Logs}}<details open><summary>last lines of <a href="{{.Path}}">{{.Path}}</a></summary><pre>{{range .Lines}}{{.}}
{{end}}</pre></details>{{end}}</div>
{{end}}{{end}}
<p>{{.Exits}} process exits, {{.Expected}} asked for by the harness or by a member removal.</p>
{{if .Final}}<table><tr><th>node after the final heal</th><th>harness state</th><th>process</th><th>serving</th></tr>
{{range .Final}}<tr><td>{{.Node}}</td><td>{{.State}}</td><td>{{if .Alive}}alive{{else}}exited{{end}}</td><td>{{if .Serving}}yes{{else if eq .State "removed"}}removed for good{{else}}<span class="bad">no</span>{{if .Error}}: {{.Error}}{{end}}{{end}}</td></tr>
{{end}}</table>{{end}}
{{end}}
{{define "faults"}}<table><tr><th>requested kind</th><th class="num">invoked</th><th class="num">took effect</th><th class="num">healed</th><th class="num">failed</th><th class="num">unconfirmed</th><th>first error</th></tr>
{{range .Kinds}}<tr><td>{{.Name}}</td><td class="num">{{.Invoked}}</td><td class="num{{if not .TookEffect}} bad{{end}}">{{.TookEffect}}</td><td class="num{{if not .Healed}} bad{{end}}">{{.Healed}}</td><td class="num">{{.Failed}}</td><td class="num">{{.Unconfirmed}}</td><td>{{if .Errors}}{{index .Errors 0}}{{end}}</td></tr>
{{end}}</table>
{{if .FailedHeals}}<h3>Heals that did not take effect</h3><table><tr><th>heal</th><th>invoked</th><th>outcome</th><th>error</th></tr>
{{range .FailedHeals}}<tr><td>{{.F}}</td><td>{{t .Time}}</td><td class="bad">{{.Outcome}}</td><td>{{.Error}}</td></tr>{{end}}</table>{{end}}
{{if .Unhealed}}<h3>Faults possibly still in effect at the end</h3><ul>{{range .Unhealed}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{end}}
{{define "clock"}}<table><tr><th>node</th><th class="num">clock offset</th><th class="num">bound</th><th class="num">invoked</th><th class="num">took effect</th><th class="num">heal invoked</th></tr>
{{range .Shifts}}<tr><td>{{.Node}}</td><td class="num{{if .Beyond}} bad{{end}}">{{offset .OffsetMS}}</td><td class="num">{{offset .BoundMS}}</td><td class="num">{{t .Start}}</td><td class="num">{{if ge .Effective 0}}{{t .Effective}}{{else}}not confirmed{{end}}</td><td class="num">{{if .Healed}}{{t .HealStart}}{{else}}never{{end}}</td></tr>
{{end}}</table>
<p>{{.Writes}} writes sent to nodes beyond the bound while shifted, {{.Refused}} refused.</p>
{{if .Violations.Count}}<h3>Writes acknowledged with a clock beyond the bound</h3><p>{{more (len .Violations.Examples) .Violations.Count}}</p>
<table><tr><th>op</th><th>by</th><th>sent</th><th>acknowledged</th><th>its clock off by</th></tr>
{{range .Violations.Examples}}<tr><td>{{.F}} (op {{.Invoke}}, process {{.Process}})</td><td>{{.Shift.Node}}</td><td>{{t .Start}}</td><td class="bad">{{t .End}}</td><td>{{offset .Shift.OffsetMS}}</td></tr>{{end}}</table>{{end}}
{{end}}
{{define "stats"}}<table><tr><th>operation</th><th class="num">ok</th><th class="num">fail</th><th class="num">info</th><th class="num">never completed</th></tr>
{{$byF := .ByF}}{{range sortedF .ByF}}{{$o := index $byF .}}<tr><td>{{.}}</td><td class="num">{{$o.OK}}</td><td class="num">{{$o.Fail}}</td><td class="num">{{$o.Info}}</td><td class="num">{{$o.Pending}}</td></tr>{{end}}
</table>
{{if .ByNode}}<details><summary>per node</summary><table><tr><th>node</th><th>operation</th><th class="num">ok</th><th class="num">fail</th><th class="num">info</th></tr>
{{$byNode := .ByNode}}{{range sortedNodes .ByNode}}{{$n := .}}{{$m := index $byNode .}}{{range sortedF $m}}{{$o := index $m .}}<tr><td>{{$n}}</td><td>{{.}}</td><td class="num">{{$o.OK}}</td><td class="num">{{$o.Fail}}</td><td class="num">{{$o.Info}}</td></tr>{{end}}{{end}}
</table></details>{{end}}
{{end}}
`
