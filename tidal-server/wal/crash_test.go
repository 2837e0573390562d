package wal

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

const crashDirEnv = "TIDAL_WAL_CRASH_DIR"

// TestCrashWriter is the child side of TestKill9KeepsEveryAcknowledgedSave:
// it appends from several goroutines forever, printing "ack <index>" after
// each Save returns, until it is killed.
func TestCrashWriter(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("child process of TestKill9KeepsEveryAcknowledgedSave")
	}
	opts := Options{SegmentSize: 32 << 10, Logger: quiet} // small: rollovers happen under the kill
	w, rec, err := Open(dir, opts)
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	next := uint64(1)
	if n := len(rec.Entries); n > 0 {
		next = rec.Entries[n-1].Index + 1
	}
	out := bufio.NewWriter(os.Stdout)
	var mu, outMu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				mu.Lock()
				idx := next
				p, err := w.Stage(Batch{Entries: []Entry{{Index: idx, Term: 1, Data: payload(idx, 1)}},
					HardState: &HardState{Term: 1, Commit: idx}}, true)
				next++
				mu.Unlock()
				if err == nil {
					err = p.Wait(context.Background())
				}
				outMu.Lock()
				if err != nil {
					fmt.Fprintf(out, "error %v\n", err)
				} else {
					fmt.Fprintf(out, "ack %d\n", idx)
				}
				out.Flush()
				outMu.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestKill9KeepsEveryAcknowledgedSave runs a writer process, kills it with
// SIGKILL mid-stream, and checks that every Save it acknowledged is
// recovered, byte for byte, in a contiguous log; three times over the same
// directory so each round also recovers from the last crash.
func TestKill9KeepsEveryAcknowledgedSave(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	maxAcked := uint64(0)
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashWriter$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		acks := 0
		killAt := 300 + round*250
		for sc.Scan() {
			line := sc.Text()
			idx, ok := strings.CutPrefix(line, "ack ")
			if !ok {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: child said %q (stderr: %s)", round, line, stderr.String())
			}
			n, err := strconv.ParseUint(idx, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			maxAcked = max(maxAcked, n)
			if acks++; acks == killAt {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
		}
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: expected the child killed by SIGKILL, got %v (stderr: %s)", round, err, stderr.String())
		}

		w, rec, err := Open(dir, Options{SegmentSize: 32 << 10, Logger: quiet})
		if err != nil {
			t.Fatalf("round %d: Open after kill -9: %v", round, err)
		}
		mustClose(t, w)
		n := uint64(len(rec.Entries))
		if n < maxAcked {
			t.Fatalf("round %d: acknowledged up to index %d, recovered only %d entries", round, maxAcked, n)
		}
		for i, e := range rec.Entries {
			if e.Index != uint64(i+1) || !bytes.Equal(e.Data, payload(e.Index, 1)) {
				t.Fatalf("round %d: entry %d: expected index %d with its payload, recovered index %d data %q", round, i, i+1, e.Index, e.Data)
			}
		}
		// The hard state is the newest written, so it commits at least
		// the newest acknowledged index.
		if rec.HardState.Commit < maxAcked {
			t.Fatalf("round %d: hard state commit %d is older than the acknowledged index %d", round, rec.HardState.Commit, maxAcked)
		}
		t.Logf("round %d: %d acknowledged, %d recovered, torn tail %+v", round, maxAcked, n, rec.TornTail)
	}
}

const crashGroupsEnv = "TIDAL_WAL_CRASH_GROUPS_DIR"

// TestCrashWriterGroups is the child side of
// TestKill9KeepsEveryAcknowledgedSaveOfEveryGroup: eight groups (0 to 7)
// append to one log, each from its own goroutine, printing "ack <group>
// <index>" after each Save returns, until it is killed.
func TestCrashWriterGroups(t *testing.T) {
	dir := os.Getenv(crashGroupsEnv)
	if dir == "" {
		t.Skip("child process of TestKill9KeepsEveryAcknowledgedSaveOfEveryGroup")
	}
	w, rec, err := Open(dir, Options{SegmentSize: 32 << 10, Logger: quiet})
	if err != nil {
		fmt.Printf("error %v\n", err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	var outMu sync.Mutex
	var wg sync.WaitGroup
	for g := range uint64(8) {
		next := uint64(1)
		if es := rec.Groups[g].Entries; len(es) > 0 {
			next = es[len(es)-1].Index + 1
		}
		log := w.Group(g)
		wg.Go(func() {
			for idx := next; ; idx++ {
				err := log.Save(context.Background(), Batch{Entries: []Entry{{Index: idx, Term: g + 1, Data: payload(idx, g+1)}},
					HardState: &HardState{Term: g + 1, Commit: idx}}, true)
				outMu.Lock()
				if err != nil {
					fmt.Fprintf(out, "error %v\n", err)
				} else {
					fmt.Fprintf(out, "ack %d %d\n", g, idx)
				}
				out.Flush()
				outMu.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestKill9KeepsEveryAcknowledgedSaveOfEveryGroup is
// TestKill9KeepsEveryAcknowledgedSave for a log shared by eight groups:
// after each SIGKILL every group recovers every Save acknowledged to it,
// byte for byte and contiguous, and its newest hard state; three rounds
// over the same directory, so later rounds recover tagged segments torn by
// the previous kill.
func TestKill9KeepsEveryAcknowledgedSaveOfEveryGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	acked := map[uint64]uint64{}
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashWriterGroups$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashGroupsEnv+"="+dir)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		acks := 0
		killAt := 400 + round*250
		for sc.Scan() {
			var g, idx uint64
			if _, err := fmt.Sscanf(sc.Text(), "ack %d %d", &g, &idx); err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: child said %q (stderr: %s)", round, sc.Text(), stderr.String())
			}
			acked[g] = max(acked[g], idx)
			if acks++; acks == killAt {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
			}
		}
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: expected the child killed by SIGKILL, got %v (stderr: %s)", round, err, stderr.String())
		}
		w, rec, err := Open(dir, Options{SegmentSize: 32 << 10, Logger: quiet})
		if err != nil {
			t.Fatalf("round %d: Open after kill -9: %v", round, err)
		}
		mustClose(t, w)
		for g, top := range acked {
			got := rec.Groups[g]
			if uint64(len(got.Entries)) < top {
				t.Fatalf("round %d: group %d: acknowledged up to index %d, recovered only %d entries", round, g, top, len(got.Entries))
			}
			for i, e := range got.Entries {
				if e.Index != uint64(i+1) || e.Term != g+1 || !bytes.Equal(e.Data, payload(e.Index, g+1)) {
					t.Fatalf("round %d: group %d: entry %d: expected index %d term %d with its payload, recovered index %d term %d data %q", round, g, i, i+1, g+1, e.Index, e.Term, e.Data)
				}
			}
			if got.HardState.Commit < top {
				t.Fatalf("round %d: group %d: hard state commit %d is older than the acknowledged index %d", round, g, got.HardState.Commit, top)
			}
		}
		t.Logf("round %d: acknowledged %v, torn tail %+v", round, acked, rec.TornTail)
	}
}
