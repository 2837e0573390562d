package history

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestProcessJSON(t *testing.T) {
	for _, tc := range []struct {
		p    Process
		json string
	}{{0, `0`}, {17, `17`}, {Nemesis, `"nemesis"`}} {
		b, err := json.Marshal(tc.p)
		if err != nil || string(b) != tc.json {
			t.Fatalf("marshal %d: got %s, %v; want %s", int(tc.p), b, err, tc.json)
		}
		var back Process
		if err := json.Unmarshal(b, &back); err != nil || back != tc.p {
			t.Fatalf("unmarshal %s: got %d, %v", b, int(back), err)
		}
	}
	for _, bad := range []string{`-2`, `"n1"`, `1.5`, `null`} {
		var p Process
		if err := json.Unmarshal([]byte(bad), &p); err == nil {
			t.Errorf("unmarshal %s: expected an error, got process %d", bad, int(p))
		}
	}
	if _, err := json.Marshal(Process(-5)); err == nil {
		t.Error("marshal of process -5: expected an error")
	}
}

// TestRecorderConcurrent has many clients record through one recorder and
// checks the file reads back with the recorder's invariants intact.
func TestRecorderConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.jsonl")
	r, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	const clients, opsPerClient = 8, 200
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < opsPerClient; i++ {
				id := fmt.Sprintf("c%d-%d", c, i)
				inv := r.Invoke(Process(c), FWrite, WriteValue{Events: []Event{{ID: id, Entity: uint64(i), Signal: "view"}}}, "n1")
				switch i % 3 {
				case 0:
					r.Complete(inv, OK, nil, nil, uint64(i+1), 2)
				case 1:
					r.Complete(inv, Fail, nil, errors.New("503 no leader"), 0, 0)
				default:
					r.Complete(inv, OK, nil, nil, uint64(i+1), 3)
				}
			}
		}()
	}
	nem := r.Invoke(Nemesis, FPartition, FaultValue{Kind: "halves", Grudge: map[string][]string{"n1": {"n3"}}}, "")
	r.Complete(nem, OK, nil, nil, 0, 0)
	wg.Wait()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// After Close, ops are dropped rather than written.
	r.Invoke(0, FWrite, nil, "n1")

	ops, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := clients*opsPerClient*2 + 2; len(ops) != want {
		t.Fatalf("read %d ops, want %d", len(ops), want)
	}
	for i, op := range ops {
		if op.Index != int64(i) {
			t.Fatalf("line %d: index %d, want %d", i+1, op.Index, i)
		}
	}
	pairs, err := Pairs(ops)
	if err != nil {
		t.Fatal(err)
	}
	var oks, fails int
	for _, p := range pairs {
		if p.Pending {
			t.Fatalf("%s is pending; every op was completed", p.Invoke)
		}
		if !bytes.Equal(p.Invoke.Value, p.Completion.Value) {
			t.Fatalf("%s: completion value %s, want the invoke's %s", p.Completion, p.Completion.Value, p.Invoke.Value)
		}
		switch p.Type() {
		case OK:
			oks++
			if p.Invoke.F == FWrite && (p.Completion.Seq == 0 || p.Completion.Term == 0) {
				t.Fatalf("%s: ok write without seq/term", p.Completion)
			}
		case Fail:
			fails++
			if p.Completion.Error != "503 no leader" {
				t.Fatalf("%s: error %q", p.Completion, p.Completion.Error)
			}
		}
	}
	// i%3 == 1 for 67 of 0..199; the nemesis op is the extra ok.
	if wantFails := clients * 67; fails != wantFails || oks != clients*opsPerClient-wantFails+1 {
		t.Fatalf("got %d oks and %d fails, want %d and %d", oks, fails, clients*opsPerClient-wantFails+1, wantFails)
	}
	fv, err := Decode[FaultValue](findNemesis(t, pairs).Invoke)
	if err != nil || fv.Kind != "halves" || fv.Grudge["n1"][0] != "n3" {
		t.Fatalf("fault value round trip: %+v, %v", fv, err)
	}
}

func findNemesis(t *testing.T, pairs []Pair) Pair {
	for _, p := range pairs {
		if p.Invoke.Process == Nemesis {
			return p
		}
	}
	t.Fatal("no nemesis op")
	return Pair{}
}

