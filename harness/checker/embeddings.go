package checker

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/harness/history"
)

// EmbeddingPut names one put of an embedding.
type EmbeddingPut struct {
	ID      string          `json:"id"`
	Hash    string          `json:"hash"`
	Outcome history.Type    `json:"outcome"`
	Process history.Process `json:"process"`
	Node    string          `json:"node"`   // the node the client sent it to
	Invoke  int64           `json:"invoke"` // op index
	Start   int64           `json:"start"`  // history time of the invoke
	End     int64           `json:"end"`    // history time of the completion
	Seq     uint64          `json:"seq,omitempty"`
	Term    uint64          `json:"term,omitempty"`
	// Applied is set for an ok put the node answered as not a duplicate:
	// its vector was set by the entry at Seq.
	Applied bool `json:"applied,omitempty"`
}

// EmbeddingAnomaly is a read of an entity's embedding that the puts do
// not explain, with the put it contradicts.
type EmbeddingAnomaly struct {
	Entity uint64 `json:"entity"`
	Node   string `json:"node"`
	// Read is the hash the node returned ("" when it had no embedding).
	Read         string `json:"read"`
	ReadInvoke   int64  `json:"read_invoke"` // op index of the read
	ReadTime     int64  `json:"read_time"`   // history time of its completion
	AppliedIndex uint64 `json:"applied_index,omitempty"`
	// Put is the acknowledged put the read should have shown (lost,
	// stale, unreplicated), or the put whose vector it showed
	// (unexpected: a failed put).
	Put    *EmbeddingPut `json:"put,omitempty"`
	Faults []FaultWindow `json:"faults,omitempty"`
}

// EmbeddingsDetails is the Details of an Embeddings result.
type EmbeddingsDetails struct {
	Nodes []string `json:"nodes"` // expected to give final reads
	// Entities is how many entities had a put that did not fail;
	// WriteOnce how many of them were put exactly once (a vector lost
	// there cannot be refilled by a later put).
	Entities   int                  `json:"entities"`
	WriteOnce  int                  `json:"write_once"`
	Puts       map[history.Type]int `json:"puts"`
	FinalReads int                  `json:"final_reads"` // (node, entity) final reads judged
	Gets       int                  `json:"gets"`        // linearizable gets during the run judged
	// Lost: a node's final read lacks an acknowledged put's vector, and
	// no put that may have come after it explains what it shows instead.
	Lost Anomalies[EmbeddingAnomaly] `json:"lost"`
	// Unexpected: a vector no put that may have happened wrote (a failed
	// put, a put invoked after the read, or no put at all).
	Unexpected Anomalies[EmbeddingAnomaly] `json:"unexpected"`
	// Stale: a linearizable get older than a put acknowledged before it
	// began.
	Stale Anomalies[EmbeddingAnomaly] `json:"stale"`
	// Unreplicated: missing on a node whose applied index had not reached
	// the put's: lag, not loss (unknown).
	Unreplicated Anomalies[EmbeddingAnomaly] `json:"unreplicated"`
	// Unread: (node, entity) pairs with a put but no final read (unknown).
	Unread Anomalies[EmbeddingAnomaly] `json:"unread"`
}

type embeddingRead struct {
	p       history.Pair
	hash    string
	applied uint64
}

