package process

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeSchedstat(t *testing.T, root string, pid, tid, content string) {
	t.Helper()
	dir := filepath.Join(root, pid, "task", tid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "schedstat"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The run-queue wait is the sum of every thread's second schedstat field.
func TestRunQueueWaitSumsThreads(t *testing.T) {
	root := t.TempDir()
	writeSchedstat(t, root, "42", "42", "9000000 1500000000 17\n")
	writeSchedstat(t, root, "42", "43", "100 250000000 3\n")
	got, err := runQueueWait(root, 42)
	if err != nil {
		t.Fatal(err)
	}
	if want := 1750 * time.Millisecond; got != want {
		t.Fatalf("run-queue wait of two threads waiting 1.5s and 250ms: got %v, expected %v", got, want)
	}
}

func TestRunQueueWaitRefusesWhatItCannotRead(t *testing.T) {
	root := t.TempDir()
	if _, err := runQueueWait(root, 7); err == nil {
		t.Fatal("run-queue wait of a pid with no task directory: expected an error, found none")
	}
	writeSchedstat(t, root, "8", "8", "123\n")
	if _, err := runQueueWait(root, 8); err == nil || !strings.Contains(err.Error(), "expected") {
		t.Fatalf("run-queue wait from a one-field schedstat: expected an error naming the format, found %v", err)
	}
}

// On Linux the test process itself has a readable, non-negative wait.
func TestRunQueueWaitOfThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc")
	}
	if _, err := runQueueWait("/proc", os.Getpid()); err != nil {
		t.Fatal(err)
	}
}