// TestRecorderFlushesWithoutClose is the crash case: a harness that dies
// without Close must still leave what it recorded more than a flush
// interval ago on disk.
func TestRecorderFlushesWithoutClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.jsonl")
	r, err := Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	inv := r.Invoke(3, FAdd, AddValue{Key: 9, Delta: 2, IDs: []string{"a", "b"}}, "n2")
	r.Complete(inv, Info, nil, errors.New("timeout"), 0, 0)
	// The flush is the behaviour under test; the bound is many intervals wide.
	deadline := time.Now().Add(50 * FlushInterval)
	for {
		ops, err := Read(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(ops) == 2 {
			v, err := Decode[AddValue](ops[0])
			if err != nil || v.Key != 9 || v.Delta != 2 || len(v.IDs) != 2 {
				t.Fatalf("add value: %+v, %v", v, err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v only %d ops are on disk, want 2", 50*FlushInterval, len(ops))
		}
		time.Sleep(FlushInterval / 4)
	}
}

func TestCreateRefusesExisting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.jsonl")
	if err := os.WriteFile(path, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Create over an existing history: got %v, want an error naming %s", err, path)
	}
}

func TestCompleteRejectsInvokeType(t *testing.T) {
	r, err := Create(filepath.Join(t.TempDir(), "h.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	inv := r.Invoke(0, FRead, ReadValue{Key: 1}, "n1")
	r.Complete(inv, Invoke, nil, nil, 0, 0)
	if err := r.Close(); err == nil || !strings.Contains(err.Error(), "expected type ok, fail or info") {
		t.Fatalf("Close after completing with type invoke: got %v", err)
	}
}

type answeredErr struct{}

func (answeredErr) Error() string                     { return "500 internal: boom" }
func (answeredErr) Answer() (status int, code string) { return 500, "internal" }

// A completion keeps the status and code of the answer its error wraps.
func TestCompleteRecordsTheAnswer(t *testing.T) {
	r, err := Create(filepath.Join(t.TempDir(), "h.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	inv := r.Invoke(0, FWrite, WriteValue{}, "n1")
	op := r.Complete(inv, Info, nil, fmt.Errorf("after 1 attempt: %w", answeredErr{}), 0, 0)
	if op.Status != 500 || op.Code != "internal" {
		t.Fatalf("expected status 500 code internal, found %d %q", op.Status, op.Code)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

const goodLines = `{"index":0,"time":10,"process":0,"type":"invoke","f":"write","value":{"events":[{"id":"a","entity":1,"signal":"view"}]},"node":"n1"}
{"index":1,"time":20,"process":"nemesis","type":"invoke","f":"partition","value":{"kind":"halves"}}
{"index":2,"time":30,"process":0,"type":"ok","f":"write","value":{"events":[{"id":"a","entity":1,"signal":"view"}]},"node":"n1","seq":5,"term":2}
`

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		ops     int
		wantErr string // substring; empty = no error
	}{
		{name: "good", in: goodLines, ops: 3},
		{name: "empty", in: "", ops: 0},
		{name: "torn tail dropped", in: goodLines + `{"index":3,"time":40,"proc`, ops: 3},
		{name: "complete last line without newline kept", in: strings.TrimSuffix(goodLines, "\n"), ops: 3},
		{name: "garbage mid-file", in: "{\"index\":0,\"time\":1,\"process\":0,\"type\":\"invoke\",\"f\":\"read\"}\nnot json\n" + goodLines, ops: 1, wantErr: "2: expected a JSON op"},
		{name: "unknown type", in: `{"index":0,"time":1,"process":0,"type":"done","f":"read"}` + "\n", wantErr: `1: expected type invoke, ok, fail or info, found "done"`},
		{name: "missing process", in: `{"index":0,"time":1,"type":"invoke","f":"read"}` + "\n", wantErr: "1: expected fields index, time and process"},
		{name: "missing f", in: `{"index":0,"time":1,"process":1,"type":"invoke"}` + "\n", wantErr: "1: expected a non-empty f"},
		{name: "index goes back", in: goodLines + `{"index":1,"time":40,"process":1,"type":"invoke","f":"read"}` + "\n", ops: 3, wantErr: "4: expected index > 2 (previous line), found 1"},
		{name: "time goes back", in: goodLines + `{"index":3,"time":29,"process":1,"type":"invoke","f":"read"}` + "\n", ops: 3, wantErr: "4: expected time >= 30"},
		{name: "two objects on a line", in: `{"index":0,"time":1,"process":0,"type":"invoke","f":"read"} {}` + "\n", wantErr: "1: expected one JSON op"},
		{name: "blank line mid-file", in: goodLines + "\n" + goodLines, ops: 3, wantErr: "4: expected an op, found an empty line"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ops, err := Parse(strings.NewReader(tc.in))
			if tc.wantErr == "" && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("got error %v, want one containing %q", err, tc.wantErr)
			}
			if len(ops) != tc.ops {
				t.Fatalf("got %d ops, want %d", len(ops), tc.ops)
			}
		})
	}
}

func TestReadErrorNamesFileAndLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.jsonl")
	if err := os.WriteFile(path, []byte(goodLines+"{oops}\n"+goodLines), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Read(path)
	if err == nil || !strings.Contains(err.Error(), path+":4:") {
		t.Fatalf("got %v, want an error naming %s:4", err, path)
	}
}

// TestReadTestdata reads the example histories shipped with the package.
func TestReadTestdata(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.jsonl")
	if len(files) == 0 {
		t.Fatal("no testdata/*.jsonl")
	}
	for _, f := range files {
		ops, err := Read(f)
		if err != nil {
			t.Fatal(err)
		}
		pairs, err := Pairs(ops)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(pairs) == 0 {
			t.Fatalf("%s: no operations", f)
		}
	}
}

func TestPairs(t *testing.T) {
	mk := func(i int64, p Process, typ Type, f string) Op {
		return Op{Index: i, Time: i * 10, Process: p, Type: typ, F: f}
	}
	t.Run("pending and nemesis overlap", func(t *testing.T) {
		ops := []Op{
			mk(0, 0, Invoke, FAdd),
			mk(1, Nemesis, Invoke, FPartition),
			mk(2, Nemesis, Invoke, FKill),
			mk(3, 1, Invoke, FRead),
			mk(4, Nemesis, OK, FKill),
			mk(5, 0, Info, FAdd),
			mk(6, 2, Invoke, FAdd),
			mk(7, Nemesis, OK, FPartition),
		}
		pairs, err := Pairs(ops)
		if err != nil {
			t.Fatal(err)
		}
		want := []struct {
			inv, comp int64
			pending   bool
		}{{0, 5, false}, {1, 7, false}, {2, 4, false}, {3, -1, true}, {6, -1, true}}
		if len(pairs) != len(want) {
			t.Fatalf("got %d pairs, want %d", len(pairs), len(want))
		}
		for i, w := range want {
			p := pairs[i]
			if p.Invoke.Index != w.inv || p.Completion.Index != w.comp || p.Pending != w.pending {
				t.Errorf("pair %d: invoke %d completion %d pending %v; want %+v", i, p.Invoke.Index, p.Completion.Index, p.Pending, w)
			}
			if p.Pending && (p.Type() != Info || p.Completion.Time != 70) {
				t.Errorf("pending pair %d: type %s time %d, want info at the last op's time 70", i, p.Type(), p.Completion.Time)
			}
		}
	})
	for _, tc := range []struct {
		name    string
		ops     []Op
		wantErr string
	}{
		{"completion without invoke", []Op{mk(0, 0, OK, FAdd)}, "expected an outstanding invoke of process 0"},
		{"double invoke", []Op{mk(0, 0, Invoke, FAdd), mk(1, 0, Invoke, FAdd)}, "expected process 0 to be idle, found its op 0 still in flight"},
		{"f mismatch", []Op{mk(0, 0, Invoke, FAdd), mk(1, 0, OK, FRead)}, "expected completion of add (op 0), found f read"},
		{"back after info", []Op{mk(0, 0, Invoke, FAdd), mk(1, 0, Info, FAdd), mk(2, 0, Invoke, FAdd)}, "expected process 0 to stay retired after its info op 1"},
		{"stray nemesis completion", []Op{mk(0, Nemesis, OK, FPartition)}, "expected an outstanding nemesis partition invoke"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Pairs(tc.ops)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestHealOf(t *testing.T) {
	if f, ok := HealedBy(HealOf(FPartition)); !ok || f != FPartition {
		t.Fatalf("HealedBy(HealOf(partition)) = %q, %v", f, ok)
	}
	if f, ok := HealedBy(HealAll); !ok || f != "" {
		t.Fatalf("HealedBy(heal-all) = %q, %v", f, ok)
	}
	if _, ok := HealedBy(FPartition); ok {
		t.Fatal("partition is not a heal")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(goodLines))
	f.Add([]byte(goodLines + `{"index":3`))
	f.Add([]byte(`{"index":0,"time":0,"process":"nemesis","type":"info","f":"x","value":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ops, err := Parse(bytes.NewReader(data))
		if err != nil {
			return
		}
		// Whatever parses re-encodes to lines that parse to the same ops.
		var buf bytes.Buffer
		for _, op := range ops {
			b, err := json.Marshal(op)
			if err != nil {
				t.Fatalf("re-encoding %s: %v", op, err)
			}
			buf.Write(append(b, '\n'))
		}
		again, err := Parse(&buf)
		if err != nil || len(again) != len(ops) {
			t.Fatalf("re-parse: %d ops, %v; want %d", len(again), err, len(ops))
		}
		for i := range ops {
			a, b := ops[i], again[i]
			if a.Index != b.Index || a.Time != b.Time || a.Process != b.Process || a.Type != b.Type || a.F != b.F || a.Seq != b.Seq {
				t.Fatalf("op %d changed on round trip: %+v vs %+v", i, a, b)
			}
		}
	})
}
