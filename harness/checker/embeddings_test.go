package checker

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/harness/history"
)

// embPut is one put of embRun: entity, vector hash, outcome, and for an
// ok put its seq and whether the node answered it as a duplicate.
type embPut struct {
	entity  uint64
	hash    string
	outcome history.Type
	seq     uint64
	dup     bool
}

// embRun builds a history: the puts one after the other (an info put
// never completes before the end), then the gets, then each node's final
// local reads, node -> entity -> hash, at the given applied indexes.
type embRun struct {
	puts     []embPut
	gets     map[uint64]string // linearizable gets after every put, entity -> hash
	final    map[string]map[uint64]string
	applied  map[string]uint64 // default 100
	parallel bool              // every put invoked before any completes
}

func (r embRun) ops(t *testing.T) []history.Op {
	h := newHist(t)
	proc := history.Process(0)
	next := func() history.Process { proc++; return proc }
	var invokes []history.Op
	for i, p := range r.puts {
		inv := h.invoke(next(), history.FPutEmbedding, history.PutEmbeddingValue{Entity: p.entity, ID: "E" + string(rune('a'+i)), Dim: 3, Hash: p.hash}, "n1")
		invokes = append(invokes, inv)
		if !r.parallel {
			r.complete(h, inv, p)
		}
	}
	if r.parallel {
		for i, p := range r.puts {
			r.complete(h, invokes[i], p)
		}
	}
	for _, e := range slices.Sorted(maps.Keys(r.gets)) {
		inv := h.invoke(next(), history.FGetEmbedding, history.GetEmbeddingValue{Entity: e}, "n2")
		h.complete(inv, history.OK, history.GetEmbeddingValue{Entity: e, Hash: r.gets[e]})
	}
	for _, n := range slices.Sorted(maps.Keys(r.final)) {
		p := next()
		for _, e := range slices.Sorted(maps.Keys(r.final[n])) {
			applied, ok := r.applied[n]
			if !ok {
				applied = 100
			}
			inv := h.invoke(p, history.FGetEmbedding, history.GetEmbeddingValue{Entity: e, Local: true}, n)
			h.complete(inv, history.OK, history.GetEmbeddingValue{Entity: e, Hash: r.final[n][e], Local: true, AppliedIndex: applied})
		}
	}
	for i, p := range r.puts {
		if p.outcome == history.Info {
			h.complete(invokes[i], history.Info, nil)
		}
	}
	return h.ops
}

func (r embRun) complete(h *hist, inv history.Op, p embPut) {
	switch p.outcome {
	case history.OK:
		v, _ := history.Decode[history.PutEmbeddingValue](inv)
		dup := p.dup
		v.Duplicate = &dup
		op := history.Op{Process: inv.Process, Type: history.OK, F: inv.F, Node: inv.Node, Seq: p.seq, Term: 2}
		h.push(op, v)
	case history.Fail:
		h.complete(inv, history.Fail, nil)
	}
}

var embNodes = []string{"n1", "n2", "n3"}

// goodEmbRun: entity 1 overwritten (A then B, both acked), entity 2
// written once (C), entity 3's put D unknown, entity 4's put E failed.
func goodEmbRun() embRun {
	finalOf := func(d string) map[uint64]string { return map[uint64]string{1: "B", 2: "C", 3: d, 4: ""} }
	return embRun{
		puts: []embPut{
			{entity: 1, hash: "A", outcome: history.OK, seq: 10},
			{entity: 1, hash: "B", outcome: history.OK, seq: 20},
			{entity: 2, hash: "C", outcome: history.OK, seq: 15},
			{entity: 3, hash: "D", outcome: history.Info},
			{entity: 4, hash: "E", outcome: history.Fail},
		},
		gets:  map[uint64]string{1: "B", 2: "C"},
		final: map[string]map[uint64]string{"n1": finalOf("D"), "n2": finalOf(""), "n3": finalOf("D")},
	}
}

func embAnomalies(r Result) (lost, unexpected, stale int) {
	d := r.Details.(EmbeddingsDetails)
	return d.Lost.Count, d.Unexpected.Count, d.Stale.Count
}

