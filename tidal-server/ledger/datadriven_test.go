package ledger

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/*.txt with what the ledger produces")

// TestDataDriven runs the scripts in testdata/*.txt, each a trace of the
// ledger's behaviour in the style of etcd raft's interaction tests:
//
//	command key=value ...
//	input lines (events for apply and check)
//	----
//	expected output
//
// Blocks are separated by blank lines; lines starting with # between
// blocks are comments. Times are durations from 2024-01-01T00:00:00Z
// (ts=90m, at=-1h). Events are "id entity=N signal=S [weight=W] [ts=D]"
// with weight 1 and ts 0s by default. Run with -rewrite to regenerate the
// expected output after an intended change, then read the diff.
func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata: %v", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) { runScript(t, path) })
	}
}

type script struct {
	ledger    *Ledger
	snapshots map[string][]byte
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := &script{ledger: New(DefaultSchema(), Options{}), snapshots: map[string][]byte{}}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out bytes.Buffer
	for i := 0; i < len(lines); {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			i++
			continue
		}
		cmdLine, at := line, i+1
		i++
		var input []string
		for i < len(lines) && lines[i] != "----" {
			input = append(input, lines[i])
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: command without ---- separator", path, at)
		}
		i++
		var expected []string
		for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
			expected = append(expected, lines[i])
			i++
		}
		got, err := sc.run(cmdLine, input)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", path, at, cmdLine, err)
		}
		got = strings.TrimRight(got, "\n")
		if want := strings.Join(expected, "\n"); got != want && !*rewrite {
			t.Errorf("%s:%d: %s\n got:\n%s\n want:\n%s", path, at, cmdLine, got, want)
		}
		out.WriteString(cmdLine + "\n")
		for _, in := range input {
			out.WriteString(in + "\n")
		}
		out.WriteString("----\n" + got + "\n")
	}
	if *rewrite {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// args parses "key=value" words.
type args map[string]string

func parseArgs(words []string) (args, error) {
	a := args{}
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			return nil, fmt.Errorf("expected key=value, found %q", w)
		}
		a[k] = v
	}
	return a, nil
}

func (a args) uint(key string, def uint64) (uint64, error) {
	v, ok := a[key]
	if !ok {
		return def, nil
	}
	return strconv.ParseUint(v, 10, 64)
}

func (a args) time(key string) (int64, error) {
	v, ok := a[key]
	if !ok {
		return t0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", key, err)
	}
	return t0 + d.Milliseconds(), nil
}

func parseEvents(lines []string) ([]Event, error) {
	var events []Event
	for _, line := range lines {
		words := strings.Fields(line)
		if len(words) == 0 {
			continue
		}
		a, err := parseArgs(words[1:])
		if err != nil {
			return nil, err
		}
		e := Event{ID: words[0], Signal: a["signal"], Weight: 1}
		if e.ID == `""` {
			e.ID = ""
		}
		if e.Entity, err = a.uint("entity", 0); err != nil {
			return nil, err
		}
		if w, ok := a["weight"]; ok {
			if e.Weight, err = strconv.ParseFloat(w, 64); err != nil {
				return nil, err
			}
		}
		if e.TS, err = a.time("ts"); err != nil {
			return nil, err
		}
		events = append(events, e)
	}
	return events, nil
}

func (sc *script) run(cmdLine string, input []string) (string, error) {
	words := strings.Fields(cmdLine)
	a, err := parseArgs(words[1:])
	if err != nil {
		return "", err
	}
	l := sc.ledger
	var b strings.Builder
	switch words[0] {
	case "new":
		n, err := a.uint("ids-per-gen", 0)
		if err != nil {
			return "", err
		}
		sc.ledger = New(DefaultSchema(), Options{IDsPerGeneration: int(n)})
		return "ok", nil
	case "apply":
		index, err := a.uint("index", 0)
		if err != nil {
			return "", err
		}
		term, err := a.uint("term", 1)
		if err != nil {
			return "", err
		}
		events, err := parseEvents(input)
		if err != nil {
			return "", err
		}
		res, err := l.Apply(index, term, events)
		if err != nil {
			return "error: " + err.Error(), nil
		}
		return fmt.Sprintf("applied=%d duplicates=%d applied-index=%d", res.Applied, res.Duplicates, l.AppliedIndex()), nil
	case "check":
		events, err := parseEvents(input)
		if err != nil {
			return "", err
		}
		if err := l.Check(events); err != nil {
			return "error: " + err.Error(), nil
		}
		return "ok", nil
	case "set-applied":
		index, err := a.uint("index", 0)
		if err != nil {
			return "", err
		}
		l.SetApplied(index)
		return fmt.Sprintf("applied-index=%d", l.AppliedIndex()), nil
	case "get":
		entity, err := a.uint("entity", 0)
		if err != nil {
			return "", err
		}
		at, err := a.time("at")
		if err != nil {
			return "", err
		}
		view := l.Get(entity, at)
		for _, st := range l.Schema().Signals {
			sv := view.Signals[st.Name]
			if sv.Count == 0 {
				continue
			}
			fmt.Fprintf(&b, "%s: count=%d weight_sum=%g score=%.6g", st.Name, sv.Count, sv.WeightSum, sv.Score)
			for _, w := range st.Windows {
				fmt.Fprintf(&b, " %s=%d", w.Name, sv.Windows[w.Name])
			}
			b.WriteString("\n")
		}
		if b.Len() == 0 {
			return "no events", nil
		}
		return b.String(), nil
	case "top":
		k, err := a.uint("k", 10)
		if err != nil {
			return "", err
		}
		at, err := a.time("at")
		if err != nil {
			return "", err
		}
		ranked, err := l.Top(a["signal"], a["window"], int(k), at)
		if err != nil {
			return "error: " + err.Error(), nil
		}
		for _, r := range ranked {
			fmt.Fprintf(&b, "entity=%d value=%.6g\n", r.Entity, r.Value)
		}
		if len(ranked) == 0 {
			return "none", nil
		}
		return b.String(), nil
	case "lookup":
		loc, ok := l.Lookup(a["id"])
		if !ok {
			return "not remembered", nil
		}
		return fmtLocation(loc), nil
	case "audit":
		err := l.AuditEvents(func(loc Location) error {
			b.WriteString(fmtLocation(loc) + "\n")
			return nil
		})
		if b.Len() == 0 {
			return "none", err
		}
		return b.String(), err
	case "stats":
		st := l.Stats()
		return fmt.Sprintf("applied-index=%d entities=%d keys=%d buckets=%d ids=%d ids-current=%d",
			st.AppliedIndex, st.Entities, st.Keys, st.Buckets, st.IDs, st.IDsCurrent), nil
	case "digest":
		return l.Digest()[:16], nil
	case "snapshot":
		var buf bytes.Buffer
		if err := l.Snapshot(&buf); err != nil {
			return "", err
		}
		sc.snapshots[a["name"]] = buf.Bytes()
		return fmt.Sprintf("bytes=%d digest=%s", buf.Len(), l.Digest()[:16]), nil
	case "restore":
		data, ok := sc.snapshots[a["name"]]
		if !ok {
			return "", fmt.Errorf("no snapshot %q", a["name"])
		}
		if err := l.Restore(bytes.NewReader(data)); err != nil {
			return "error: " + err.Error(), nil
		}
		var again bytes.Buffer
		if err := l.Snapshot(&again); err != nil {
			return "", err
		}
		return fmt.Sprintf("applied-index=%d digest=%s same-bytes=%t", l.AppliedIndex(), l.Digest()[:16], bytes.Equal(again.Bytes(), data)), nil
	}
	return "", fmt.Errorf("unknown command %q", words[0])
}

func fmtLocation(loc Location) string {
	return fmt.Sprintf("%s: index=%d term=%d position=%d entity=%d signal=%s weight=%g",
		loc.ID, loc.Index, loc.Term, loc.Position, loc.Entity, loc.Signal, loc.Weight)
}
