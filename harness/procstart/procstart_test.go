package procstart

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		line string
		want int64
	}{
		{"1234 (sleep) S 1 1234 1234 0 -1 4194304 93 0 0 0 0 0 0 0 20 0 1 0 987654 5566 100", 987654},
		// A command name with spaces and parentheses of its own.
		{"77 (a) b (c)) R 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0 0", 42},
	} {
		got, err := parseStat([]byte(tc.line))
		if err != nil || got != tc.want {
			t.Errorf("parseStat(%q): expected %d, found %d, %v", tc.line, tc.want, got, err)
		}
	}
	for _, bad := range []string{"", "1 sleep S 1", "1 (x) S 1 2 3", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 notanumber 0"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): expected an error", bad)
		}
	}
}

// The same process reads the same start time every time (the defect this
// package exists for: a start time that moves makes a live run look gone),
// and a later process reads a later or equal one.
func TestOfIsStable(t *testing.T) {
	first, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		if again, err := Of(os.Getpid()); err != nil || again != first {
			t.Fatalf("expected start time %d on every read, found %d, %v", first, again, err)
		}
	}
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	child, err := Of(cmd.Process.Pid)
	if err != nil || child < first {
		t.Errorf("a child started later: expected a start time >= %d, found %d, %v", first, child, err)
	}
}

func TestOfMissingProcess(t *testing.T) {
	dir := t.TempDir()
	old := procRoot
	procRoot = dir
	defer func() { procRoot = old }()
	if _, err := Of(4242); err == nil {
		t.Error("expected an error for a pid with no stat file")
	}
	os.MkdirAll(filepath.Join(dir, "4242"), 0o755)
	os.WriteFile(filepath.Join(dir, "4242", "stat"), []byte("4242 (x) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 "+strconv.Itoa(99)+" 0 0"), 0o644)
	if got, err := Of(4242); err != nil || got != 99 {
		t.Errorf("expected 99, found %d, %v", got, err)
	}
}
