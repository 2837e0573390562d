package nemesis

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// electionFake is the fake cluster with node logs: a leader transfer
// writes the raft lines it would cause into the nodes' logs, after the
// given lines.
type electionFake struct {
	*fakeCluster
	dir string
	// lines are what a transfer makes each node log.
	lines map[string][]string
}

func (e *electionFake) NodeLog(n string) (string, error) { return filepath.Join(e.dir, n+".log"), nil }

func (e *electionFake) TransferLeader(ctx context.Context, from, to string) error {
	if err := e.fakeCluster.TransferLeader(ctx, from, to); err != nil {
		return err
	}
	for n, ls := range e.lines {
		f, err := os.OpenFile(filepath.Join(e.dir, n+".log"), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		for _, l := range ls {
			fmt.Fprintf(f, "time=%s level=INFO msg=%q component=raft\n", time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00"), l)
		}
		f.Close()
	}
	return nil
}

func newElectionFake(t *testing.T) *electionFake {
	e := &electionFake{fakeCluster: newFake(t, 3), dir: t.TempDir(), lines: map[string][]string{}}
	for _, n := range e.Names() {
		// Lines from before the fault must not trigger it.
		os.WriteFile(filepath.Join(e.dir, n+".log"), []byte("time=2026-01-01T00:00:00.000Z level=INFO msg=\"2 became leader at term 3\" component=raft\n"), 0o644)
	}
	return e
}

// The target n2 is not the leader: the fault hands it leadership and
// cuts its power on "became leader", recording the line; a pre-vote
// before it is no trigger.
func TestPowerCutAfterElectionCutsOnTheLeaderLine(t *testing.T) {
	ctx := context.Background()
	e := newElectionFake(t)
	e.lines["n2"] = []string{
		"2 [logterm: 6, index: 40, vote: 0] cast MsgPreVote for 3 [logterm: 6, index: 40] at term 6",
		"2 became leader at term 7",
	}
	rec, path := newRecorder(t)
	r := NewRunner(e, rec, nil)
	st := stepFor(t, "power-cut-after-election", "n2")
	if st.Disk == nil || st.Disk.PowerCut == nil {
		t.Fatalf("generated step: expected a power cut spec, found %+v", st)
	}
	must(t, r.Inject(ctx, st))
	if want := []string{"transfer n1->n2", "kill n2", "power-cut n2"}; !slices.Equal(e.callLog(), want) {
		t.Fatalf("calls: expected %v, found %v", want, e.callLog())
	}
	must(t, r.Heal(ctx, "power-cut-after-election"))
	ops := readHistory(t, rec, path)
	var p electionCutParams
	for _, op := range ops {
		if op.F == FPowerCut && op.Type == history.OK {
			fv, _ := history.Decode[history.FaultValue](op)
			must(t, json.Unmarshal(fv.Params, &p))
		}
	}
	if !strings.Contains(p.Trigger, "became leader at term 7") || p.Term != 7 || !p.Leader || p.Provoked != "transfer n1->n2" || p.LoggedAt == "" || len(p.Reports) != 1 {
		t.Fatalf("recorded: expected the leader line, the transfer, its log time and the cut's report, found %+v", p)
	}
}

// The target leads: the fault hands leadership away and cuts it on its
// vote for the new leader.
func TestPowerCutAfterElectionCutsTheLeaderOnItsVote(t *testing.T) {
	ctx := context.Background()
	e := newElectionFake(t)
	e.lines["n1"] = []string{"1 [logterm: 6, index: 40, vote: 1] cast MsgVote for 2 [logterm: 6, index: 40] at term 7"}
	rec, _ := newRecorder(t)
	r := NewRunner(e, rec, nil)
	must(t, r.Inject(ctx, stepFor(t, "power-cut-after-election", "n1")))
	if want := []string{"transfer n1->n2", "kill n1", "power-cut n1"}; !slices.Equal(e.callLog(), want) {
		t.Fatalf("calls: expected %v, found %v", want, e.callLog())
	}
}

// No vote or leadership line within the watch: nothing is cut, and the
// fault is recorded as certainly not done.
func TestPowerCutAfterElectionWithoutTriggerCutsNothing(t *testing.T) {
	defer func(d time.Duration) { electionWatchLimit = d }(electionWatchLimit)
	electionWatchLimit = 200 * time.Millisecond
	ctx := context.Background()
	e := newElectionFake(t)
	e.lines["n3"] = []string{"3 [logterm: 6, index: 40, vote: 0] cast MsgPreVote for 2 [logterm: 6, index: 40] at term 6"}
	rec, _ := newRecorder(t)
	r := NewRunner(e, rec, nil)
	err := r.Inject(ctx, stepFor(t, "power-cut-after-election", "n3"))
	if err == nil || !strings.Contains(err.Error(), "expected a vote or a leadership change") {
		t.Fatalf("expected a failure naming the missing trigger, found %v", err)
	}
	if slices.ContainsFunc(e.callLog(), func(c string) bool { return strings.HasPrefix(c, "power-cut") || strings.HasPrefix(c, "kill") }) {
		t.Fatalf("calls: expected no cut, found %v", e.callLog())
	}
	if o := r.Outcomes()["power-cut-after-election"]; o.Failed != 1 {
		t.Fatalf("outcome: expected 1 failed, found %+v", o)
	}
}
