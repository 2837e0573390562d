package checker

import (
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// stopAndStart is a history in which the nemesis stopped n2 gracefully at
// 1s and started it again at 3s.
func stopAndStart(t *testing.T) *hist {
	h := newHist(t)
	h.write(0, "w1", "n1", history.OK, 10)
	h.at(time.Second)
	h.fault("stop", history.FaultValue{Kind: "one", Targets: []string{"n2"}})
	h.at(3 * time.Second)
	h.heal("stop")
	return h
}

func TestNodesGracefulStopWithStatusZeroIsCounted(t *testing.T) {
	h := stopAndStart(t)
	ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
		Exits: []ProcessExit{{Node: "n2", PID: 11, Time: int64(time.Second), Requested: true, Graceful: true,
			Status: ExitStatus{Code: 0, Text: "exit status 0"}}}}
	r := Nodes(h.ops, ev)
	mustValid(t, r, Valid)
	if d := nodesDetails(t, r); d.GracefulStops != 1 || d.Expected != 1 {
		t.Fatalf("graceful stops %d, expected exits %d; want 1 and 1", d.GracefulStops, d.Expected)
	}
	if !strings.Contains(r.Summary, "1 graceful stops") {
		t.Fatalf("summary does not count the graceful stop: %s", r.Summary)
	}
}

// A graceful stop is judged by its exit status: anything but 0 after the
// harness's SIGTERM is a node that did not drain clean, named with its
// status and what the status means. A kill's signal is fine; after a
// SIGTERM it is not (the drain outlived its deadline).
func TestNodesGracefulStopWithNonZeroStatusIsInvalid(t *testing.T) {
	for _, c := range []struct {
		name   string
		status ExitStatus
		want   string
	}{
		{"exit status 1", ExitStatus{Code: 1, Text: "exit status 1"}, "1 means it failed"},
		{"exit status 4", ExitStatus{Code: ExitFenced, Text: "exit status 4"}, "4 means it fenced itself"},
		{"exit status 5", ExitStatus{Code: 5, Text: "exit status 5"}, "5 means it was removed"},
		// A stop whose drain outlived its deadline ends killed; it was
		// taken for a harness kill and passed.
		{"Regression: drain killed after SIGTERM", killed, "the drain did not finish before its deadline"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := stopAndStart(t)
			ev := NodeEvidence{Nodes: []string{"n1", "n2", "n3"}, Final: serving("n1", "n2", "n3"),
				Exits: []ProcessExit{{Node: "n2", PID: 11, Time: int64(time.Second), Requested: true, Graceful: true, Status: c.status}}}
			r := Nodes(h.ops, ev)
			mustValid(t, r, Invalid)
			for _, want := range []string{"n2", c.status.Text, "after the harness's SIGTERM", c.want} {
				if !strings.Contains(r.Summary, want) {
					t.Fatalf("summary lacks %q: %s", want, r.Summary)
				}
			}
			if d := nodesDetails(t, r); d.GracefulStops != 1 || len(d.Crashed) != 1 || d.Crashed[0] != "n2" {
				t.Fatalf("graceful stops %d, crashed %v; want 1 and [n2]", d.GracefulStops, d.Crashed)
			}
		})
	}
}
