package report

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/tidaldb/tidal/harness/checker"
)

// keepReport copies a rendered report to $TIDAL_REPORT_OUT/<name>.html
// when set, to look at it in a browser.
func keepReport(t *testing.T, run *Run, name string) {
	out := os.Getenv("TIDAL_REPORT_OUT")
	if out == "" {
		return
	}
	if err := os.CopyFS(filepath.Join(out, name), os.DirFS(run.Dir())); err != nil {
		t.Logf("keeping the report: %v", err)
	}
}

// parsedPage is report.html parsed, with what the tests look for.
type parsedPage struct {
	root *html.Node
	text string
}

func parsePage(t *testing.T, b []byte) parsedPage {
	t.Helper()
	root, err := html.Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("report.html does not parse: %v", err)
	}
	var text strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && (n.Data == "style" || n.Data == "title") {
			return
		}
		if n.Type == html.TextNode {
			text.WriteString(n.Data)
			text.WriteByte(' ')
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(root)
	return parsedPage{root: root, text: strings.Join(strings.Fields(text.String()), " ")}
}

// all returns the elements matching pred, in document order.
func (p parsedPage) all(pred func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && pred(n) {
			out = append(out, n)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(p.root)
	return out
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func tag(name string) func(*html.Node) bool {
	return func(n *html.Node) bool { return n.Data == name }
}

func TestReportFromSyntheticRun(t *testing.T) {
	run, err := NewRun(t.TempDir(), "ledger-mixed", time.Date(2026, 11, 30, 17, 55, 2, 591e6, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	res := synthRun(t, run, 30, 4)
	if res.Valid != checker.Invalid {
		t.Fatalf("the synthetic run plants a lost and a doubled write: expected an invalid verdict, found %v: %+v", res.Valid, res.Results)
	}
	rr := run.NewResults(res, run.Started().Add(31*time.Second))
	if err := run.WriteResults(rr); err != nil {
		t.Fatal(err)
	}
	if err := run.WriteReport(rr); err != nil {
		t.Fatal(err)
	}
	keepReport(t, run, "synthetic")
	b, err := os.ReadFile(run.Path(ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	page := parsePage(t, b)

	// Self-contained: no scripts, nothing fetched.
	if s := page.all(tag("script")); len(s) > 0 {
		t.Errorf("expected no <script>, found %d", len(s))
	}
	for _, n := range page.all(func(n *html.Node) bool { return attr(n, "src") != "" || n.Data == "link" }) {
		t.Errorf("expected no external resource, found <%s src=%q href=%q>", n.Data, attr(n, "src"), attr(n, "href"))
	}

	for _, id := range []string{"verdicts", "timeline", "faults", "checkers", "nodes", "config", "checker-ledger", "checker-lag", "lost-writes"} {
		if len(page.all(func(n *html.Node) bool { return attr(n, "id") == id })) != 1 {
			t.Errorf("expected one element with id %q", id)
		}
	}

	// Three charts, each shading both faults, and the node lanes under
	// them (lanes_test.go looks inside).
	svgs := page.all(tag("svg"))
	if len(svgs) != 4 {
		t.Fatalf("expected 4 charts (latency, throughput, lag, node lanes), found %d", len(svgs))
	}
	for _, want := range []string{"Latency", "Throughput", "Follower replication lag", "Nodes"} {
		found := false
		for _, s := range svgs {
			found = found || strings.HasPrefix(attr(s, "aria-label"), want)
		}
		if !found {
			t.Errorf("expected a chart titled %q", want)
		}
	}
	for i, s := range svgs[:3] {
		sub := parsedPage{root: s}
		for _, f := range []string{"partition", "kill"} {
			groups := sub.all(func(n *html.Node) bool { return n.Data == "g" && attr(n, "class") == "fault" && attr(n, "data-f") == f })
			if len(groups) != 1 {
				t.Errorf("chart %d: expected one shaded %s window, found %d", i, f, len(groups))
				continue
			}
			rects := parsedPage{root: groups[0]}.all(tag("rect"))
			if len(rects) == 0 || attr(rects[0], "fill-opacity") == "" {
				t.Errorf("chart %d: %s window: expected a translucent rect", i, f)
			}
		}
	}
	ledger, _ := resultNamed(res.Results, "ledger")
	d := ledger.Details.(checker.LedgerDetails)
	// The latency chart has points of every outcome; the lag chart a line
	// per follower and the SLO.
	lat := parsedPage{root: svgs[0]}
	for _, cls := range []string{"points ok", "points fail", "points info"} {
		g := lat.all(func(n *html.Node) bool { return attr(n, "class") == cls })
		if len(g) != 1 || len(parsedPage{root: g[0]}.all(tag("circle"))) == 0 {
			t.Errorf("latency chart: expected points in group %q", cls)
		}
	}
	marks := lat.all(func(n *html.Node) bool { return attr(n, "class") == "mark" })
	if len(marks) != 1 || !strings.Contains(parsedPage{root: marks[0]}.all(tag("title"))[0].FirstChild.Data, "lost write "+d.Lost.Examples[0].ID) {
		t.Errorf("latency chart: expected one mark titled with the lost write %s, found %d marks", d.Lost.Examples[0].ID, len(marks))
	}
	lag := parsedPage{root: svgs[2]}
	for _, n := range []string{"n2", "n3"} {
		if len(lag.all(func(x *html.Node) bool { return attr(x, "data-node") == n })) != 1 {
			t.Errorf("lag chart: expected a series for follower %s", n)
		}
	}
	if len(lag.all(func(x *html.Node) bool { return attr(x, "class") == "slo" })) != 1 {
		t.Errorf("lag chart: expected the SLO line")
	}

	// The verdicts and the evidence.
	lost := d.Lost.Examples[0]
	for _, want := range []string{
		"INVALID", "ledger-mixed", "20261130",
		ledger.Summary,
		"Lost writes", lost.ID, "by n1 seq", "partition(isolate-one)",
		"Duplicated ids", "twice-on-node",
		"Catch-up after heals", "p99 outside faults",
		"tidal-chaos repro " + run.Dir(),
	} {
		if !strings.Contains(page.text, want) {
			t.Errorf("expected the page to say %q", want)
		}
	}

	// Every relative link resolves to a file in the run directory, and
	// every node's log is linked.
	hrefs := map[string]bool{}
	for _, a := range page.all(tag("a")) {
		h := attr(a, "href")
		hrefs[h] = true
		if strings.HasPrefix(h, "#") {
			continue
		}
		if filepath.IsAbs(h) || strings.Contains(h, "://") {
			t.Errorf("expected relative links, found %q", h)
			continue
		}
		if _, err := os.Stat(filepath.Join(run.Dir(), filepath.FromSlash(h))); err != nil {
			t.Errorf("link %q does not resolve in the run directory: %v", h, err)
		}
	}
	for _, want := range []string{"nodes/n1/node.log", "nodes/n2/stdout.log", "nodes/n3/stats.jsonl", "history.jsonl", "results.json", "audits/n3.ndjson"} {
		if !hrefs[want] {
			t.Errorf("expected a link to %s", want)
		}
	}
	if hrefs["nodes/n1/data"] {
		t.Errorf("expected no link to a node's data directory")
	}
}

// A report rendered from results read back from results.json (details as
// generic JSON, as analyze would have them) shows the same evidence.
func TestReportFromStoredResults(t *testing.T) {
	run, err := NewRun(t.TempDir(), "stored", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	res := synthRun(t, run, 16, 3)
	if err := run.WriteResults(run.NewResults(res, time.Now())); err != nil {
		t.Fatal(err)
	}
	stored, err := run.ReadResults()
	if err != nil {
		t.Fatal(err)
	}
	var fresh, again bytes.Buffer
	if err := RenderHTML(&fresh, Report{Results: run.NewResults(res, stored.Ended), Dir: run.Dir()}); err != nil {
		t.Fatal(err)
	}
	if err := RenderHTML(&again, Report{Results: stored, Dir: run.Dir()}); err != nil {
		t.Fatal(err)
	}
	a, b := parsePage(t, fresh.Bytes()).text, parsePage(t, again.Bytes()).text
	if a != b {
		i := 0
		for i < len(a) && i < len(b) && a[i] == b[i] {
			i++
		}
		from := max(i-200, 0)
		t.Errorf("expected the same page from fresh and stored results; they differ at byte %d:\nfresh:  …%.400s\nstored: …%.400s", i, a[from:], b[from:])
	}
	if !strings.Contains(b, "Lost writes") {
		t.Errorf("expected the stored results' lost writes on the page")
	}
}

func TestReportFromTestdataRun(t *testing.T) {
	run := testdataRun(t)
	res := checkRun(t, run)
	rr := run.NewResults(res, run.Started().Add(2*time.Second))
	if rr.Seed != 42 {
		t.Errorf("expected the seed from the store, 42, found %d", rr.Seed)
	}
	if err := run.WriteReport(rr); err != nil {
		t.Fatal(err)
	}
	keepReport(t, run, "testdata")
	b, err := os.ReadFile(run.Path(ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	page := parsePage(t, b)
	// e-3 was acked by n1 (seq 22, term 3) while n3 was isolated and
	// never reached n3.
	for _, want := range []string{"1 of 3 acknowledged ids lost", "e-3", "by n1 seq 22 term 3 at 0.900s",
		"partition(isolate-one) 0.300s..1.650s on n3", `"workload": "ledger"`} {
		if !strings.Contains(page.text, want) {
			t.Errorf("expected the page to say %q", want)
		}
	}
	if n := len(page.all(func(n *html.Node) bool { return attr(n, "class") == "fault" })); n != 3 {
		t.Errorf("expected the partition shaded on each of 3 charts, found %d shaded windows", n)
	}
}

// testdataRun copies testdata/ledger-partition into a store, as a run.
func testdataRun(t *testing.T) *Run {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ledger-partition", "20261130T175502.591Z")
	if err := os.CopyFS(dir, os.DirFS("testdata/ledger-partition")); err != nil {
		t.Fatal(err)
	}
	run, err := OpenRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// Rendering never fails for lack of data: the page says what is missing.
func TestReportWithoutData(t *testing.T) {
	run, err := NewRun(t.TempDir(), "empty", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(run.HistoryPath(), []byte("{\"index\":0}\n{\"index\":1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rr := run.NewResults(checker.NewResults(checker.Result{Name: "run", Valid: checker.Unknown, Summary: "cluster never elected a leader"}), time.Now())
	if err := run.WriteReport(rr); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(run.Path(ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	page := parsePage(t, b)
	for _, want := range []string{"UNKNOWN", "cluster never elected a leader", "history.jsonl:1", "No faults were injected"} {
		if !strings.Contains(page.text, want) {
			t.Errorf("expected the page to say %q; it says: %.800s", want, page.text)
		}
	}
}

func BenchmarkRenderHTML(b *testing.B) {
	run, err := NewRun(b.TempDir(), "bench", time.Now())
	if err != nil {
		b.Fatal(err)
	}
	res := synthRun(b, run, 60, 16)
	ops, err := run.ReadHistory()
	if err != nil {
		b.Fatal(err)
	}
	lag, err := run.ReadLag()
	if err != nil {
		b.Fatal(err)
	}
	rep := Report{Results: run.NewResults(res, time.Now()), History: ops, Lag: lag, Dir: run.Dir()}
	var size int
	for b.Loop() {
		var buf bytes.Buffer
		if err := RenderHTML(&buf, rep); err != nil {
			b.Fatal(err)
		}
		size = buf.Len()
	}
	b.ReportMetric(float64(len(ops)), "ops")
	b.ReportMetric(float64(size)/1024, "KiB/page")
}

// A linearizability failure links porcupine's visualization, relative to
// the run, from the checker's section and from the nodes section.
func TestReportLinksLinearizabilityVisualization(t *testing.T) {
	run, err := NewRun(t.TempDir(), "counter", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("testdata/counter-stale-read.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(run.HistoryPath(), b, 0o644); err != nil {
		t.Fatal(err)
	}
	ops, err := run.ReadHistory()
	if err != nil {
		t.Fatal(err)
	}
	lin := checker.Linearizable(ops, run.LinearizableDir(), time.Minute)
	if lin.Valid != checker.Invalid {
		t.Fatalf("expected the stale read to be caught, found %v: %s", lin.Valid, lin.Summary)
	}
	rr := run.NewResults(checker.NewResults(lin, checker.Counter(ops)), time.Now())
	if err := run.WriteReport(rr); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(run.Path(ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	p := parsePage(t, page)
	var links []string
	for _, a := range p.all(tag("a")) {
		if h := attr(a, "href"); strings.HasPrefix(h, "linearizable/") {
			links = append(links, h)
			if _, err := os.Stat(filepath.Join(run.Dir(), h)); err != nil {
				t.Errorf("link %s does not resolve: %v", h, err)
			}
		}
	}
	if len(links) != 2 {
		t.Errorf("expected the visualization linked twice (checker and nodes sections), found %v", links)
	}
	var sum bytes.Buffer
	if err := Summary(&sum, rr.Checker(), run); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sum.String(), "; see linearizable/linearizable-") {
		t.Errorf("expected the summary to point at the visualization, found:\n%s", sum.String())
	}
}
