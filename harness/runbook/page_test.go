package runbook

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const goodPage = "# Rolling restart\n" + // 1
	"\n" + // 2
	"**Availability budget:** writes unavailable ≤ 1.5s at any moment.\n" + // 3
	"\n" + // 4
	"## When to use\n" + // 5
	"Planned work.\n" + // 6
	"## Symptoms\n" + // 7
	"```sh\n" + // 8
	"tidal_status\n" + // 9
	"```\n" + // 10
	"## Steps\n" + // 11
	"### 1. Stop the node\n" + // 12
	"```bash\n" + // 13
	"tidal_stop 1\n" + // 14
	"tidal_start 1\n" + // 15
	"```\n" + // 16
	"Some text, and a block that is not shell:\n" + // 17
	"```text\n" + // 18
	"```sh\n" + // 19 (inside the text block: not a fence of its own)
	"```\n" + // 20
	"1. A list item with a fenced block:\n" + // 21
	"   ```sh\n" + // 22
	"   echo indented\n" + // 23
	"   ```\n" + // 24
	"## Verify\n" + // 25
	"```sh\n" + // 26
	"tidal_status 1\n" + // 27
	"```\n" + // 28
	"## Roll back\n" + // 29
	"```sh manual\n" + // 30
	"tidal-server transfer-leader 1\n" + // 31
	"```\n" + // 32
	"## What can be lost\n" + // 33
	"Nothing acknowledged.\n" // 34

func TestParseReadsHeadingsBlocksAndBudget(t *testing.T) {
	p, err := Parse("runbooks/rolling-restart.md", []byte(goodPage))
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "rolling-restart" || p.Title != "Rolling restart" {
		t.Errorf("name %q title %q: expected rolling-restart, Rolling restart", p.Name, p.Title)
	}
	if p.Budget != 1500*time.Millisecond || p.BudgetLine != 3 {
		t.Errorf("budget %s at line %d: expected 1.5s at line 3", p.Budget, p.BudgetLine)
	}
	want := []Block{
		{Section: "Symptoms", Heading: "Symptoms", Line: 9, Code: "tidal_status\n"},
		{Section: "Steps", Heading: "1. Stop the node", Line: 14, Code: "tidal_stop 1\ntidal_start 1\n"},
		{Section: "Steps", Heading: "1. Stop the node", Line: 23, Code: "echo indented\n"},
		{Section: "Verify", Heading: "Verify", Line: 27, Code: "tidal_status 1\n"},
		{Section: "Roll back", Heading: "Roll back", Line: 31, Code: "tidal-server transfer-leader 1\n", Manual: true},
	}
	if len(p.Blocks) != len(want) {
		t.Fatalf("found %d blocks, expected %d: %+v", len(p.Blocks), len(want), p.Blocks)
	}
	for i, b := range p.Blocks {
		if b != want[i] {
			t.Errorf("block %d: found %+v, expected %+v", i, b, want[i])
		}
	}
	if n := len(p.Executed()); n != 4 {
		t.Errorf("executed blocks: found %d, expected 4 (the Roll back block is manual)", n)
	}
	if got := p.Blocks[1].Label(); got != "Steps › 1. Stop the node (line 14)" {
		t.Errorf("label: %q", got)
	}
	for _, s := range Sections {
		if p.Sections[s] == 0 {
			t.Errorf("section %q not recorded", s)
		}
	}
}

func TestParseBudgetForms(t *testing.T) {
	for _, tc := range []struct {
		line string
		want time.Duration
	}{
		{"Availability budget: writes unavailable ≤ 3s at any moment", 3 * time.Second},
		{"Availability budget: writes unavailable <= 500ms at any moment.", 500 * time.Millisecond},
		{"- **Availability budget**: writes unavailable ≤ 2m at any moment", 2 * time.Minute},
		{"availability budget: Writes unavailable ≤ 1s at any moment", time.Second},
	} {
		src := strings.Replace(goodPage, "**Availability budget:** writes unavailable ≤ 1.5s at any moment.", tc.line, 1)
		p, err := Parse("p.md", []byte(src))
		if err != nil {
			t.Errorf("%q: %v", tc.line, err)
			continue
		}
		if p.Budget != tc.want {
			t.Errorf("%q: budget %s, expected %s", tc.line, p.Budget, tc.want)
		}
	}
}