// Embeddings checks the embeddings workload: every
// acknowledged put is visible in each node's final read of its entity
// (history.GetEmbeddingValue.Local: the per-node reads of
// workload.FinalReads after heal), or superseded by a put that may have
// been applied after it — an acknowledged one that certainly was, or one
// whose outcome is unknown; and no read shows a vector that no put which
// may have happened wrote. Linearizable gets during the run are held to
// the same order: none may show a vector older than a put acknowledged
// before the get began.
//
// A put X is certainly applied before an acknowledged put P if X was
// acknowledged before P was invoked, or both were acknowledged as applied
// (not as duplicates of an earlier attempt) and X's log index is below
// P's. A final read from a node whose applied index is below a missing
// put's index is unreplicated (unknown), not lost.
//
// nodes are the nodes expected to answer final reads; a node with an
// acknowledged or uncertain put's entity left unread makes the verdict
// unknown, and so does a history with no final reads at all (one written
// before the workload made them): never valid by omission.
func Embeddings(ops []history.Op, nodes []string) Result {
	const name = "embeddings"
	pairs, err := history.Pairs(ops)
	if err != nil {
		return unknown(name, "cannot pair the history: %v", err)
	}
	windows, err := FaultWindows(ops)
	if err != nil {
		return unknown(name, "cannot derive fault windows: %v", err)
	}
	d := EmbeddingsDetails{Nodes: append([]string(nil), nodes...), Puts: map[history.Type]int{}}
	sort.Strings(d.Nodes)

	puts := map[uint64][]*EmbeddingPut{} // entity -> puts, failed ones included
	final := map[string]map[uint64]embeddingRead{}
	var gets []embeddingRead
	var getEntities []uint64
	for _, p := range pairs {
		if !p.Invoke.Process.IsClient() {
			continue
		}
		switch p.Invoke.F {
		case history.FPutEmbedding:
			v, err := history.Decode[history.PutEmbeddingValue](p.Invoke)
			if err != nil {
				return unknown(name, "%v", err)
			}
			d.Puts[p.Type()]++
			put := &EmbeddingPut{ID: v.ID, Hash: v.Hash, Outcome: p.Type(), Process: p.Invoke.Process, Node: p.Invoke.Node,
				Invoke: p.Invoke.Index, Start: p.Invoke.Time, End: p.Completion.Time}
			if p.Type() == history.OK {
				put.Seq, put.Term = p.Completion.Seq, p.Completion.Term
				done, err := history.Decode[history.PutEmbeddingValue](p.Completion)
				if err != nil {
					return unknown(name, "%v", err)
				}
				put.Applied = done.Duplicate != nil && !*done.Duplicate && put.Seq > 0
			}
			puts[v.Entity] = append(puts[v.Entity], put)
		case history.FGetEmbedding:
			if p.Type() != history.OK {
				continue
			}
			v, err := history.Decode[history.GetEmbeddingValue](p.Completion)
			if err != nil {
				return unknown(name, "%v", err)
			}
			r := embeddingRead{p: p, hash: v.Hash, applied: v.AppliedIndex}
			if !v.Local {
				gets = append(gets, r)
				getEntities = append(getEntities, v.Entity)
				continue
			}
			if final[p.Invoke.Node] == nil {
				final[p.Invoke.Node] = map[uint64]embeddingRead{}
			}
			final[p.Invoke.Node][v.Entity] = r // the last one wins
		}
	}

	entities := make([]uint64, 0, len(puts))
	for e, ps := range puts {
		live := 0
		for _, p := range ps {
			if p.Outcome != history.Fail {
				live++
			}
		}
		if live > 0 {
			entities = append(entities, e)
			d.Entities++
			if len(ps) == 1 {
				d.WriteOnce++
			}
		}
	}
	sort.Slice(entities, func(i, j int) bool { return entities[i] < entities[j] })

	anomaly := func(entity uint64, r embeddingRead, put *EmbeddingPut) EmbeddingAnomaly {
		return EmbeddingAnomaly{
			Entity: entity, Node: r.p.Invoke.Node, Read: r.hash, ReadInvoke: r.p.Invoke.Index, ReadTime: r.p.Completion.Time,
			AppliedIndex: r.applied, Put: put,
			Faults: faultsAround(windows, r.p.Invoke.Time, r.p.Completion.Time, int64(FaultMargin)),
		}
	}

	// Final reads: every node that was read, and every node expected.
	readNodes := map[string]bool{}
	for _, n := range nodes {
		readNodes[n] = true
	}
	for n := range final {
		readNodes[n] = true
	}
	nodeNames := make([]string, 0, len(readNodes))
	for n := range readNodes {
		nodeNames = append(nodeNames, n)
	}
	sort.Strings(nodeNames)
	for _, n := range nodeNames {
		for _, e := range entities {
			r, ok := final[n][e]
			if !ok {
				d.Unread.add(func() EmbeddingAnomaly { return EmbeddingAnomaly{Entity: e, Node: n} })
				continue
			}
			d.FinalReads++
			kind, put := judgeEmbeddingRead(puts[e], r, true)
			noteEmbedding(&d, kind, func() EmbeddingAnomaly { return anomaly(e, r, put) })
		}
		// Entities read with no put that may have happened: only "none"
		// is right.
		readEntities := make([]uint64, 0, len(final[n]))
		for e := range final[n] {
			readEntities = append(readEntities, e)
		}
		sort.Slice(readEntities, func(i, j int) bool { return readEntities[i] < readEntities[j] })
		for _, e := range readEntities {
			if r := final[n][e]; !hasLivePut(puts[e]) {
				d.FinalReads++
				kind, put := judgeEmbeddingRead(puts[e], r, true)
				noteEmbedding(&d, kind, func() EmbeddingAnomaly { return anomaly(e, r, put) })
			}
		}
	}
	for i, r := range gets {
		d.Gets++
		e := getEntities[i]
		kind, put := judgeEmbeddingRead(puts[e], r, false)
		noteEmbedding(&d, kind, func() EmbeddingAnomaly { return anomaly(e, r, put) })
	}

	bad := d.Lost.Count + d.Unexpected.Count + d.Stale.Count
	switch {
	case bad > 0:
		var parts []string
		first := ""
		for _, c := range []struct {
			what string
			a    Anomalies[EmbeddingAnomaly]
		}{{"lost", d.Lost}, {"unexpected", d.Unexpected}, {"stale", d.Stale}} {
			if c.a.Count == 0 {
				continue
			}
			parts = append(parts, fmt.Sprintf("%d %s", c.a.Count, c.what))
			if first == "" {
				first = c.what + ": " + describeEmbeddingAnomaly(c.a.Examples[0])
			}
		}
		return Result{Name: name, Valid: Invalid, Details: d, Summary: fmt.Sprintf("%s embedding reads; first %s", strings.Join(parts, ", "), first)}
	case len(nodes) == 0:
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no nodes named to expect final reads from"}
	case d.Unread.Count > 0:
		a := d.Unread.Examples[0]
		return Result{Name: name, Valid: Unknown, Details: d, Summary: fmt.Sprintf(
			"%d (node, entity) final reads missing, so those vectors are unchecked; first: entity %d on %s", d.Unread.Count, a.Entity, a.Node)}
	case d.Unreplicated.Count > 0:
		return Result{Name: name, Valid: Unknown, Details: d, Summary: fmt.Sprintf(
			"%d final reads from nodes that had not applied the put yet (lag, not loss); first: %s", d.Unreplicated.Count, describeEmbeddingAnomaly(d.Unreplicated.Examples[0]))}
	case d.Puts[history.OK] == 0:
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no acknowledged embedding puts to check"}
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: fmt.Sprintf(
		"every acknowledged put of %d entities (%d written once) visible or superseded on all %d nodes; %d gets in order",
		d.Entities, d.WriteOnce, len(nodeNames), d.Gets)}
}

