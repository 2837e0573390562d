package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// FlushInterval bounds how much of a history a crashed harness can lose:
// the buffer is written out at least this often.
const FlushInterval = 100 * time.Millisecond

// Recorder appends ops to a history file. It is safe for concurrent use by
// every client and the nemesis.
//
// Index and time are assigned under the same lock as the append, so file
// order, index order and time order agree. Writes go through a buffer that
// a background goroutine flushes every FlushInterval; Close flushes,
// fsyncs and stops it. The first I/O or encoding error is sticky: later
// ops are dropped and Close (and Err) report it.
type Recorder struct {
	start time.Time

	mu   sync.Mutex
	f    *os.File
	w    *bufio.Writer
	next int64
	last int64
	err  error

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Create starts a new history at path. It refuses to overwrite an
// existing file: a run's history is evidence.
func Create(path string) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history: create %s: %w", path, err)
	}
	r := &Recorder{
		start: time.Now(),
		f:     f,
		w:     bufio.NewWriterSize(f, 256<<10),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	go r.flushLoop()
	return r, nil
}

// Start is the wall-clock instant history time 0 stands for.
func (r *Recorder) Start() time.Time { return r.start }

// Now is the current history time (ns since Start, monotonic), for
// samplers that record alongside the history (e.g. lag samples).
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

func (r *Recorder) flushLoop() {
	defer close(r.done)
	t := time.NewTicker(FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.mu.Lock()
			if r.err == nil {
				r.err = r.w.Flush()
			}
			r.mu.Unlock()
		}
	}
}

// Invoke records the start of an operation by process p against node
// (empty for the nemesis). value is marshalled to JSON (a json.RawMessage
// is written as is; nil writes no value).
func (r *Recorder) Invoke(p Process, f string, value any, node string) Op {
	return r.append(Op{Process: p, Type: Invoke, F: f, Node: node}, value)
}

// Complete records the end of invoke with type t (OK, Fail or Info). A nil
// value repeats the invoke's value; err, if any, becomes the op's error.
// seq and term are the raft position of an acknowledged write (zero
// otherwise).
func (r *Recorder) Complete(invoke Op, t Type, value any, err error, seq, term uint64) Op {
	op := Op{Process: invoke.Process, Type: t, F: invoke.F, Node: invoke.Node, Seq: seq, Term: term}
	if err != nil {
		op.Error = err.Error()
		var a Answered
		if errors.As(err, &a) {
			op.Status, op.Code = a.Answer()
		}
	}
	if !t.IsCompletion() {
		r.fail(fmt.Errorf("history: completing %s: expected type ok, fail or info, found %q", invoke, t))
		return op
	}
	if value == nil {
		value = invoke.Value
	}
	return r.append(op, value)
}

func (r *Recorder) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
}

func (r *Recorder) append(op Op, value any) Op {
	if value != nil {
		raw, ok := value.(json.RawMessage)
		if !ok {
			b, err := json.Marshal(value)
			if err != nil {
				r.fail(fmt.Errorf("history: encoding the value of a %s %s op: %w", op.F, op.Type, err))
				return op
			}
			raw = b
		}
		op.Value = raw
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	op.Index = r.next
	op.Time = int64(time.Since(r.start))
	if op.Time < r.last { // cannot happen with a monotonic clock; keep the invariant anyway
		op.Time = r.last
	}
	if r.err != nil || r.f == nil {
		return op
	}
	line, err := json.Marshal(op)
	if err != nil {
		r.err = fmt.Errorf("history: encoding %s: %w", op, err)
		return op
	}
	line = append(line, '\n')
	if _, err := r.w.Write(line); err != nil {
		r.err = fmt.Errorf("history: writing %s: %w", op, err)
		return op
	}
	r.next++
	r.last = op.Time
	return op
}

// Err reports the first error the recorder hit, if any.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Close flushes and fsyncs the history and closes the file. Ops recorded
// after Close are dropped. It is safe to call more than once, and
// concurrently.
func (r *Recorder) Close() error {
	r.closeOnce.Do(func() {
		close(r.stop)
		<-r.done
		r.mu.Lock()
		defer r.mu.Unlock()
		errs := []error{r.err}
		if r.err == nil {
			if err := r.w.Flush(); err != nil {
				errs = append(errs, fmt.Errorf("history: flushing %s: %w", r.f.Name(), err))
			}
		}
		if err := r.f.Sync(); err != nil {
			errs = append(errs, fmt.Errorf("history: fsync %s: %w", r.f.Name(), err))
		}
		errs = append(errs, r.f.Close())
		r.f = nil
		r.err = errors.Join(errs...)
	})
	return r.Err()
}
