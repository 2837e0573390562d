package report

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
)

func TestSectionsAreRenderedAndEscaped(t *testing.T) {
	run, err := NewRun(t.TempDir(), "chaos", time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	rr := run.NewResults(checker.NewResults(checker.Result{Name: "ledger", Valid: checker.Valid}), time.Now())
	if err := run.WriteReport(rr); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(run.Path(ReportFile))
	if strings.Contains(string(before), `class="extra"`) {
		t.Fatal("expected no extra section in a run without sections")
	}
	s := Section{Title: "Shrunk schedule", Text: "1 of 9 episodes", Columns: []string{"schedule", "kind"},
		Rows: [][]string{{"original", "isolate-leader"}, {"minimal", "<script>x</script>"}}}
	if err := run.WriteSection("shrink", s); err != nil {
		t.Fatal(err)
	}
	if err := run.WriteSection("../escape", s); err == nil {
		t.Error("expected a section name with a separator refused")
	}
	got, err := run.ReadSections()
	if err != nil || len(got) != 1 || got[0].Rows[1][1] != "<script>x</script>" {
		t.Fatalf("expected the section back as written, found %+v (%v)", got, err)
	}
	if err := run.WriteReport(rr); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(run.Path(ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{"<h2>Shrunk schedule</h2>", "<p>1 of 9 episodes</p>", "<th>kind</th>", "<td>isolate-leader</td>", "&lt;script&gt;x&lt;/script&gt;"} {
		if !strings.Contains(page, want) {
			t.Errorf("expected report.html to contain %q", want)
		}
	}
	if strings.Contains(page, "<script>") {
		t.Error("expected cell text escaped, found a <script> element")
	}
}
