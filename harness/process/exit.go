package process

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// ExitStatus is how a process ended, in the words a report needs: its
// exit code, or the signal that ended it.
type ExitStatus struct {
	// Code is the exit code; -1 when a signal ended the process.
	Code int `json:"code"`
	// Signal names the signal that ended the process ("killed"), if any.
	Signal string `json:"signal,omitempty"`
	// Text is what Go's os/exec says: "exit status 2", "signal: killed".
	Text string `json:"text"`
}

func (s ExitStatus) String() string { return s.Text }

// StatusOf describes the error cmd.Wait returned (nil: exit status 0).
func StatusOf(err error) ExitStatus {
	if err == nil {
		return ExitStatus{Code: 0, Text: "exit status 0"}
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		s := ExitStatus{Code: ee.ExitCode(), Text: ee.Error()}
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			s.Signal = ws.Signal().String()
		}
		return s
	}
	// Wait itself failed (the process was never reaped normally).
	return ExitStatus{Code: -1, Text: err.Error()}
}

// ExitStatus is how the process ended; ok is false while it runs.
func (p *Process) ExitStatus() (status ExitStatus, ok bool) {
	if p.Running() {
		return ExitStatus{}, false
	}
	return StatusOf(p.ExitErr()), true
}

// LogPath is the file the process's stdout and stderr go to.
func (p *Process) LogPath() string { return p.spec.LogPath }

// tailChunk is how much of a file's end Tail reads at a time.
const tailChunk = 16 << 10

// Tail returns the last n lines of the file at path (fewer if it has
// fewer), without reading the whole file: a node's log can be large, and
// the lines that explain a crash are at its end.
func Tail(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	end := st.Size()
	var buf []byte
	for off := end; off > 0 && bytes.Count(buf, []byte{'\n'}) <= n; {
		size := int64(tailChunk)
		if off < size {
			size = off
		}
		off -= size
		chunk := make([]byte, size)
		if _, err := f.ReadAt(chunk, off); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("tail %s: %w", path, err)
		}
		buf = append(chunk, buf...)
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	if len(lines) == 1 && lines[0] == "" {
		return nil, nil
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines, nil
}