func TestEmbeddingsValid(t *testing.T) {
	r := Embeddings(goodEmbRun().ops(t), embNodes)
	mustValid(t, r, Valid)
	d := r.Details.(EmbeddingsDetails)
	if d.Entities != 3 || d.WriteOnce != 2 || d.FinalReads != 12 || d.Gets != 2 {
		t.Errorf("expected 3 live entities (2 written once), 12 final reads, 2 gets; found %+v", d)
	}

	// A vector superseded by a put whose outcome is unknown.
	run := goodEmbRun()
	run.puts = append(run.puts, embPut{entity: 1, hash: "F", outcome: history.Info})
	run.final["n2"][1] = "F"
	mustValid(t, Embeddings(run.ops(t), embNodes), Valid)

	// Concurrent puts, the later-indexed one answered as a duplicate: its
	// seq does not say when its vector was set, so either may show.
	run = goodEmbRun()
	run.parallel = true
	run.puts[1].dup = true
	run.final["n1"][1] = "A"
	mustValid(t, Embeddings(run.ops(t), embNodes), Valid)
}

// Regression: the embeddings checker says false on a
// vector dropped from one node, on every vector dropped from every node
// (a snapshot that lost them: no digest differs), on an older vector
// left visible after a newer acknowledged put, on a vector nobody wrote,
// and on a stale linearizable get.
func TestEmbeddingsDefects(t *testing.T) {
	for _, c := range []struct {
		name                    string
		plant                   func(r *embRun)
		lost, unexpected, stale int
	}{
		{"write-once vector dropped on one node", func(r *embRun) { r.final["n2"][2] = "" }, 1, 0, 0},
		{"every vector dropped on every node", func(r *embRun) {
			for _, n := range embNodes {
				r.final[n] = map[uint64]string{1: "", 2: "", 3: "", 4: ""}
			}
		}, 6, 0, 0},
		{"older vector after a newer acked put", func(r *embRun) { r.final["n3"][1] = "A" }, 1, 0, 0},
		{"older vector, concurrent puts ordered by their log index", func(r *embRun) {
			r.parallel = true
			r.final["n3"][1] = "A"
		}, 1, 0, 0},
		{"failed put applied", func(r *embRun) { r.final["n1"][4] = "E" }, 0, 1, 0},
		{"vector nobody wrote", func(r *embRun) { r.final["n1"][2] = "Z" }, 0, 1, 0},
		{"vector on an entity never put", func(r *embRun) { r.final["n1"][9] = "Z" }, 0, 1, 0},
		{"stale get", func(r *embRun) { r.gets[1] = "A" }, 0, 0, 1},
		{"get of nothing after an acked put", func(r *embRun) { r.gets[2] = "" }, 0, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			run := goodEmbRun()
			c.plant(&run)
			r := Embeddings(run.ops(t), embNodes)
			mustValid(t, r, Invalid)
			if l, u, s := embAnomalies(r); l != c.lost || u != c.unexpected || s != c.stale {
				t.Errorf("expected lost %d, unexpected %d, stale %d; found %d, %d, %d: %s", c.lost, c.unexpected, c.stale, l, u, s, r.Summary)
			}
		})
	}
}

// Regression: without the data to decide, the checker
// says unknown, never true: a node's final reads missing, a history from
// before the per-node final reads, no nodes named; and a vector missing
// on a node that had not applied as far as the put is lag (unknown), not
// loss.
func TestEmbeddingsUnknownWithoutData(t *testing.T) {
	run := goodEmbRun()
	delete(run.final, "n3")
	r := Embeddings(run.ops(t), embNodes)
	mustValid(t, r, Unknown)
	if !strings.Contains(r.Summary, "final reads missing") {
		t.Errorf("expected the summary to name the missing final reads, found %q", r.Summary)
	}

	run = goodEmbRun()
	run.final = nil
	mustValid(t, Embeddings(run.ops(t), embNodes), Unknown)

	mustValid(t, Embeddings(goodEmbRun().ops(t), nil), Unknown)

	run = goodEmbRun()
	run.final["n3"][2] = ""
	run.applied = map[string]uint64{"n3": 12} // C is at 15
	r = Embeddings(run.ops(t), embNodes)
	mustValid(t, r, Unknown)
	if d := r.Details.(EmbeddingsDetails); d.Unreplicated.Count != 1 {
		t.Errorf("expected one unreplicated read, found %+v", d.Unreplicated)
	}
}
