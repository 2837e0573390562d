package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// sectionsDir holds the sections other tools add to a run's report.html,
// one <name>.json each, so that re-rendering the report (analyze) keeps
// them.
const sectionsDir = "sections"

// Section is a table a tool adds to a run's report.html, shown after the
// timeline: e.g. the shrink's comparison of the original and the minimal
// fault schedule of the run it replays. Cells are text (escaped).
type Section struct {
	Title   string     `json:"title"`
	Text    string     `json:"text,omitempty"`
	Columns []string   `json:"columns"`
	Rows    [][]string `json:"rows"`
}

// WriteSection stores s as the run's section name (a plain file name,
// e.g. "shrink"), replacing an earlier one of that name. The next
// WriteReport shows it.
func (r *Run) WriteSection(name string, s Section) error {
	if err := checkTestName(name); err != nil {
		return fmt.Errorf("report: section %q: expected a plain file name", name)
	}
	if err := os.MkdirAll(r.Path(sectionsDir), 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return r.writeJSON(filepath.Join(sectionsDir, name+".json"), s)
}

// ReadSections reads every section the run holds, by name. None is no
// sections, not an error.
func (r *Run) ReadSections() ([]Section, error) {
	paths, err := filepath.Glob(filepath.Join(r.dir, sectionsDir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	sort.Strings(paths)
	var out []Section
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return out, fmt.Errorf("report: %w", err)
		}
		var s Section
		if err := json.Unmarshal(b, &s); err != nil {
			return out, fmt.Errorf("report: %s: expected a report section as JSON: %w", p, err)
		}
		out = append(out, s)
	}
	return out, nil
}
