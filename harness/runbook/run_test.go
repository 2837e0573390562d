package runbook

import (
	"errors"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/harness/checker"
)

// The steps result is false when a block failed, naming it, and lists the
// manual blocks it did not execute either way.
func TestStepsResult(t *testing.T) {
	p, err := Parse("p.md", []byte(goodPage))
	if err != nil {
		t.Fatal(err)
	}
	ok := &Outcome{Manual: p.Manual()}
	for _, b := range p.Executed() {
		ok.Steps = append(ok.Steps, StepResult{Block: b})
	}
	r := stepsResult(p, ok)
	if r.Valid != checker.Valid || !strings.Contains(r.Summary, "all 4 blocks exited 0") || !strings.Contains(r.Summary, "1 manual blocks not executed: Roll back (line 31)") {
		t.Errorf("every block passed: %s %s", r.Valid, r.Summary)
	}

	failed := &Outcome{Manual: p.Manual(), Steps: []StepResult{{Block: p.Executed()[0]}, {Block: p.Executed()[1], Err: errors.New("exit status 1")}}}
	failed.Failed = &failed.Steps[1]
	r = stepsResult(p, failed)
	if r.Valid != checker.Invalid || !strings.Contains(r.Summary, "block Steps › 1. Stop the node (line 14) failed") || !strings.Contains(r.Summary, "2 of 4 blocks executed") {
		t.Errorf("the second block failed: %s %s", r.Valid, r.Summary)
	}
}