type embeddingVerdict int

const (
	embeddingOK embeddingVerdict = iota
	embeddingLost
	embeddingUnexpected
	embeddingStale
	embeddingUnreplicated
)

func noteEmbedding(d *EmbeddingsDetails, kind embeddingVerdict, a func() EmbeddingAnomaly) {
	switch kind {
	case embeddingLost:
		d.Lost.add(a)
	case embeddingUnexpected:
		d.Unexpected.add(a)
	case embeddingStale:
		d.Stale.add(a)
	case embeddingUnreplicated:
		d.Unreplicated.add(a)
	}
}

func hasLivePut(ps []*EmbeddingPut) bool {
	for _, p := range ps {
		if p.Outcome != history.Fail {
			return true
		}
	}
	return false
}

// appliedBefore reports whether put x was certainly applied before the
// acknowledged put p.
func appliedBefore(x, p *EmbeddingPut) bool {
	if x.Outcome != history.OK {
		return false // an unknown outcome may land at any time after its invoke
	}
	return x.End < p.Start || (x.Applied && p.Applied && x.Seq < p.Seq)
}

// judgeEmbeddingRead explains read r of an entity with puts ps. A final
// read (from one node's own state, after heal) must show the newest
// acknowledged put or something that may have come after it; a
// linearizable get during the run must do so only for the puts
// acknowledged before it began, and may not show a put invoked after it
// ended. It returns what is wrong and the put concerned.
func judgeEmbeddingRead(ps []*EmbeddingPut, r embeddingRead, final bool) (embeddingVerdict, *EmbeddingPut) {
	start, end := r.p.Invoke.Time, r.p.Completion.Time
	// The acknowledged puts this read must reflect.
	var owed []*EmbeddingPut
	for _, p := range ps {
		if p.Outcome == history.OK && (final || p.End < start) {
			owed = append(owed, p)
		}
	}
	missing := func(p *EmbeddingPut) embeddingVerdict {
		switch {
		case !final:
			return embeddingStale
		case r.applied < p.Seq:
			// The node had not applied as far as the put's entry (for a
			// duplicate ack, the retry's entry: at or after the vector's).
			return embeddingUnreplicated
		}
		return embeddingLost
	}
	if r.hash == "" {
		if len(owed) > 0 {
			newest := owed[0]
			for _, p := range owed[1:] {
				if p.Seq > newest.Seq {
					newest = p
				}
			}
			return missing(newest), newest
		}
		return embeddingOK, nil
	}
	// The puts whose vector this is, and that may have happened before
	// the read answered.
	var shown []*EmbeddingPut
	var failed *EmbeddingPut
	for _, p := range ps {
		if p.Hash != r.hash {
			continue
		}
		if p.Outcome == history.Fail || (!final && p.Start > end) {
			failed = p
			continue
		}
		shown = append(shown, p)
	}
	if len(shown) == 0 {
		return embeddingUnexpected, failed
	}
	// Some put that shows this vector must not be certainly older than
	// any owed put other than itself.
	var worst *EmbeddingPut
	for _, x := range shown {
		var newer *EmbeddingPut
		for _, p := range owed {
			if p != x && p.Hash != x.Hash && appliedBefore(x, p) {
				newer = p
				break
			}
		}
		if newer == nil {
			return embeddingOK, nil
		}
		worst = newer
	}
	return missing(worst), worst
}

func describeEmbeddingAnomaly(a EmbeddingAnomaly) string {
	read := "no embedding"
	if a.Read != "" {
		read = "vector " + a.Read
	}
	s := fmt.Sprintf("entity %d on %s read %s at %s (applied index %d)", a.Entity, a.Node, read, history.FormatTime(a.ReadTime), a.AppliedIndex)
	if a.Put != nil {
		s += fmt.Sprintf("; put %s (vector %s, %s", a.Put.ID, a.Put.Hash, a.Put.Outcome)
		if a.Put.Outcome == history.OK {
			s += fmt.Sprintf(" by %s seq %d term %d at %s", a.Put.Node, a.Put.Seq, a.Put.Term, history.FormatTime(a.Put.End))
		}
		s += ")"
	}
	if len(a.Faults) > 0 {
		s += ", near " + a.Faults[0].Label()
	}
	return s
}
