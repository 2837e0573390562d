package process

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// holdEnv makes the test binary a run that holds a registry: it takes the
// directory named by the variable, says "held", and keeps it until its
// stdin closes or it is killed.
const holdEnv = "PROCESS_TEST_HOLD_REGISTRY"

func TestMain(m *testing.M) {
	if dir := os.Getenv(holdEnv); dir != "" {
		r, err := NewRegistry(dir)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("held")
		_, _ = io.Copy(io.Discard, os.Stdin)
		r.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startSleeper runs sleep(1) for a minute, killed by pid in cleanup.
func startSleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	return cmd
}

func mustStart(t *testing.T, pid int) int64 {
	t.Helper()
	st, err := startTime(pid)
	if err != nil {
		t.Fatalf("start time of pid %d: %v", pid, err)
	}
	return st
}

// register writes the pid file a run with the given owner would have
// written for pid.
func register(t *testing.T, dir string, pid int, name string, run owner, token string) {
	t.Helper()
	content := fmt.Sprintf("%d\n/bin/sleep\n%s\n%d %d %s\n", mustStart(t, pid), name, run.PID, run.Start, token)
	if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(pid)+".pid"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func running(pid int) bool {
	// A killed child stays a zombie until reaped: ask for its state.
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil
	}
	f := strings.Fields(string(data))
	return len(f) > 2 && f[2] != "Z"
}

// Regression: every run start reaped every pid in
// <store>/pids, so two runs sharing a store killed each other's nodes.
// Reap now kills only what this run started and what a provably dead run
// started; a live run's processes, and entries that do not say whose they
// are, are left alone.
func TestReapKillsOnlyOwnAndDeadRunsProcesses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pids")
	r, err := NewRegistry(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1) here")
	}
	own, err := Start(Spec{Name: "own", Binary: sleep, Args: []string{"60"}, LogPath: filepath.Join(dir, "..", "own.log")}, r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { own.Kill() })

	// Another run, alive: its node must survive our Reap.
	otherRun := startSleeper(t)
	otherNode := startSleeper(t)
	register(t, dir, otherNode.Process.Pid, "n1", owner{PID: otherRun.Process.Pid, Start: mustStart(t, otherRun.Process.Pid)}, "other")

	// A run that died and left its node behind: reaped.
	deadRun := startSleeper(t)
	deadOwner := owner{PID: deadRun.Process.Pid, Start: mustStart(t, deadRun.Process.Pid)}
	syscall.Kill(deadRun.Process.Pid, syscall.SIGKILL)
	for deadOwner.alive() {
		time.Sleep(10 * time.Millisecond)
	}
	orphan := startSleeper(t)
	register(t, dir, orphan.Process.Pid, "n2", deadOwner, "dead")

	// An entry in the old format, without its run: not provably abandoned.
	unknown := startSleeper(t)
	old := fmt.Sprintf("%d\n/bin/sleep\nn3\n", mustStart(t, unknown.Process.Pid))
	if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(unknown.Process.Pid)+".pid"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}

	killed, err := r.Reap()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(killed, ", ")
	for _, want := range []string{fmt.Sprintf("own (pid %d)", own.PID()), fmt.Sprintf("n2 (pid %d)", orphan.Process.Pid)} {
		if !strings.Contains(got, want) {
			t.Errorf("expected Reap to kill %s, it killed [%s]", want, got)
		}
	}
	if len(killed) != 2 {
		t.Errorf("expected exactly this run's and the dead run's process killed, found [%s]", got)
	}
	if !running(otherNode.Process.Pid) {
		t.Errorf("a live run's node (pid %d) was killed by another run's Reap", otherNode.Process.Pid)
	}
	if !running(unknown.Process.Pid) {
		t.Errorf("a process of unknown run (pid %d) was killed", unknown.Process.Pid)
	}
	select {
	case <-own.Exited():
	case <-time.After(20 * time.Second):
		t.Error("this run's own process still running 20s after Reap")
	}
}

// startHolder runs the test binary as another run holding dir.
func startHolder(t *testing.T, dir string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), holdEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		stdin.Close()
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		<-done
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	go func() { cmd.Wait(); close(done) }()
	if err != nil || strings.TrimSpace(line) != "held" {
		t.Fatalf("holder: expected \"held\", found %q, %v", line, err)
	}
	return cmd
}

// Regression: a run must refuse a store another live run
// holds, naming the holder, and take over one whose holder died.
func TestRegistryRefusesAStoreALiveRunHolds(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pids")
	holder := startHolder(t, dir)

	_, err := NewRegistry(dir)
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("expected a *HeldError while pid %d holds %s, found %v", holder.Process.Pid, dir, err)
	}
	if held.PID != holder.Process.Pid || held.Started.IsZero() || !strings.Contains(err.Error(), "pid "+strconv.Itoa(holder.Process.Pid)) {
		t.Errorf("expected the refusal to name holder pid %d and its start time, found %v", holder.Process.Pid, err)
	}

	// The holder dies without cleaning up: its lock is stale, and taken over.
	syscall.Kill(holder.Process.Pid, syscall.SIGKILL)
	deadline := time.Now().Add(20 * time.Second)
	var r *Registry
	for {
		if r, err = NewRegistry(dir); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("expected the store of dead pid %d to be taken over, found %v", holder.Process.Pid, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And now this process holds it: a second run in it is refused too.
	if _, err := NewRegistry(dir); !errors.As(err, &held) || held.PID != os.Getpid() {
		t.Errorf("expected a second registry in this process to be refused naming pid %d, found %v", os.Getpid(), err)
	}
	r.Close()
	r2, err := NewRegistry(dir)
	if err != nil {
		t.Fatalf("expected the store free after Close, found %v", err)
	}
	r2.Close()
}
