package process

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestTail(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var long strings.Builder
	for i := 0; i < 5000; i++ { // several tail chunks
		fmt.Fprintf(&long, "line %d %s\n", i, strings.Repeat("x", 20))
	}
	for _, tc := range []struct {
		name, body string
		n          int
		want       []string
	}{
		{"empty", "", 5, nil},
		{"fewer lines than asked", "a\nb\n", 5, []string{"a", "b"}},
		{"no final newline", "a\nb\nc", 2, []string{"b", "c"}},
		{"across chunks", long.String(), 3, []string{"line 4997 " + strings.Repeat("x", 20), "line 4998 " + strings.Repeat("x", 20), "line 4999 " + strings.Repeat("x", 20)}},
	} {
		got, err := Tail(write(tc.name, tc.body), tc.n)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: Tail = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := Tail(filepath.Join(dir, "missing"), 3); err == nil {
		t.Error("Tail of a missing file: expected an error")
	}
}

func TestStatusOf(t *testing.T) {
	if s := StatusOf(nil); s.Code != 0 || s.Signal != "" {
		t.Errorf("nil: %+v", s)
	}
	err := exec.Command("sh", "-c", "exit 3").Run()
	if s := StatusOf(err); s.Code != 3 || s.Signal != "" || s.Text != "exit status 3" {
		t.Errorf("exit 3: %+v", s)
	}
	err = exec.Command("sh", "-c", "kill -9 $$").Run()
	if s := StatusOf(err); s.Code != -1 || s.Signal != "killed" || s.Text != "signal: killed" {
		t.Errorf("kill -9: %+v", s)
	}
}
