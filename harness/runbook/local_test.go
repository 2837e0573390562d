package runbook

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/procstart"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

// fakeServer stands in for tidal-server: `status` prints $FAKE_STATUS (for
// every address) or fails as if no node answered, `run` waits for SIGTERM
// and exits 0, or, given --crash, panics; `certs` and `tokens` are made
// real by this test binary (main_test.go), whose path replaces HELPER.
const fakeServer = `#!/bin/sh
case "$1" in
certs|tokens)
	RUNBOOK_TEST_FAKE_CERTS=1 exec HELPER "$@"
	;;
status)
	if [ -n "${FAKE_STATUS:-}" ]; then cat "$FAKE_STATUS"; exit 0; fi
	exit 1
	;;
run)
	fail_on=
	for a in "$@"; do
		if [ "$a" = --crash ]; then echo "panic: boom"; exit 2; fi
		case $a in --fail-on=*) fail_on=${a#--fail-on=} ;; esac
	done
	echo "fake node $$ up"
	trap 'echo "fake node $$ draining"; exit 0' TERM
	while :; do
		if [ -n "$fail_on" ] && [ -e "$fail_on" ]; then rm -f "$fail_on"; echo "fake node $$ fails"; exit 2; fi
		sleep 0.05
	done
	;;
esac
`

// fakeBin writes the fake tidal-server into a new directory.
func fakeBin(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "tidal-server"), []byte(strings.ReplaceAll(fakeServer, "HELPER", self)), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func newFakeCluster(t *testing.T) *LocalCluster { return newFakeClusterWith(t, false) }

