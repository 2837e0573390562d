package runner

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/process"
)

// startWatched starts a real process (sh -c script) through the process
// backend behind an exitWatch, as the runner starts nodes, and stops it
// by pid in cleanup.
func startWatched(t *testing.T, w *exitWatch, name, script string) (cluster.Handle, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h, err := w.Launch(cluster.NodeSpec{Name: name, Binary: shell(t), Dir: dir, Args: []string{"-c", script}, LogPath: filepath.Join(dir, "stdout.log")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Kill() })
	return h, filepath.Join(dir, "stdout.log")
}

func shell(t *testing.T) string {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on this machine")
	}
	return sh
}

func newWatch(t *testing.T) *exitWatch {
	t.Helper()
	sh := shell(t)
	b, err := process.NewBackend(sh, nil)
	if err != nil {
		t.Fatal(err)
	}
	return newExitWatch(b)
}

// waitExits waits, with a generous deadline, until w has recorded n exits.
func waitExits(t *testing.T, w *exitWatch, n int) []checker.ProcessExit {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		exits := w.recorded(time.Now(), "/")
		if len(exits) >= n {
			return exits
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected %d recorded exits within 30s, found %+v", n, exits)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitExited(t *testing.T, h cluster.Handle) {
	t.Helper()
	select {
	case <-h.Exited():
	case <-time.After(30 * time.Second):
		t.Fatalf("process %d did not exit within 30s", h.PID())
	}
}

func waitLogged(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: expected %q within 30s, found %q", path, want, b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Regression, the planted defect: a real process killed
// behind the harness's back — not through its handle, as the nemesis
// kills — is recorded as an exit nobody asked for, and the nodes checker
// says false; the same kill through the handle is no crash.
func TestExitWatchSeesAKillBehindTheHarnesssBack(t *testing.T) {
	w := newWatch(t)
	ours, oursLog := startWatched(t, w, "n1", `echo up; exec sleep 600`)
	theirs, theirsLog := startWatched(t, w, "n2", `echo up; exec sleep 600`)
	waitLogged(t, oursLog, "up")
	waitLogged(t, theirsLog, "up")
	if err := ours.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(theirs.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitExited(t, theirs)
	exits := waitExits(t, w, 2)
	byNode := map[string]checker.ProcessExit{}
	for _, e := range exits {
		byNode[e.Node] = e
	}
	if e := byNode["n1"]; !e.Requested || e.Status.Signal != "killed" {
		t.Fatalf("n1, killed through its handle: expected a requested SIGKILL exit, found %+v", e)
	}
	if e := byNode["n2"]; e.Requested || e.Status.Signal != "killed" || e.PID != theirs.PID() {
		t.Fatalf("n2, killed behind the harness's back: expected an unrequested SIGKILL exit of pid %d, found %+v", theirs.PID(), e)
	}
	if w.alive("n1") || w.alive("n2") {
		t.Fatal("alive after exit")
	}

	ev := checker.NodeEvidence{Nodes: []string{"n1", "n2"}, Exits: exits,
		Final: []checker.NodeFinal{{Node: "n1", State: "running", Alive: true, Serving: true}, {Node: "n2", State: "running", Alive: true, Serving: true}}}
	r := checker.Nodes(nil, ev)
	if r.Valid != checker.Invalid || !strings.Contains(r.Summary, "n2 exited on its own (signal: killed)") || strings.Contains(r.Summary, "n1 ") {
		t.Fatalf("nodes checker: expected false naming n2 only, found %s: %s", r.Valid, r.Summary)
	}
}

// A node that panics leaves its exit code and the panic in the record.
func TestExitWatchRecordsStatusAndLogTail(t *testing.T) {
	w := newWatch(t)
	h, _ := startWatched(t, w, "n3", `i=0; while [ $i -lt 100 ]; do echo "applied $i"; i=$((i+1)); done; echo "panic: apply: index 7 out of order" >&2; exit 2`)
	waitExited(t, h)
	e := waitExits(t, w, 1)[0]
	if e.Requested || e.Status.Code != 2 || e.Status.Text != "exit status 2" {
		t.Fatalf("expected an unrequested exit with code 2, found %+v", e)
	}
	if len(e.Logs) != 1 || len(e.Logs[0].Lines) != logTailLines {
		t.Fatalf("expected the last %d lines of stdout.log, found %+v", logTailLines, e.Logs)
	}
	joined := strings.Join(e.Logs[0].Lines, "\n")
	if !strings.Contains(joined, "panic: apply: index 7 out of order") || strings.Contains(joined, "applied 5\n") {
		t.Fatalf("log tail: expected the end of the log with the panic, found:\n%s", joined)
	}
	r := checker.Nodes(nil, checker.NodeEvidence{Nodes: []string{"n3"}, Exits: []checker.ProcessExit{e},
		Final: []checker.NodeFinal{{Node: "n3", State: "running", Error: "its process is not running"}}})
	if r.Valid != checker.Invalid || !strings.Contains(r.Summary, "panicked (exit status 2)") {
		t.Fatalf("nodes checker: expected false with the panic, found %s: %s", r.Valid, r.Summary)
	}
}

// Regression (merge of the port-retry start-up with the nodes checker):
// cluster.New starts the whole cluster again on fresh ports when a node
// lost its port, and that node's process exits on its own before the run
// begins. Such an exit of an abandoned start attempt is not a crash of the
// run; an exit of the attempt that came up still is.
func TestExitOfAnAbandonedStartAttemptIsNotACrash(t *testing.T) {
	w := newWatch(t)
	lost, _ := startWatched(t, w, "n1", "echo 'listen tcp 127.0.0.1:1: bind: address already in use'; exit 1")
	<-lost.Exited()
	up, _ := startWatched(t, w, "n1", "exec sleep 600")
	w.arm()
	if got := w.recorded(time.Now(), "/"); len(got) != 0 {
		t.Fatalf("after arm, the abandoned attempt's exit is still judged: %+v", got)
	}
	if err := syscall.Kill(up.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	exits := waitExits(t, w, 1)
	if len(exits) != 1 || exits[0].Requested || exits[0].PID != up.PID() {
		t.Fatalf("the running node's unrequested exit after arm: got %+v, want one unrequested exit of pid %d", exits, up.PID())
	}
}

// The exit watch wraps every handle; the cluster's start-up check must
// still reach the process backend's own answer to "do you hold this port"
// through it (else a port another process took would look bound).
func TestWatchedHandleAnswersListeningFromItsProcess(t *testing.T) {
	w := newWatch(t)
	h, _ := startWatched(t, w, "n1", "exec sleep 600")
	lo, ok := h.(cluster.ListenerOwner)
	if !ok {
		t.Fatal("a watched handle does not implement cluster.ListenerOwner")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	up, err := lo.Listening(l.Addr().String())
	if err != nil || up {
		t.Fatalf("sleep does not listen on %s, which this test holds: got %v, %v", l.Addr(), up, err)
	}
}
