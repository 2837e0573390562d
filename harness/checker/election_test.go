package checker

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// es is a sample at t seconds.
func es(t float64, node string, pid int, id, term, leader uint64) ElectionSample {
	return ElectionSample{Time: int64(t * float64(time.Second)), Node: node, PID: pid, ID: id, Term: term, Leader: leader}
}

func electionDetails(t *testing.T, r Result) ElectionDetails {
	t.Helper()
	d, ok := r.Details.(ElectionDetails)
	if !ok {
		t.Fatalf("details are %T", r.Details)
	}
	return d
}

// A healthy run: n1 leads term 2, is stopped and restarted (term 2 ->
// 3 seen across it), n2 leads term 3.
func healthyElections() ([]ElectionSample, []ProcessExit) {
	return []ElectionSample{
		es(0.1, "n1", 101, 1, 2, 1), es(0.1, "n2", 102, 2, 2, 1), es(0.1, "n3", 103, 3, 2, 1),
		es(1.0, "n2", 102, 2, 3, 2), es(1.0, "n3", 103, 3, 3, 2),
		es(2.0, "n1", 201, 1, 3, 2), es(2.0, "n2", 102, 2, 3, 2),
	}, []ProcessExit{{Node: "n1", PID: 101, Time: int64(500 * time.Millisecond), Requested: true, Graceful: true}}
}

func TestElectionValidSaysWhatItJudged(t *testing.T) {
	ss, exits := healthyElections()
	r := Election(ss, exits)
	mustValid(t, r, Valid)
	d := electionDetails(t, r)
	if d.Terms != 2 || d.Samples != 7 || d.Restarts != 1 {
		t.Fatalf("judged: expected 2 terms, 7 samples, 1 restart, found %+v", d)
	}
	if !strings.Contains(r.Summary, "2 terms judged over 7 samples") || !strings.Contains(r.Summary, "1 restarts compared") {
		t.Fatalf("summary: %s", r.Summary)
	}
}

func TestElectionTwoLeadersInOneTermIsInvalid(t *testing.T) {
	ss := []ElectionSample{
		es(0.1, "n1", 101, 1, 7, 1), es(0.1, "n2", 102, 2, 7, 1),
		es(0.3, "n3", 103, 3, 7, 3), // n3 claims term 7 too
	}
	r := Election(ss, nil)
	mustValid(t, r, Invalid)
	for _, want := range []string{"two leaders in term 7", "n1 (id 1", "n3 (id 3"} {
		if !strings.Contains(r.Summary, want) {
			t.Fatalf("summary lacks %q: %s", want, r.Summary)
		}
	}
	if d := electionDetails(t, r); len(d.TwoLeaders) != 1 || d.TwoLeaders[0].Term != 7 || len(d.TwoLeaders[0].Claims) != 2 {
		t.Fatalf("details: %+v", d.TwoLeaders)
	}
}

func TestElectionTermBackwardsAcrossRestartIsInvalid(t *testing.T) {
	ss := []ElectionSample{
		es(0.1, "n1", 101, 1, 9, 1), es(0.1, "n2", 102, 2, 9, 1),
		es(1.0, "n2", 202, 2, 8, 0), // restarted: its durable term was 8
	}
	exits := []ProcessExit{{Node: "n2", PID: 102, Time: int64(500 * time.Millisecond), Requested: true}}
	r := Election(ss, exits)
	mustValid(t, r, Invalid)
	for _, want := range []string{"n2 (id 2) term went 9 -> 8 across a restart (pid 102 -> 202)"} {
		if !strings.Contains(r.Summary, want) {
			t.Fatalf("summary lacks %q: %s", want, r.Summary)
		}
	}
}

