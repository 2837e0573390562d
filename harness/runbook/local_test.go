package runbook

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gproc "github.com/shirou/gopsutil/v4/process"
	"github.com/tidaldb/tidal/harness/report"
)

// fakeServer stands in for tidal-server: `status` prints $FAKE_STATUS (for
// every address) or fails as if no node answered, and `run` waits for
// SIGTERM and exits 0, or, given --crash, panics.
const fakeServer = `#!/bin/sh
case "$1" in
status)
	if [ -n "${FAKE_STATUS:-}" ]; then cat "$FAKE_STATUS"; exit 0; fi
	exit 1
	;;
run)
	for a in "$@"; do
		if [ "$a" = --crash ]; then echo "panic: boom"; exit 2; fi
	done
	echo "fake node $$ up"
	trap 'echo "fake node $$ draining"; exit 0' TERM
	while :; do sleep 0.05; done
	;;
esac
`

func newFakeCluster(t *testing.T) *LocalCluster {
	t.Helper()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "tidal-server"), []byte(fakeServer), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := NewLocalCluster(context.Background(), LocalConfig{Script: filepath.Join("..", "..", "runbooks", "local-cluster.sh"),
		Dir: t.TempDir(), Bin: bin, Nodes: 3, Slots: 5, Flags: []string{"--tick-interval=50ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func exec1(t *testing.T, c *LocalCluster, code string) string {
	t.Helper()
	r := c.Exec(context.Background(), code, time.Minute)
	if r.Err != nil {
		t.Fatalf("%s: %v\n%s", code, r.Err, r.Output)
	}
	return r.Output
}

// env.sh names every slot's addresses and directories, and its start and
// stop functions leave the pid file and events the harness reads.
func TestLocalClusterEnvAndNodeLifecycle(t *testing.T) {
	start := time.Now().Add(-time.Hour)
	c := newFakeCluster(t)
	s := c.Slots()
	if len(s) != 5 || s[0].Name != "n1" || s[4].DataDir != filepath.Join(c.Dir(), "n5", "data") {
		t.Fatalf("slots: %+v", s)
	}
	out := exec1(t, c, `echo "$TIDAL_NODE2 $TIDAL_PEER2 $TIDAL_DATA2 $(tidal_addr 2) $TIDAL_NODES $TIDAL_SLOTS [$TIDAL_CERTS]"`+"\n")
	want := "http://" + s[1].ClientAddr + " " + s[1].PeerAddr + " " + s[1].DataDir + " " + s[1].ClientAddr + " 3 5 []\n"
	if out != want {
		t.Fatalf("env.sh: found %q, expected %q", out, want)
	}

	out = exec1(t, c, "tidal_start 1 --id 1\n")
	if !strings.Contains(out, "--peers 1="+s[0].PeerAddr+",2="+s[1].PeerAddr+",3="+s[2].PeerAddr) || !strings.Contains(out, "--tick-interval=50ms") {
		t.Errorf("with no node answering, expected the initial cluster as --peers and the extra flags: %s", out)
	}
	if !c.Alive(s[0]) {
		t.Fatal("node 1 does not run after tidal_start")
	}
	if r := c.Exec(context.Background(), "tidal_start 1 --id 1\n", time.Minute); r.Err == nil || !strings.Contains(r.Output, "already runs") {
		t.Errorf("a second start of a running node: err %v, output %q; expected a refusal", r.Err, r.Output)
	}
	if r := c.Exec(context.Background(), "tidal_start 2\n", time.Minute); r.Err == nil || !strings.Contains(r.Output, "give it: tidal_start 2 --id ID") {
		t.Errorf("a start without --id when no node answers: err %v, output %q; expected it to ask for the id", r.Err, r.Output)
	}
	if err := c.Stop(context.Background(), s[0]); err != nil {
		t.Fatal(err)
	}
	if c.Alive(s[0]) {
		t.Fatal("node 1 still runs after tidal_stop")
	}
	exec1(t, c, "tidal_start 1 --id 1\n")
	if err := c.Kill(context.Background(), s[0]); err != nil {
		t.Fatal(err)
	}
	exec1(t, c, "tidal_start 1 --id 1 --crash\n")
	var exits []NodeExit
	deadline := time.Now().Add(30 * time.Second)
	for len(exits) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("expected 3 recorded exits, found %+v", exits)
		}
		time.Sleep(20 * time.Millisecond)
		var err error
		if exits, err = c.Exits(start); err != nil {
			t.Fatal(err)
		}
	}
	stopped, killed, crashed := exits[0], exits[1], exits[2]
	if !stopped.Requested || stopped.Status.Code != 0 || stopped.ID != 1 {
		t.Errorf("the stopped node's exit: %+v; expected requested, status 0, id 1", stopped)
	}
	if !killed.Requested || killed.Status.Signal != "killed" {
		t.Errorf("the killed node's exit: %+v; expected requested, signal killed", killed)
	}
	if crashed.Requested || crashed.Status.Code != 2 || !logsPanic(crashed.Logs) {
		t.Errorf("the crashed node's exit: %+v; expected not requested, status 2, the panic in its logs", crashed)
	}
	if l := strings.Join(stopped.Logs[0].Lines, "\n"); !strings.Contains(l, "draining") || strings.Contains(l, "panic") {
		t.Errorf("the stopped node's log tail should be its own process's output:\n%s", l)
	}
	if time.Duration(stopped.Time) < time.Hour {
		t.Errorf("exit time %d: expected it on the clock of start (an hour ago)", stopped.Time)
	}
}