// Every problem of a bad page is reported with the page and its line.
func TestParseNamesBadPagesWithLineNumbers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		edit    func(string) string
		wantErr []string
	}{
		{"no budget", func(s string) string {
			return strings.Replace(s, "**Availability budget:** writes unavailable ≤ 1.5s at any moment.\n", "", 1)
		}, []string{"p.md: no availability budget"}},
		{"malformed budget", func(s string) string {
			return strings.Replace(s, "writes unavailable ≤ 1.5s at any moment.", "writes down for a bit", 1)
		}, []string{`p.md:3: availability budget: expected "writes unavailable ≤ <duration> at any moment", found "writes down for a bit"`}},
		{"budget not a duration", func(s string) string { return strings.Replace(s, "≤ 1.5s", "≤ soon", 1) },
			[]string{`p.md:3: availability budget: expected a positive duration like 3s or 500ms, found "soon"`}},
		{"second budget", func(s string) string {
			return strings.Replace(s, "Planned work.\n", "Planned work.\nAvailability budget: writes unavailable ≤ 9s at any moment\n", 1)
		}, []string{"p.md:7: a second availability budget (the first is at line 3)"}},
		{"missing section", func(s string) string { return strings.Replace(s, "## What can be lost\n", "## Notes\n", 1) },
			[]string{`p.md:33: unknown section "Notes"`, `p.md: no "What can be lost" section`}},
		{"duplicate section", func(s string) string { return strings.Replace(s, "## Verify\n", "## Steps\n", 1) },
			[]string{`p.md:25: section "Steps" again (first at line 11)`, `p.md: no "Verify" section`}},
		{"unterminated fence", func(s string) string {
			return strings.TrimSuffix(s, "Nothing acknowledged.\n") + "```sh\necho never closed\n"
		},
			[]string{"p.md:34: fenced block opened here is never closed"}},
		{"runnable block under Roll back", func(s string) string { return strings.Replace(s, "```sh manual\n", "```sh\n", 1) },
			[]string{"p.md:30: ```sh block under \"Roll back\" would be executed by the suite"}},
		{"block before any section", func(s string) string {
			return strings.Replace(s, "\n## When to use\n", "```sh\necho too early\n```\n## When to use\n", 1)
		}, []string{"p.md:4: ```sh block outside any section"}},
		{"unknown word after the language", func(s string) string { return strings.Replace(s, "```bash\n", "```bash skip\n", 1) },
			[]string{`p.md:13: ` + "```bash block: unknown word \"skip\""}},
		{"empty block", func(s string) string { return strings.Replace(s, "tidal_status 1\n", "", 1) },
			[]string{"p.md:26: empty ```sh block"}},
		{"no title", func(s string) string { return strings.Replace(s, "# Rolling restart\n", "", 1) },
			[]string{"p.md: no title"}},
		{"second title", func(s string) string { return strings.Replace(s, "Planned work.\n", "# Other\n", 1) },
			[]string{`p.md:6: a second title "Other"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.md", []byte(tc.edit(goodPage)))
			if err == nil {
				t.Fatalf("expected an error naming %q, found none", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("expected the error to contain %q, found:\n%v", w, err)
				}
			}
		})
	}
}

func TestParseNeedsABlockToExecute(t *testing.T) {
	src := goodPage
	for _, b := range []string{"```sh\ntidal_status\n```\n", "```bash\ntidal_stop 1\ntidal_start 1\n```\n", "   ```sh\n   echo indented\n   ```\n", "```sh\ntidal_status 1\n```\n"} {
		src = strings.Replace(src, b, "", 1)
	}
	_, err := Parse("p.md", []byte(src))
	if err == nil || !strings.Contains(err.Error(), "no ```sh block to execute") {
		t.Fatalf("expected an error for a page with nothing to execute, found %v", err)
	}
}

// The pages under runbooks/ parse: a malformed page fails the unit tests,
// before any suite runs it.
func TestRepositoryPagesParse(t *testing.T) {
	pages, err := ParseDir(filepath.Join("..", "..", "runbooks"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) < 7 {
		t.Fatalf("found %d pages under runbooks/, expected at least 7", len(pages))
	}
	for _, p := range pages {
		if p.Budget <= 0 || len(p.Executed()) == 0 {
			t.Errorf("%s: budget %s, %d executed blocks", p.Path, p.Budget, len(p.Executed()))
		}
	}
}