// Only claims count: n3, partitioned, keeps naming n1 as the leader of
// term 7 while n2 leads term 8, and a node names another node's
// leadership of a term another claims — neither is a second leader.
func TestElectionNotFooledByStaleLeaderViews(t *testing.T) {
	ss := []ElectionSample{
		es(0.1, "n1", 101, 1, 7, 1), es(0.1, "n2", 102, 2, 7, 1), es(0.1, "n3", 103, 3, 7, 1),
		es(1.0, "n2", 102, 2, 8, 2), es(1.0, "n1", 101, 1, 8, 2),
		es(1.0, "n3", 103, 3, 7, 1), // partitioned: still term 7, n1 as leader
		es(1.2, "n3", 103, 3, 7, 2), // a view that names n2 in term 7 is not n2's claim
	}
	r := Election(ss, nil)
	mustValid(t, r, Valid)
	if d := electionDetails(t, r); d.Terms != 2 {
		t.Fatalf("terms judged: expected 2 (7 by n1, 8 by n2), found %d", d.Terms)
	}
}

// A slot re-added by membership churn is a new member whose term starts
// over: not a regression of the old member.
func TestElectionNewMemberInASlotIsNotARegression(t *testing.T) {
	ss := []ElectionSample{
		es(0.1, "n1", 101, 1, 5, 1), es(0.1, "n3", 103, 3, 5, 1),
		es(2.0, "n3", 203, 4, 0, 0), es(2.5, "n3", 203, 4, 5, 1),
	}
	mustValid(t, Election(ss, nil), Valid)
}

func TestElectionUnknownWithTooFewSamples(t *testing.T) {
	r := Election(nil, nil)
	mustValid(t, r, Unknown)
	r = Election([]ElectionSample{es(0.1, "n1", 101, 1, 1, 0), es(0.2, "n2", 102, 2, 1, 0)}, nil)
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "no node claimed leadership in any of 2 samples") {
		t.Fatalf("summary: %s", r.Summary)
	}
	// A restart the samples do not bracket (n3's first process exited
	// before it was ever sampled; its next one answers): not judged.
	ss := []ElectionSample{es(0.1, "n1", 101, 1, 1, 1), es(0.1, "n2", 102, 2, 1, 1), es(2.0, "n3", 303, 3, 1, 1)}
	r = Election(ss, []ProcessExit{{Node: "n3", PID: 999, Time: int64(1 * time.Second)}})
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "could not be judged") {
		t.Fatalf("summary: %s", r.Summary)
	}
}

// Regression: removed members made the election checker UNKNOWN. A
// membership-churn run removes members for good (exit status 5) and
// re-adds their slots as new members: no exit there is a restart, and the
// run is judged on its samples.
func TestElectionRemovedMembersAreNoRestarts(t *testing.T) {
	ss := []ElectionSample{
		es(0.1, "n1", 101, 1, 5, 1), es(0.1, "n3", 103, 3, 5, 1),
		es(2.0, "n3", 203, 4, 0, 0), es(2.5, "n3", 203, 4, 5, 1),
	}
	exits := []ProcessExit{{Node: "n3", PID: 103, Time: int64(time.Second), Status: ExitStatus{Code: exitRemoved, Text: "exit status 5"}}}
	mustValid(t, Election(ss, exits), Valid)
	// The same exit by a kill, its member back under the same id: a
	// restart, judged by the samples either side.
	ss[2].ID, ss[3].ID, ss[2].Term = 3, 3, 5
	exits[0].Status = ExitStatus{Code: -1, Signal: "killed"}
	r := Election(ss, exits)
	mustValid(t, r, Valid)
	if d := r.Details.(ElectionDetails); d.Restarts != 1 {
		t.Fatalf("restarts judged: %d, expected 1", d.Restarts)
	}
}