func TestBashStatus(t *testing.T) {
	for code, want := range map[int]string{0: "exit status 0", 3: "exit status 3", 137: "signal: killed", 143: "signal: terminated", -1: "unknown (no exit status recorded)"} {
		if got := bashStatus(code).Text; got != want {
			t.Errorf("bashStatus(%d): %q, expected %q", code, got, want)
		}
	}
}

// Reap kills the nodes of a run whose owner is gone, and leaves a live
// owner's nodes alone.
func TestReapKillsOnlyTheNodesOfDeadRuns(t *testing.T) {
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "tidal-server"), []byte(fakeServer), 0o755); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	start := func(run string, owner report.Owner) (*LocalCluster, Slot) {
		dir := filepath.Join(root, "runbook-x", run)
		c, err := NewLocalCluster(context.Background(), LocalConfig{Script: filepath.Join("..", "..", "runbooks", "local-cluster.sh"),
			Dir: filepath.Join(dir, "nodes"), Bin: bin, Nodes: 1, Slots: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		b, _ := json.Marshal(owner)
		if err := os.WriteFile(filepath.Join(dir, report.OwnerFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		exec1(t, c, "tidal_start 1 --id 1\n")
		return c, c.Slots()[0]
	}
	me, err := gproc.NewProcess(int32(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	started, _ := me.CreateTime()
	live, liveSlot := start("live", report.Owner{PID: os.Getpid(), Started: started})
	dead, deadSlot := start("dead", report.Owner{PID: os.Getpid(), Started: started - 1}) // a pid reused by another process
	killed, err := Reap(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(killed) != 1 || !strings.Contains(killed[0], filepath.Join("dead", "nodes", "n1")) {
		t.Fatalf("reaped %v: expected only the dead run's node", killed)
	}
	deadline := time.Now().Add(10 * time.Second)
	for dead.Alive(deadSlot) {
		if time.Now().After(deadline) {
			t.Fatal("the dead run's node still runs after Reap")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !live.Alive(liveSlot) {
		t.Fatal("Reap killed the node of a run whose owner still runs")
	}
}

// tidal_members reads the status table of the CLI as it is (CLIENT empty
// for members whose client address is unknown) and as it is becoming (a
// note line, "-" for what is unknown), keeps the leader's progress and
// blanks a follower's, and never takes the header for a member.
func TestMembersReadsTheStatusTable(t *testing.T) {
	c := newFakeCluster(t)
	s := c.Slots()
	leaderTable := "node 1   leader 1   term 2   commit 57   applied 57\n\n" +
		"ID  ROLE      PEER  CLIENT  MATCH  LAG  REACHABLE\n" +
		"1   leader    " + s[0].PeerAddr + "  " + s[0].ClientAddr + "  57  0  true\n" +
		"2   follower  " + s[1].PeerAddr + "  55  2  true\n" +
		"7   learner   " + s[2].PeerAddr + "  3  54  false\n"
	followerTable := "node 2   leader 1   term 2   commit 57   applied 57\n" +
		"match, lag and reachability as leader 1 at " + s[0].ClientAddr + " reports them\n\n" +
		"ID  ROLE      PEER  CLIENT  MATCH  LAG  REACHABLE\n" +
		"1   leader    " + s[0].PeerAddr + "  " + s[0].ClientAddr + "  57  0  true\n" +
		"2   follower  " + s[1].PeerAddr + "  -  -  -  -\n"
	for _, tc := range []struct {
		name, table, code, want string
	}{
		{"the leader's table", leaderTable, "tidal_members",
			"1 leader " + s[0].PeerAddr + " 57 0 true\n2 follower " + s[1].PeerAddr + " 55 2 true\n7 learner " + s[2].PeerAddr + " 3 54 false\n"},
		{"a follower's table", followerTable, "tidal_members 2",
			"1 leader " + s[0].PeerAddr + " - - -\n2 follower " + s[1].PeerAddr + " - - -\n"},
		{"lookups", leaderTable, "echo $(tidal_leader) $(tidal_id_of 3) $(tidal_slot_of 2)", "1 7 2\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "status")
			if err := os.WriteFile(f, []byte(tc.table), 0o644); err != nil {
				t.Fatal(err)
			}
			out := exec1(t, c, "export FAKE_STATUS="+f+"\n"+tc.code+"\n")
			if out != tc.want {
				t.Errorf("%s: found\n%s\nexpected\n%s", tc.code, out, tc.want)
			}
		})
	}
}

// Regression: tidal_cluster_up started each node with the membership the
// first node reported, which a node that has just bootstrapped applies one
// member at a time: node 2 was once given only members 1 and 2, bootstrapped
// a different cluster, never heard from member 3, and the cluster lost its
// quorum as soon as node 1 went down.
func TestClusterUpGivesEveryNodeTheWholeInitialCluster(t *testing.T) {
	c := newFakeCluster(t)
	s := c.Slots()
	partial := filepath.Join(t.TempDir(), "status")
	table := "node 1   leader 1   term 2   commit 2   applied 2\n\n" +
		"ID  ROLE      PEER  CLIENT  MATCH  LAG  REACHABLE\n" +
		"1   leader    " + s[0].PeerAddr + "  " + s[0].ClientAddr + "  2  0  true\n" +
		"2   follower  " + s[1].PeerAddr + "  0  2  false\n"
	if err := os.WriteFile(partial, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	// The fake nodes never answer /readyz: cluster_up fails after a second,
	// having started all three.
	r := c.Exec(context.Background(), "export FAKE_STATUS="+partial+" TIDAL_UP_TIMEOUT=1\ntidal_cluster_up\n", time.Minute)
	if r.Err == nil {
		t.Fatalf("expected tidal_cluster_up to fail on the fake nodes' readiness: %s", r.Output)
	}
	want := "--peers 1=" + s[0].PeerAddr + ",2=" + s[1].PeerAddr + ",3=" + s[2].PeerAddr + " "
	for _, slot := range s[:3] {
		b, err := os.ReadFile(filepath.Join(slot.Dir, "cmdline"))
		if err != nil {
			t.Fatalf("%s was not started: %v\n%s", slot.Name, err, r.Output)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s started with %s\nexpected %q in it", slot.Name, b, want)
		}
	}
}
