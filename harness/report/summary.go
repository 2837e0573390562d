package report

import (
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// summaryExamples is how many instances of each anomaly the terminal
// summary shows; the rest are in results.json and report.html.
const summaryExamples = 5

// Summary writes a compact, colour-free account of a verdict for the
// terminal: the verdict, one line per checker, then the evidence behind
// any failure (lost and doubled writes with their acks and the faults
// around them, bad reads, diverged digests), follower lag against the
// SLO, operation counts, and where the run is stored. It is meant to make
// a failed CI run understandable from its log alone. run may be nil.
func Summary(w io.Writer, res checker.Results, run *Run) error {
	sw := &summaryWriter{w: w}
	head := "verdict: " + verdictWord(res.Valid)
	if run != nil {
		head += "  test " + run.Test()
	}
	sw.line(head)

	tw := tabwriter.NewWriter(sw, 0, 0, 2, ' ', 0)
	for _, r := range res.Results {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", r.Name, r.Valid, oneLine(r.Summary))
	}
	tw.Flush()

	for _, r := range res.Results {
		switch r.Name {
		case "ledger":
			if d, ok := detailsAs[checker.LedgerDetails](r); ok {
				sw.ledger(d)
			}
		case "counter":
			if d, ok := detailsAs[checker.CounterDetails](r); ok {
				sw.counter(d)
			}
		case "linearizable":
			if d, ok := detailsAs[checker.LinearizableDetails](r); ok {
				sw.linearizable(d, run)
			}
		case "convergence":
			if d, ok := detailsAs[checker.ConvergenceDetails](r); ok && r.Valid != checker.Valid {
				sw.convergence(d)
			}
		case "lag":
			if d, ok := detailsAs[checker.LagDetails](r); ok {
				sw.lag(d)
			}
		case "nodes":
			if d, ok := detailsAs[checker.NodesDetails](r); ok {
				sw.nodes(d)
			}
		case "faults":
			if d, ok := detailsAs[checker.FaultsDetails](r); ok {
				sw.faultKinds(d)
			}
		case "responses":
			if d, ok := detailsAs[checker.ResponsesDetails](r); ok {
				sw.responses(d)
			}
		}
	}
	if r, ok := resultNamed(res.Results, "stats"); ok {
		if d, ok := detailsAs[checker.StatsDetails](r); ok {
			sw.stats(d)
		}
	}
	if run != nil {
		sw.line("store: " + run.Dir())
		sw.line("report: " + run.Path(ReportFile))
	}
	return sw.err
}

type summaryWriter struct {
	w   io.Writer
	err error
}

func (s *summaryWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	s.err = err
	return n, err
}

func (s *summaryWriter) line(format string, args ...any) {
	fmt.Fprintf(s, format+"\n", args...)
}

func verdictWord(v checker.Validity) string {
	switch v {
	case checker.Valid:
		return "VALID"
	case checker.Invalid:
		return "INVALID"
	}
	return "UNKNOWN"
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func (s *summaryWriter) ledger(d checker.LedgerDetails) {
	if d.Lost.Count > 0 {
		s.line("lost writes: %d of %d acknowledged ids%s", d.Lost.Count, d.Acked, showing(len(d.Lost.Examples), d.Lost.Count))
		for _, l := range first(d.Lost.Examples) {
			s.line("  %s  acked by %s seq %d term %d at %s; sent to %s by process %s at %s", l.ID,
				l.Ack.Node, l.Ack.Seq, l.Ack.Term, history.FormatTime(l.Ack.Time), l.Node, l.Process, history.FormatTime(l.Time))
			where := "missing on " + strings.Join(l.MissingOn, ",")
			if len(l.PresentOn) > 0 {
				where += ", present on " + strings.Join(l.PresentOn, ",")
			}
			s.line("      %s", where)
			s.faults(l.Faults)
		}
	}
	if d.Dup.Count > 0 {
		s.line("duplicated ids: %d%s", d.Dup.Count, showing(len(d.Dup.Examples), d.Dup.Count))
		for _, e := range first(d.Dup.Examples) {
			s.line("  %s  %s  %s", e.ID, e.Reason, formatIndexes(e.Indexes))
		}
	}
	landed := func(title string, a checker.Anomalies[checker.LandedWrite]) {
		if a.Count == 0 {
			return
		}
		s.line("%s: %d%s", title, a.Count, showing(len(a.Examples), a.Count))
		for _, e := range first(a.Examples) {
			line := fmt.Sprintf("  %s  %s write sent to %s by process %s at %s; index %d on %s", e.ID, e.Outcome, e.Node, e.Process,
				history.FormatTime(e.Time), e.Index, strings.Join(e.PresentOn, ","))
			if len(e.MissingOn) > 0 {
				line += ", missing on " + strings.Join(e.MissingOn, ",")
			}
			s.line("%s", line)
		}
	}
	landed("failed writes that were applied", d.FailedApp)
	landed("unacknowledged writes on some nodes only", d.Divergent)
	if d.Unexp.Count > 0 {
		s.line("ids no client sent: %d%s", d.Unexp.Count, showing(len(d.Unexp.Examples), d.Unexp.Count))
		for _, e := range first(d.Unexp.Examples) {
			s.line("  %s  index %d on %s", e.ID, e.Index, strings.Join(e.Nodes, ","))
		}
	}
	if d.DoubleApplied.Count > 0 {
		s.line("writes sent once, acknowledged at another index than where they landed, no duplicates in the ack (applied twice): %d%s",
			d.DoubleApplied.Count, showing(len(d.DoubleApplied.Examples), d.DoubleApplied.Count))
		for _, m := range first(d.DoubleApplied.Examples) {
			s.line("  %s  acked by %s at seq %d, found at index %d", m.ID, m.Ack.Node, m.Ack.Seq, m.Index)
		}
	}
	if d.MemoryShort.Count > 0 {
		s.line("acknowledged ids missing from the id memory whose events the applied state holds (the id memory is missing or smaller than the applied state; not lost): %d", d.MemoryShort.Count)
		for _, g := range d.MemoryGaps {
			s.line("  %s remembers %d ids, its entity counts hold %d events", g.Node, g.Remembered, g.Applied)
		}
	}
}

func (s *summaryWriter) responses(d checker.ResponsesDetails) {
	if d.Internal > 0 {
		s.line("500 internal answers to valid requests: %d%s", d.Internal, showing(len(d.InternalExamples), d.Internal))
		for _, e := range first(d.InternalExamples) {
			s.line("  %s", e)
		}
	}
	if d.Suspicious > 0 {
		s.line("gRPC Unknown with no fault around it (a finding, not judged): %d%s", d.Suspicious, showing(len(d.SuspiciousExamples), d.Suspicious))
		for _, e := range first(d.SuspiciousExamples) {
			s.line("  %s", e)
		}
	}
}

// summaryLogLines is how many log lines of a crashed node the summary
// quotes; results.json and report.html hold more.
const summaryLogLines = 8

func (s *summaryWriter) nodes(d checker.NodesDetails) {
	for _, c := range first(d.Crashes) {
		line := "crashed: " + c.Node + " " + c.Reason
		if c.Time >= 0 {
			line += " at " + history.FormatTime(c.Time)
		}
		if c.PID != 0 {
			line += fmt.Sprintf(" (pid %d)", c.PID)
		}
		s.line("%s", line)
		for _, l := range c.Logs {
			lines := l.Lines[max(0, len(l.Lines)-summaryLogLines):]
			s.line("  last %d lines of %s:", len(lines), l.Path)
			for _, ln := range lines {
				s.line("    %s", ln)
			}
		}
	}
	if len(d.Crashes) > summaryExamples {
		s.line("  (%d crashes in all; see results.json)", len(d.Crashes))
	}
	for _, n := range sortedKeys(d.Refused) {
		s.line("down at the end, as allowed: %s %s", n, d.Refused[n])
	}
}

func (s *summaryWriter) faultKinds(d checker.FaultsDetails) {
	parts := make([]string, 0, len(d.Kinds))
	for _, o := range d.Kinds {
		p := fmt.Sprintf("%s %d invoked/%d took effect/%d healed", o.Name, o.Invoked, o.TookEffect, o.Healed)
		if o.Healed > o.Bit && (o.F == history.FDisk || o.F == history.FPowerCut) {
			p += fmt.Sprintf("/%d did nothing to a disk", o.Healed-o.Bit)
		}
		if !o.Cycled() && len(o.Errors) > 0 {
			p += " (first error: " + o.Errors[0] + ")"
		}
		parts = append(parts, p)
	}
	s.line("fault kinds: %s", strings.Join(parts, "; "))
	for _, h := range first(d.FailedHeals) {
		s.line("  heal not confirmed: %s at %s ended %s: %s", h.F, history.FormatTime(h.Time), h.Outcome, h.Error)
	}
}

func (s *summaryWriter) faults(ws []checker.FaultWindow) {
	if len(ws) == 0 {
		s.line("      faults within %v: none", checker.FaultMargin)
		return
	}
	for _, w := range ws {
		s.line("      fault: %s", w)
	}
}

func (s *summaryWriter) counter(d checker.CounterDetails) {
	if d.Violations.Count == 0 {
		return
	}
	s.line("counter reads out of bounds: %d of %d%s", d.Violations.Count, d.Reads, showing(len(d.Violations.Examples), d.Violations.Count))
	for _, v := range first(d.Violations.Examples) {
		s.line("  key %d read %d, allowed %d..%d; process %s on %s, %s..%s", v.Key, v.Value, v.Lower, v.Upper,
			v.Process, v.Node, history.FormatTime(v.Start), history.FormatTime(v.End))
		s.faults(v.Faults)
	}
}

func (s *summaryWriter) linearizable(d checker.LinearizableDetails, run *Run) {
	shown := 0
	for _, k := range d.Keys {
		if k.Result != "illegal" || shown == summaryExamples {
			continue
		}
		shown++
		line := fmt.Sprintf("  key %d not linearizable (%d ops)", k.Key, k.Ops)
		if k.Visualization != "" {
			dir := ""
			if run != nil {
				dir = run.Dir()
			}
			line += "; see " + runRelative(dir, k.Visualization)
		}
		s.line("%s", line)
	}
}

func (s *summaryWriter) convergence(d checker.ConvergenceDetails) {
	indexes := make([]uint64, 0, len(d.Groups))
	for i := range d.Groups {
		indexes = append(indexes, i)
	}
	sort.Slice(indexes, func(a, b int) bool { return indexes[a] < indexes[b] })
	s.line("digests:")
	for _, i := range indexes {
		for _, digest := range sortedKeys(d.Groups[i]) {
			s.line("  %s at index %d: %s", strings.Join(d.Groups[i][digest], ","), i, abbreviate(digest, 16))
		}
	}
}

func (s *summaryWriter) lag(d checker.LagDetails) {
	if len(d.Followers) == 0 {
		return
	}
	s.line("follower lag (ok/OVER SLO judges the p99 outside faults against %v; every catch-up after a heal must take ≤ %v):", d.SLO.P99, d.SLO.CatchUp)
	tw := tabwriter.NewWriter(s, 0, 0, 2, ' ', 0)
	for _, f := range d.Followers {
		verdict := "ok"
		if !f.P99OK {
			verdict = "OVER SLO"
		}
		fmt.Fprintf(tw, "  %s\tp99 %s\tmax %s\t(%d entries max)\toutside faults: p99 %s over %d samples\t%s\n", f.Node,
			ms(f.Overall.P99Ms), ms(f.Overall.MaxMs), f.Overall.MaxEntries, ms(f.Outside.P99Ms), f.Outside.Samples, verdict)
	}
	tw.Flush()
	var slowest *checker.CatchUp
	bad := 0
	for i, c := range d.CatchUps {
		if !c.OK {
			bad++
			if bad <= summaryExamples {
				if c.CaughtUpAt < 0 {
					s.line("  %s never caught up after the heal of %s at %s", c.Node, c.Fault, history.FormatTime(c.HealedAt))
				} else {
					s.line("  %s caught up %s after the heal of %s at %s: OVER SLO", c.Node, ms(c.Ms), c.Fault, history.FormatTime(c.HealedAt))
				}
			}
			continue
		}
		if c.CaughtUpAt >= 0 && (slowest == nil || c.Ms > slowest.Ms) {
			slowest = &d.CatchUps[i]
		}
	}
	if slowest != nil {
		s.line("  slowest catch-up within the SLO: %s, %s after the heal of %s at %s", slowest.Node, ms(slowest.Ms), slowest.Fault, history.FormatTime(slowest.HealedAt))
	}
}

func (s *summaryWriter) stats(d checker.StatsDetails) {
	fs := sortedKeys(d.ByF)
	parts := make([]string, 0, len(fs))
	for _, f := range fs {
		o := d.ByF[f]
		parts = append(parts, fmt.Sprintf("%s %d ok/%d fail/%d info", f, o.OK, o.Fail, o.Info))
	}
	s.line("ops: %s", strings.Join(parts, "; "))
	s.line("  (one op is one request; a write op may carry many event ids, which the ledger counts as acknowledged ids. ok: answered success; fail: refused, known not applied; info: outcome unknown — a timeout, a lost connection — so it may have been applied, and the ledger checker settles each from the final audit; a 500 among them breaks the API's contract, which the responses checker reports)")
	if len(d.Faults) > 0 {
		var parts []string
		for _, f := range sortedKeys(d.Faults) {
			if _, heal := history.HealedBy(f); heal {
				continue
			}
			o := d.Faults[f]
			part := fmt.Sprintf("%s ×%d", f, o.OK+o.Fail+o.Info)
			if o.Fail+o.Info > 0 {
				part += fmt.Sprintf(" (%d failed, %d unconfirmed)", o.Fail, o.Info)
			}
			parts = append(parts, part)
		}
		if len(parts) > 0 {
			s.line("faults: %s", strings.Join(parts, ", "))
		}
	}
}

func showing(shown, count int) string {
	shown = min(shown, summaryExamples)
	if shown >= count {
		return ""
	}
	return fmt.Sprintf(" (first %d)", shown)
}

func first[T any](xs []T) []T { return xs[:min(len(xs), summaryExamples)] }

func formatIndexes(byNode map[string][]uint64) string {
	parts := make([]string, 0, len(byNode))
	for _, n := range sortedKeys(byNode) {
		parts = append(parts, fmt.Sprintf("%s at %v", n, byNode[n]))
	}
	return strings.Join(parts, ", ")
}

// ms renders a lag in milliseconds the way people read it.
func ms(v float64) string {
	if v < 0 {
		return "never"
	}
	return time.Duration(v * float64(time.Millisecond)).Round(time.Millisecond).String()
}

func abbreviate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// runRelative shows path relative to the run directory dir when it lies
// inside it (what a link in report.html needs, and shorter to read).
func runRelative(dir, path string) string {
	if dir == "" || !filepath.IsAbs(path) {
		return filepath.ToSlash(path)
	}
	rel, err := filepath.Rel(dir, path)
	if err != nil || strings.HasPrefix(rel, "..") {
		return path
	}
	return filepath.ToSlash(rel)
}