// power-cut-after-election recorded that n2 logged "became leader at
// term 9" just before its cut; its next process reports term 8: the term
// it led in was not durable. The samples alone never saw term 9.
func TestElectionLoggedLeaderClaimThenLowerTermIsInvalid(t *testing.T) {
	h := newHist(t)
	h.at(time.Second)
	h.fault(history.FPowerCut, history.FaultValue{Kind: "after-election", Targets: []string{"n2"},
		Params: json.RawMessage(`{"trigger":"time=... msg=\"2 became leader at term 9\"","term":9,"leader":true,"pid":102}`)})
	claims := LoggedLeaderClaims(h.ops)
	if len(claims) != 1 || claims[0].Term != 9 || claims[0].PID != 102 {
		t.Fatalf("logged claims: expected n2's term 9 of pid 102, found %+v", claims)
	}
	ss := []ElectionSample{
		es(0.1, "n1", 101, 1, 8, 1), es(0.1, "n2", 102, 2, 8, 1), es(0.1, "n3", 103, 3, 8, 1),
		es(3.0, "n2", 202, 2, 8, 1),
	}
	r := Election(append(ss, claims...), nil)
	mustValid(t, r, Invalid)
	if !strings.Contains(r.Summary, "n2 (id 2) term went 9 -> 8 across a restart (pid 102 -> 202)") {
		t.Fatalf("summary: %s", r.Summary)
	}
	// Back at term 9 or later it is fine, and the claim is counted.
	ss[3].Term = 10
	r = Election(append(ss, claims...), nil)
	mustValid(t, r, Valid)
	if d := electionDetails(t, r); d.LogClaims != 1 || d.Samples != 4 {
		t.Fatalf("details: expected 1 log claim over 4 samples, found %+v", d)
	}
}

// The nodes' logs: n2 (id 2) voted for n1 in term 9 — n1's log says it
// received n2's vote — and n2's next process started at term 8 (its
// newRaft line): the vote was answered before it was durable. A start at
// term 9 is fine, and so is a vote n1 logged only after n2's restart.
func TestElectionLogsVoteAnsweredThenRestartBelowItIsInvalid(t *testing.T) {
	dir := t.TempDir()
	write := func(node string, lines ...string) string {
		p := filepath.Join(dir, node+".log")
		must(t, os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
		return p
	}
	line := func(at, msg string) string {
		return `time=2026-12-06T04:00:` + at + `Z level=INFO msg="` + msg + `" component=replica component=raft`
	}
	logs := map[string]string{
		"n1": write("n1",
			line("00.000", "newRaft 1 [peers: [], term: 0, commit: 0, applied: 0, lastindex: 0, lastterm: 0]"),
			line("05.100", "1 received MsgVoteResp from 1 at term 9"),
			line("05.102", "1 received MsgVoteResp from 2 at term 9"),
			line("05.103", "1 became leader at term 9")),
		"n2": write("n2",
			line("00.000", "newRaft 2 [peers: [], term: 0, commit: 0, applied: 0, lastindex: 0, lastterm: 0]"),
			line("05.101", "2 [logterm: 8, index: 40, vote: 1] cast MsgVote for 1 [logterm: 8, index: 40] at term 9"),
			line("09.000", "newRaft 2 [peers: [], term: 8, commit: 40, applied: 0, lastindex: 40, lastterm: 8]")),
		"n3": filepath.Join(dir, "missing.log"),
	}
	el, err := ReadElectionLogs(logs)
	must(t, err)
	if len(el.Starts) != 3 || len(el.Acted) != 2 {
		t.Fatalf("read: expected 3 starts and 2 acted terms (n1's leadership, n2's vote), found %+v", el)
	}
	ss, _ := healthyElections()
	r := ElectionWithLogs(ss, nil, &el)
	mustValid(t, r, Invalid)
	for _, want := range []string{"n2 (id 2) restarted at term 8", "acted in term 9", "its vote in it reached n1", "received MsgVoteResp from 2 at term 9"} {
		if !strings.Contains(r.Summary, want) {
			t.Fatalf("summary lacks %q: %s", want, r.Summary)
		}
	}

	logs["n2"] = write("n2",
		line("00.000", "newRaft 2 [peers: [], term: 0, commit: 0, applied: 0, lastindex: 0, lastterm: 0]"),
		line("09.000", "newRaft 2 [peers: [], term: 9, commit: 40, applied: 0, lastindex: 40, lastterm: 8]"))
	el, err = ReadElectionLogs(logs)
	must(t, err)
	r = ElectionWithLogs(ss, nil, &el)
	mustValid(t, r, Valid)
	if d := electionDetails(t, r); d.LogStarts != 3 {
		t.Fatalf("log starts judged: expected 3, found %d", d.LogStarts)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
