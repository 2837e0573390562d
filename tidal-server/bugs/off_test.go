//go:build !tidalbugs

package bugs

import (
	"log/slog"
	"testing"
)

func TestNormalBuildHasNoActiveDefect(t *testing.T) {
	for d := AckBeforeCommit; d <= lastDefect; d++ {
		if Active(d) {
			t.Fatalf("defect %d: expected inactive in a build without the tidalbugs tag", d)
		}
	}
	if err := Announce(slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("Announce: expected nil in a normal build, found %v", err)
	}
}
