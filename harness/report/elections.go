package report

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"github.com/tidaldb/tidal/harness/checker"
)

// ElectionsFile holds the status sampler's term and leader per node and
// process, one checker.ElectionSample a line: the election checker's
// evidence. Appended while the run goes on, like lag.jsonl.
const ElectionsFile = "elections.jsonl"

// ElectionWriter appends election samples to elections.jsonl. Safe for
// concurrent use; lines reach the file at every Flush and at Close.
type ElectionWriter struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	err error // first error; sticky
}

// ElectionWriter opens elections.jsonl for appending.
func (r *Run) ElectionWriter() (*ElectionWriter, error) {
	f, err := os.OpenFile(r.Path(ElectionsFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	return &ElectionWriter{f: f, w: bufio.NewWriterSize(f, 16<<10)}, nil
}

// Append buffers one sample; the first error is returned by every call.
func (ew *ElectionWriter) Append(s checker.ElectionSample) error {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	if ew.err == nil && ew.f == nil {
		ew.err = errors.New("report: election writer: append after close")
	}
	if ew.err == nil {
		b, _ := json.Marshal(s)
		if _, err := ew.w.Write(append(b, '\n')); err != nil {
			ew.err = fmt.Errorf("report: writing %s: %w", ew.f.Name(), err)
		}
	}
	return ew.err
}

// Flush writes the buffered samples to the file (no fsync).
func (ew *ElectionWriter) Flush() error {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	if ew.err == nil && ew.f != nil {
		if err := ew.w.Flush(); err != nil {
			ew.err = fmt.Errorf("report: writing %s: %w", ew.f.Name(), err)
		}
	}
	return ew.err
}

// Close flushes, syncs and closes the file. Closing twice is a no-op.
func (ew *ElectionWriter) Close() error {
	ew.mu.Lock()
	defer ew.mu.Unlock()
	if ew.f == nil {
		return ew.err
	}
	if ew.err == nil {
		if err := ew.w.Flush(); err != nil {
			ew.err = fmt.Errorf("report: writing %s: %w", ew.f.Name(), err)
		} else if err := ew.f.Sync(); err != nil {
			ew.err = fmt.Errorf("report: syncing %s: %w", ew.f.Name(), err)
		}
	}
	if err := ew.f.Close(); err != nil && ew.err == nil {
		ew.err = fmt.Errorf("report: closing %s: %w", ew.f.Name(), err)
	}
	ew.f = nil
	return ew.err
}

// ReadElections reads elections.jsonl; found is false when the run has
// none (a store from before the file existed, or a database whose
// sampler writes none). A torn last line is dropped, as ReadLag does.
func (r *Run) ReadElections() (samples []checker.ElectionSample, found bool, err error) {
	b, err := os.ReadFile(r.Path(ElectionsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("report: %w", err)
	}
	lines := bytes.Split(b, []byte{'\n'})
	for i, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var s checker.ElectionSample
		if jerr := json.Unmarshal(line, &s); jerr != nil {
			if i == len(lines)-1 {
				break // torn tail of a crashed run
			}
			return samples, true, fmt.Errorf("report: %s:%d: expected an election sample: %w", r.Path(ElectionsFile), i+1, jerr)
		}
		samples = append(samples, s)
	}
	return samples, true, nil
}