func newFakeClusterWith(t *testing.T, insecure bool) *LocalCluster {
	t.Helper()
	c, err := NewLocalCluster(context.Background(), LocalConfig{Script: filepath.Join("..", "..", "runbooks", "local-cluster.sh"),
		Dir: t.TempDir(), Bin: fakeBin(t), Nodes: 3, Slots: 5, Flags: []string{"--tick-interval=50ms"}, Insecure: insecure})
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
	want := "https://" + s[1].ClientAddr + " " + s[1].PeerAddr + " " + s[1].DataDir + " " + s[1].ClientAddr + " 3 5 [" + c.CertsDir() + "]\n"
	if out != want {
		t.Fatalf("env.sh: found %q, expected %q", out, want)
	}

	out = exec1(t, c, "tidal_start 1 --id 1\n")
	if !strings.Contains(out, "--peers 1="+s[0].PeerAddr+",2="+s[1].PeerAddr+",3="+s[2].PeerAddr) || !strings.Contains(out, "--tick-interval=50ms") {
		t.Errorf("with no node answering, expected the initial cluster as --peers and the extra flags: %s", out)
	}
	nodeCerts := filepath.Join(s[0].Dir, "certs")
	if !strings.Contains(out, "--certs-dir "+nodeCerts+" --tokens "+filepath.Join(nodeCerts, "tokens")) {
		t.Errorf("a node of a secured cluster: expected --certs-dir %s and its tokens file: %s", nodeCerts, out)
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

// local-cluster.sh secures the cluster by default: a CA whose key is not
// in any certs directory, client certificates for admin, writer and reader
// and a writer token in $TIDAL_CERTS, and for each initial node a certs
// directory with a node certificate naming its member id; slots for nodes
// added later get none (the pages issue one for the new member id).
// --insecure writes plaintext URLs and no certificates at all.
func TestLocalClusterSecuredByDefault(t *testing.T) {
	c := newFakeCluster(t)
	s := c.Slots()
	if c.CertsDir() != filepath.Join(c.Dir(), "certs") {
		t.Fatalf("certs dir %q, expected %q", c.CertsDir(), filepath.Join(c.Dir(), "certs"))
	}
	for _, name := range []string{"admin", "writer", "reader"} {
		if _, err := certs.ClientTLS(c.CertsDir(), name); err != nil {
			t.Errorf("client %s: %v", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(c.CertsDir(), certs.CAKeyFile)); err == nil {
		t.Errorf("the CA key is in $TIDAL_CERTS; expected it kept apart")
	}
	for i, slot := range s {
		st, err := certs.Load(filepath.Join(slot.Dir, "certs"))
		if i >= 3 {
			if err == nil {
				t.Errorf("%s (a spare slot) has a node certificate for member %d; expected none until a page issues one", slot.Name, st.Member())
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", slot.Name, err)
		}
		if st.Member() != uint64(i+1) {
			t.Errorf("%s: node.crt names member %d, expected %d", slot.Name, st.Member(), i+1)
		}
		if _, err := os.Stat(filepath.Join(slot.Dir, "certs", "tokens")); err != nil {
			t.Errorf("%s: no tokens file: %v", slot.Name, err)
		}
	}
	out := exec1(t, c, `echo "$(wc -l <"$TIDAL_TOKENS") $(awk '{ print $1, $2 }' "$TIDAL_TOKENS") $(wc -c <"$TIDAL_CERTS/app.token") $TIDAL_CA_KEY"; tidal_secured && echo secured`+"\n")
	if want := "1 app writer 44 " + filepath.Join(c.Dir(), "ca", certs.CAKeyFile) + "\nsecured\n"; out != want {
		t.Errorf("tokens and CA key: found %q, expected %q", out, want)
	}
	if !strings.HasPrefix(c.URL(s[0]), "https://") {
		t.Errorf("URL %s: expected https://", c.URL(s[0]))
	}

	plain := newFakeClusterWith(t, true)
	out = exec1(t, plain, `echo "$TIDAL_NODE1 [$TIDAL_CERTS] [$TIDAL_CA_KEY] [$TIDAL_TOKENS]"; tidal_secured || echo insecure; tidal_start 1 --id 1`+"\n")
	ps := plain.Slots()
	if !strings.HasPrefix(out, "http://"+ps[0].ClientAddr+" [] [] []\ninsecure\n") || strings.Contains(out, "--certs-dir") {
		t.Errorf("an --insecure cluster: expected http:// URLs, no certificates and no --certs-dir: %s", out)
	}
	if plain.CertsDir() != "" || !strings.HasPrefix(plain.URL(ps[0]), "http://") {
		t.Errorf("an --insecure cluster: certs dir %q, URL %s", plain.CertsDir(), plain.URL(ps[0]))
	}
	if _, err := os.Stat(filepath.Join(ps[0].Dir, "certs")); err == nil {
		t.Errorf("an --insecure cluster has %s", filepath.Join(ps[0].Dir, "certs"))
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
	bin := fakeBin(t)
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
	started, err := procstart.Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	live, liveSlot := start("live", report.Owner{PID: os.Getpid(), StartTicks: started})
	dead, deadSlot := start("dead", report.Owner{PID: os.Getpid(), StartTicks: started - 1}) // a pid reused by another process
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

// An exit a fault was to cause (FillFollowerDisk: the fence, status 4) is
// not a crash when it has exactly that status; any other exit of the same
// process still is.
func TestExitsExpectedByAFault(t *testing.T) {
	start := time.Now().Add(-time.Minute)
	c := newFakeCluster(t)
	s := c.Slots()[0]
	for _, tc := range []struct {
		expect int
		caused bool
	}{{2, true}, {4, false}} {
		failOn := filepath.Join(s.Dir, "fail-now")
		exec1(t, c, "tidal_start 1 --id 1 --fail-on="+failOn+"\n")
		pid, ok := c.PID(s)
		if !ok {
			t.Fatal("the fake node does not run after tidal_start")
		}
		appendEvent(s, "expect-exit %d %d status=%d", pid, time.Now().UnixNano(), tc.expect)
		if err := os.WriteFile(failOn, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		var exit *NodeExit
		deadline := time.Now().Add(30 * time.Second)
		for exit == nil {
			if time.Now().After(deadline) {
				t.Fatalf("no exit of pid %d recorded", pid)
			}
			time.Sleep(20 * time.Millisecond)
			exits, err := c.Exits(start)
			if err != nil {
				t.Fatal(err)
			}
			for i := range exits {
				if exits[i].PID == pid {
					exit = &exits[i]
				}
			}
		}
		if exit.Status.Code != 2 || exit.Caused != tc.caused || exit.Requested {
			t.Errorf("exit status 2 of a process expected to exit with %d: %+v; expected caused=%v, not requested", tc.expect, exit, tc.caused)
		}
	}
}

// A faultfs mount whose server was killed (a run killed while a scenario
// served a node's data directory) fails every access with ENOTCONN until
// unmounted: Reap takes it down, and leaves live mounts alone.
func TestReapUnmountsDeadFUSEMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounts a FUSE filesystem: needs root and /dev/fuse (CI has both); skipped as a non-root user")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("mounts a FUSE filesystem: needs /dev/fuse (CI has it): %v", err)
	}
	root := t.TempDir()
	backing, mnt := filepath.Join(root, "backing"), filepath.Join(root, "run", "nodes", "n1", "data")
	if err := os.MkdirAll(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := osexec.Command(self)
	cmd.Env = append(os.Environ(), mountEnv+"="+backing+" "+mnt)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "mounted\n" {
		t.Fatalf("the mounting process said %q, %v", line, err)
	}
	if got := reapMounts(root); len(got) != 0 {
		t.Fatalf("reaped %v while the mount's server runs; expected nothing", got)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := os.Stat(mnt); !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("stat %s after its server was killed: %v; expected ENOTCONN (a dead mount)", mnt, err)
	}
	if got, err := Reap(root); err != nil || len(got) != 1 || !strings.Contains(got[0], mnt) {
		t.Fatalf("Reap: %v, %v; expected the dead mount %s", got, err, mnt)
	}
	if _, err := os.Stat(mnt); err != nil {
		t.Fatalf("stat %s after Reap: %v; expected the directory under the mount", mnt, err)
	}
}

// Regression: Close returned once a node was gone, while the wrapper that
// records its exit (local-cluster.sh) still wrote into the slot's
// directory, and the tests' clean-up failed with "directory not empty"
// (TestExitsExpectedByAFault and others, under load). After Close no
// process names a slot's data dir.
func TestCloseWaitsForTheWrapperThatRecordsTheExit(t *testing.T) {
	c := newFakeCluster(t)
	for i := 1; i <= 3; i++ {
		exec1(t, c, fmt.Sprintf("tidal_start %d --id %d\n", i, i))
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range c.Slots() {
		if pids := slotProcesses(s); len(pids) > 0 {
			t.Errorf("%s: processes %v still name its data dir after Close", s.Name, pids)
		}
	}
}
