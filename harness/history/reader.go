package history

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Read loads the history at path. See Parse.
func Read(path string) ([]Op, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	defer f.Close()
	ops, err := Parse(f)
	if err != nil {
		return ops, fmt.Errorf("history: %s:%w", path, err)
	}
	return ops, nil
}

// Parse reads a history, one JSON op a line, and checks what a Recorder
// guarantees: known types, non-empty f, index increasing and time not
// decreasing along the file.
//
// A last line without its newline that does not parse is the tail a
// crashed harness was writing; it is dropped. Any other bad line is an
// error naming its line number (the ops before it are returned too).
func Parse(r io.Reader) ([]Op, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	var ops []Op
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return ops, fmt.Errorf("%d: reading: %w", lineNo, err)
		}
		torn := errors.Is(err, io.EOF) // no newline: the final, possibly partial, line
		if torn && len(line) == 0 {
			return ops, nil
		}
		trimmed := bytes.TrimSpace(line)
		if len(trimmed) == 0 {
			if torn {
				return ops, nil
			}
			return ops, fmt.Errorf("%d: expected an op, found an empty line", lineNo)
		}
		op, perr := parseOp(trimmed)
		if perr == nil && len(ops) > 0 {
			prev := ops[len(ops)-1]
			switch {
			case op.Index <= prev.Index:
				perr = fmt.Errorf("expected index > %d (previous line), found %d", prev.Index, op.Index)
			case op.Time < prev.Time:
				perr = fmt.Errorf("expected time >= %d (previous line), found %d", prev.Time, op.Time)
			}
		}
		if perr != nil {
			if torn {
				return ops, nil
			}
			return ops, fmt.Errorf("%d: %w", lineNo, perr)
		}
		ops = append(ops, op)
		if torn {
			return ops, nil
		}
	}
}

// wireOp is Op with the required fields as pointers, so a missing one is
// told apart from a zero one in a single decode.
type wireOp struct {
	Index   *int64          `json:"index"`
	Time    *int64          `json:"time"`
	Process *Process        `json:"process"`
	Type    Type            `json:"type"`
	F       string          `json:"f"`
	Value   json.RawMessage `json:"value"`
	Node    string          `json:"node"`
	Error   string          `json:"error"`
	Seq     uint64          `json:"seq"`
	Term    uint64          `json:"term"`
}

func parseOp(line []byte) (Op, error) {
	var w wireOp
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&w); err != nil {
		return Op{}, fmt.Errorf("expected a JSON op: %w", err)
	}
	if dec.More() {
		return Op{}, fmt.Errorf("expected one JSON op, found trailing data after it")
	}
	switch {
	case w.Index == nil || w.Time == nil || w.Process == nil:
		return Op{}, fmt.Errorf("expected fields index, time and process, found %s", line)
	case *w.Index < 0 || *w.Time < 0:
		return Op{}, fmt.Errorf("expected non-negative index and time, found %d and %d", *w.Index, *w.Time)
	case !w.Type.valid():
		return Op{}, fmt.Errorf("expected type invoke, ok, fail or info, found %q", w.Type)
	case w.F == "":
		return Op{}, fmt.Errorf("expected a non-empty f")
	}
	if bytes.Equal(w.Value, []byte("null")) {
		w.Value = nil
	}
	return Op{Index: *w.Index, Time: *w.Time, Process: *w.Process, Type: w.Type, F: w.F,
		Value: w.Value, Node: w.Node, Error: w.Error, Seq: w.Seq, Term: w.Term}, nil
}
