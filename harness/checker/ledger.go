package checker

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// AuditEntry is one line of a node's GET /v1/audit/events: an applied
// event id and where it landed.
type AuditEntry struct {
	ID     string `json:"id"`
	Index  uint64 `json:"index"`
	Term   uint64 `json:"term"`
	Entity uint64 `json:"entity"`
	Signal string `json:"signal"`
}

// ReadAudit parses the NDJSON body of /v1/audit/events (or the copy the
// run store keeps), with errors naming the line.
func ReadAudit(r io.Reader) ([]AuditEntry, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	var out []AuditEntry
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if len(b) > 0 && !(len(b) == 1 && b[0] == '\n') {
			var e AuditEntry
			if jerr := json.Unmarshal(b, &e); jerr != nil {
				return out, fmt.Errorf("audit line %d: expected {id,index,term,entity,signal}: %w", line, jerr)
			}
			if e.ID == "" {
				return out, fmt.Errorf("audit line %d: expected a non-empty id, found %s", line, b)
			}
			out = append(out, e)
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("audit line %d: %w", line, err)
		}
	}
}

// FaultMargin is how far around an anomaly the checkers look for faults
// to blame.
const FaultMargin = 5 * time.Second

// Anomalies counts every instance of one kind and lists the first few, in
// history order.
type Anomalies[T any] struct {
	Count    int `json:"count"`
	Examples []T `json:"examples,omitempty"`
}

func (a *Anomalies[T]) add(example func() T) {
	a.Count++
	if len(a.Examples) < maxExamples {
		a.Examples = append(a.Examples, example())
	}
}

// Ack is how a write was acknowledged.
type Ack struct {
	Node string `json:"node"`
	Seq  uint64 `json:"seq"`
	Term uint64 `json:"term"`
	Time int64  `json:"time"` // history time of the ok
}

// WriteRef names the write an event id belonged to.
type WriteRef struct {
	ID      string          `json:"id"`
	Process history.Process `json:"process"`
	Invoke  int64           `json:"invoke"` // index of the invoke op
	Node    string          `json:"node"`   // the node the client sent it to
	Time    int64           `json:"time"`   // history time of the invoke
}

// LostWrite is an acknowledged event id missing from at least one node.
type LostWrite struct {
	WriteRef
	Ack       Ack           `json:"ack"`
	MissingOn []string      `json:"missing_on"`
	PresentOn []string      `json:"present_on,omitempty"`
	Faults    []FaultWindow `json:"faults,omitempty"` // active within FaultMargin of invoke..ack
	// State, when the nodes' applied state was read (EntityCounts): what
	// it says of the id's entity and signal on each node missing it,
	// "n3: 7 view events applied on entity 12, 9 acknowledged".
	State []string `json:"state,omitempty"`
}

// EntityCounts is one node's applied state as the ledger audits it: per
// entity, the count of events of each signal (GET /v1/entities/{id} with
// consistency=local, read after the cluster quiesced). It is independent
// of the id memory that GET /v1/audit/events reads, so it tells a write
// that was never applied from one whose id the memory does not hold. An
// entity absent from the map was not read.
type EntityCounts map[uint64]map[string]uint64

// MemoryGap is a node whose id memory (its audit) names fewer events of
// the entities read than its applied state holds.
type MemoryGap struct {
	Node       string `json:"node"`
	Remembered uint64 `json:"remembered"` // audit entries on the entities read
	Applied    uint64 `json:"applied"`    // events the entities' counts hold
}

// LandedWrite is an event id found on the nodes (recovered, divergent or
// failed-but-applied).
type LandedWrite struct {
	WriteRef
	Outcome   history.Type `json:"outcome"`
	Index     uint64       `json:"index"`
	PresentOn []string     `json:"present_on"`
	MissingOn []string     `json:"missing_on,omitempty"`
}

// DuplicatedID is an event id applied more than once on a node, or at
// different log indexes on different nodes.
type DuplicatedID struct {
	ID      string              `json:"id"`
	Reason  string              `json:"reason"` // "twice-on-node" or "index-mismatch"
	Indexes map[string][]uint64 `json:"indexes"`
}

// UnexpectedID is an applied event id no client ever sent.
type UnexpectedID struct {
	ID    string   `json:"id"`
	Index uint64   `json:"index"`
	Nodes []string `json:"nodes"`
}

// AckMismatch is an ok write, sent once, whose ack names a log index
// other than the one its id landed at. When the ack said none of its
// events were duplicates (X-Tidal-Duplicates 0, recorded in the ok's
// value) the node applied the events at the ack's index while the audit
// holds them at another: the write was proposed and applied twice, and
// the result is INVALID. An ack that counted duplicates (a retry inside
// the op, deduplicated at its second entry), or a history that did not
// record them, is informational.
type AckMismatch struct {
	WriteRef
	Ack   Ack    `json:"ack"`
	Index uint64 `json:"index"`
	// Duplicates is what the ack said, -1 when the history did not record
	// it.
	Duplicates int `json:"duplicates"`
}

// LedgerDetails is the Details of a Ledger result.
type LedgerDetails struct {
	Nodes []string `json:"nodes"` // audited
	// Removed were removed from the membership for good: not expected to
	// hold writes, and their audits, if any, are ignored.
	Removed []string `json:"removed,omitempty"`
	// Missing are nodes that should have been audited and were not (the
	// audit could not be read, or the node crashed): the ledger cannot
	// vouch for them.
	Missing   []MissingNode           `json:"missing,omitempty"`
	Outcomes  map[history.Type]int    `json:"outcomes"` // write ops by outcome
	IDs       int                     `json:"ids"`      // distinct event ids sent
	Acked     int                     `json:"acked"`    // ids with an ok write
	Lost      Anomalies[LostWrite]    `json:"lost"`
	Dup       Anomalies[DuplicatedID] `json:"duplicated"`
	Unexp     Anomalies[UnexpectedID] `json:"unexpected"`
	Recovered Anomalies[LandedWrite]  `json:"recovered"`          // info writes that landed everywhere
	NotLanded int                     `json:"info_not_applied"`   // info writes found nowhere
	FailedApp Anomalies[LandedWrite]  `json:"failed_but_applied"` // fail writes found somewhere
	Divergent Anomalies[LandedWrite]  `json:"divergent"`          // unacked ids on some nodes only
	// Unreplicated are acknowledged ids missing only on nodes whose applied
	// index (from LedgerAt) is below the write's index: those nodes never
	// caught up, so the write cannot be judged there. Unknown, not
	// invalid — the lag and convergence checkers judge the node's liveness.
	Unreplicated Anomalies[LostWrite]   `json:"unreplicated"`
	Applied      map[string]uint64      `json:"applied,omitempty"`  // each node's applied index when audited
	AckIndex     Anomalies[AckMismatch] `json:"ack_index_mismatch"` // informational: the ack counted duplicates, or did not say
	// DoubleApplied are ack index mismatches of once-sent writes whose
	// ack counted no duplicates: applied twice. Invalid.
	DoubleApplied Anomalies[AckMismatch] `json:"double_applied"`
	// MemoryShort are acknowledged ids missing from the audit (the id
	// memory) of nodes whose applied state holds at least every
	// acknowledged event of the id's entity and signal: the id memory is
	// missing or smaller than the applied state, which is not a lost
	// write. Unknown: exactly-once cannot be vouched for those ids.
	MemoryShort Anomalies[LostWrite] `json:"memory_short"`
	// MemoryGaps: nodes whose audit names fewer events than their
	// applied state holds, over the entities read.
	MemoryGaps []MemoryGap   `json:"memory_gaps,omitempty"`
	Faults     []FaultWindow `json:"faults,omitempty"`
}

// ledgerID is what the checker knows about one event id.
type ledgerID struct {
	pair    int32 // the write that decides its outcome (first ok, else first info, else first fail)
	outcome history.Type
	sends   int32  // how many write ops carried it
	seen    uint64 // bit per audited node that holds it
	index   uint64 // index on the first node it was seen on
	dup     bool   // twice on one node
	diverge bool   // different indexes on different nodes
	key     stateKey
}

// stateKey is what the applied state counts an event under: its entity
// and signal. A counter add's signal is not in the history; its key has
// signal "" and counts every signal of the entity (counter keys carry one
// signal only).
type stateKey struct {
	entity uint64
	signal string
}

// count is how many events state holds under k; ok false when k's entity
// was not read.
func (k stateKey) count(state EntityCounts) (uint64, bool) {
	sigs, ok := state[k.entity]
	if !ok {
		return 0, false
	}
	if k.signal != "" {
		return sigs[k.signal], true
	}
	var n uint64
	for _, c := range sigs {
		n += c
	}
	return n, true
}

// writeKeys returns the state keys of the event ids a client op sends, in
// the order writeIDs returns the ids.
func writeKeys(op history.Op) []stateKey {
	switch op.F {
	case history.FWrite:
		v, err := history.Decode[history.WriteValue](op)
		if err != nil {
			return nil
		}
		keys := make([]stateKey, len(v.Events))
		for i, e := range v.Events {
			keys[i] = stateKey{entity: e.Entity, signal: e.Signal}
		}
		return keys
	case history.FAdd:
		v, err := history.Decode[history.AddValue](op)
		if err != nil {
			return nil
		}
		keys := make([]stateKey, len(v.IDs))
		for i := range keys {
			keys[i] = stateKey{entity: v.Key}
		}
		return keys
	}
	return nil
}

// ackDuplicates is the X-Tidal-Duplicates an ok write recorded, -1 when
// its value does not say.
func ackDuplicates(ok history.Op) int {
	var v struct {
		Duplicates *int `json:"duplicates"`
	}
	if len(ok.Value) == 0 || json.Unmarshal(ok.Value, &v) != nil || v.Duplicates == nil {
		return -1
	}
	return *v.Duplicates
}

func outcomeRank(t history.Type) int {
	switch t {
	case history.OK:
		return 3
	case history.Info:
		return 2
	case history.Fail:
		return 1
	}
	return 0
}

// writeIDs returns the event ids a client op sends: the events of a
// ledger write, the ids of a counter add.
func writeIDs(op history.Op) ([]string, bool, error) {
	switch op.F {
	case history.FWrite:
		v, err := history.Decode[history.WriteValue](op)
		if err != nil {
			return nil, true, err
		}
		ids := make([]string, len(v.Events))
		for i, e := range v.Events {
			ids[i] = e.ID
		}
		return ids, true, nil
	case history.FAdd:
		v, err := history.Decode[history.AddValue](op)
		return v.IDs, true, err
	}
	return nil, false, nil
}

// Ledger checks that every acknowledged write is present exactly once on
// every audited node after the cluster healed and quiesced, and accounts
// for everything else that landed.
//
// audits maps node name to that node's /v1/audit/events; the nodes it
// holds are the nodes checked. Nodes in removed were removed from the
// membership for good and are not expected to hold writes; their audits,
// if any, are ignored. Invalid on any lost, duplicated, unexpected,
// failed-but-applied or divergent (present on some nodes only) id. It
// assumes event ids are unique per write, as the workloads generate them;
// a retry reuses the ids of the write it retries.
func Ledger(ops []history.Op, audits map[string][]AuditEntry, removed []string) Result {
	return LedgerCovering(ops, audits, nil, Coverage{Removed: removed})
}

// LedgerAt is Ledger knowing each audited node's applied index when it
// was audited (from /v1/audit/digest): an acknowledged id missing only on
// nodes that had not applied as far as the write is reported as
// unreplicated (verdict unknown) instead of lost, so that a node that
// never caught up reads as what it is.
func LedgerAt(ops []history.Op, audits map[string][]AuditEntry, applied map[string]uint64, removed []string) Result {
	return LedgerCovering(ops, audits, applied, Coverage{Removed: removed})
}

// LedgerCovering is LedgerAt over the nodes cov names: a node of
// cov.Nodes with no audit that was not removed for good makes the result
// Unknown (the audit could not be read: the writes on it are unchecked),
// or Invalid when the node crashed — never Valid by leaving it out. The
// audited nodes are still checked, and anything wrong on them is Invalid.
func LedgerCovering(ops []history.Op, audits map[string][]AuditEntry, applied map[string]uint64, cov Coverage) Result {
	return LedgerWithState(ops, audits, applied, cov, nil)
}

// LedgerWithState is LedgerCovering that also audits the applied state:
// state holds, per node, the event counts of the entities read. An
// acknowledged id missing from a node's audit is lost only when that
// node's applied state holds fewer events of the id's entity and signal
// than were acknowledged (or the entity was not read); when it holds at
// least as many, the id memory the audit reads is missing or smaller than
// the applied state (MemoryShort, unknown), not a lost write. nil state
// judges the audits alone.
func LedgerWithState(ops []history.Op, audits map[string][]AuditEntry, applied map[string]uint64, cov Coverage, state map[string]EntityCounts) Result {
	const name = "ledger"
	pairs, err := history.Pairs(ops)
	if err != nil {
		return unknown(name, "cannot pair the history: %v", err)
	}
	windows, err := FaultWindows(ops)
	if err != nil {
		return unknown(name, "cannot derive fault windows: %v", err)
	}
	d := LedgerDetails{Outcomes: map[history.Type]int{}, Faults: windows}

	sampled := make([]string, 0, len(audits))
	for n := range audits {
		sampled = append(sampled, n)
	}
	d.Nodes, d.Missing = cov.split(sampled)
	d.Removed = slices.Sorted(slices.Values(cov.Removed))
	missingValid, missingSummary := missingVerdict("audit", d.Missing)
	if len(d.Nodes) == 0 {
		s := "no node was audited"
		if missingSummary != "" {
			s += ": " + missingSummary
		}
		v := Unknown
		if missingValid == Invalid {
			v = Invalid
		}
		return Result{Name: name, Valid: v, Summary: s, Details: d}
	}
	if len(d.Nodes) > 64 {
		return unknown(name, "audited %d nodes; the checker handles at most 64", len(d.Nodes))
	}
	all := uint64(1)<<len(d.Nodes) - 1

	// What the clients sent, and the best outcome each id got.
	ids := make(map[string]*ledgerID)
	var order []string // ids in first-send order, for deterministic examples
	for i, p := range pairs {
		if !p.Invoke.Process.IsClient() {
			continue
		}
		sent, isWrite, err := writeIDs(p.Invoke)
		if err != nil {
			return unknown(name, "%v", err)
		}
		if !isWrite {
			continue
		}
		d.Outcomes[p.Type()]++
		keys := writeKeys(p.Invoke)
		for j, id := range sent {
			li := ids[id]
			if li == nil {
				li = &ledgerID{pair: int32(i), outcome: p.Type()}
				if j < len(keys) {
					li.key = keys[j]
				}
				ids[id] = li
				order = append(order, id)
			} else if outcomeRank(p.Type()) > outcomeRank(li.outcome) {
				li.pair, li.outcome = int32(i), p.Type()
			}
			li.sends++
		}
	}
	d.IDs = len(ids)

	// What the nodes applied.
	unexpected := make(map[string]*ledgerID)
	var unexpOrder []string
	for b, n := range d.Nodes {
		bit := uint64(1) << b
		for _, e := range audits[n] {
			li := ids[e.ID]
			if li == nil {
				if li = unexpected[e.ID]; li == nil {
					li = &ledgerID{}
					unexpected[e.ID] = li
					unexpOrder = append(unexpOrder, e.ID)
				}
			}
			switch {
			case li.seen&bit != 0:
				li.dup = true
			case li.seen == 0:
				li.index = e.Index
			case li.index != e.Index:
				li.diverge = true
			}
			li.seen |= bit
		}
	}

	nodesOf := func(mask uint64) []string {
		out := make([]string, 0, bits.OnesCount64(mask))
		for b, n := range d.Nodes {
			if mask&(1<<b) != 0 {
				out = append(out, n)
			}
		}
		return out
	}
	ref := func(id string, p history.Pair) WriteRef {
		return WriteRef{ID: id, Process: p.Invoke.Process, Invoke: p.Invoke.Index, Node: p.Invoke.Node, Time: p.Invoke.Time}
	}
	ackOf := func(p history.Pair) Ack {
		c := p.Completion
		return Ack{Node: c.Node, Seq: c.Seq, Term: c.Term, Time: c.Time}
	}
	// A node whose applied index is below a write's index has not applied
	// that far; an id missing only on such nodes is unreplicated, not
	// lost. Without applied indexes every node counts as caught up.
	d.Applied = applied
	behindOnly := func(missing uint64, index uint64) bool {
		if index == 0 || applied == nil {
			return false
		}
		for _, n := range nodesOf(missing) {
			if a, ok := applied[n]; !ok || a >= index {
				return false
			}
		}
		return true
	}
	// The applied state: acknowledged events per state key, and whether a
	// node's counts cover every acknowledged event of a key.
	ackedOf := map[stateKey]uint64{}
	// remembered counts each node's audit entries per state key (and per
	// entity under signal "").
	remembered := map[string]map[stateKey]uint64{}
	if state != nil {
		for _, n := range d.Nodes {
			m := map[stateKey]uint64{}
			for _, e := range audits[n] {
				m[stateKey{entity: e.Entity, signal: e.Signal}]++
				m[stateKey{entity: e.Entity}]++
			}
			remembered[n] = m
		}
		for _, id := range order {
			if li := ids[id]; li.outcome == history.OK {
				ackedOf[li.key]++
			}
		}
		d.MemoryGaps = memoryGaps(d.Nodes, audits, state)
	}
	// stateShort says, for each node of missing where k's acknowledged
	// events cannot be put down to a short id memory, why: its counts hold
	// fewer events than were acknowledged, it remembers every event it
	// holds (so the id is not applied), or its entity was not read. Empty:
	// on every such node the counts cover the acknowledged events and the
	// memory names fewer events than the counts hold.
	stateShort := func(missing []string, k stateKey) []string {
		var out []string
		for _, n := range missing {
			c, read := k.count(state[n])
			switch {
			case state[n] == nil || !read:
				out = append(out, fmt.Sprintf("%s: entity %d not read", n, k.entity))
			case c < ackedOf[k]:
				out = append(out, fmt.Sprintf("%s: %d %s events applied on entity %d, %d acknowledged", n, c, signalName(k), k.entity, ackedOf[k]))
			case remembered[n][k] >= c:
				out = append(out, fmt.Sprintf("%s: its id memory names all %d %s events applied on entity %d", n, c, signalName(k), k.entity))
			}
		}
		return out
	}
	dupIDs := map[string]string{} // example id -> reason
	for _, id := range order {
		li := ids[id]
		p := pairs[li.pair]
		landed := func() LandedWrite {
			return LandedWrite{WriteRef: ref(id, p), Outcome: li.outcome, Index: li.index, PresentOn: nodesOf(li.seen), MissingOn: nodesOf(all &^ li.seen)}
		}
		if li.dup || li.diverge {
			reason := "index-mismatch"
			if li.dup {
				reason = "twice-on-node"
			}
			d.Dup.add(func() DuplicatedID { dupIDs[id] = reason; return DuplicatedID{ID: id, Reason: reason} })
		}
		switch li.outcome {
		case history.OK:
			d.Acked++
			if li.seen != all && behindOnly(all&^li.seen, max(li.index, p.Completion.Seq)) {
				d.Unreplicated.add(func() LostWrite {
					return LostWrite{WriteRef: ref(id, p), Ack: ackOf(p), MissingOn: nodesOf(all &^ li.seen), PresentOn: nodesOf(li.seen),
						Faults: faultsAround(windows, p.Invoke.Time, p.Completion.Time, int64(FaultMargin))}
				})
			} else if li.seen != all {
				missing := nodesOf(all &^ li.seen)
				lw := func() LostWrite {
					return LostWrite{WriteRef: ref(id, p), Ack: ackOf(p), MissingOn: missing, PresentOn: nodesOf(li.seen),
						Faults: faultsAround(windows, p.Invoke.Time, p.Completion.Time, int64(FaultMargin))}
				}
				var short []string
				if state != nil {
					short = stateShort(missing, li.key)
				}
				if state != nil && len(short) == 0 {
					d.MemoryShort.add(lw)
				} else {
					d.Lost.add(func() LostWrite { w := lw(); w.State = short; return w })
				}
			}
			if li.seen != 0 && li.sends == 1 && p.Completion.Seq != 0 && p.Completion.Seq != li.index {
				m := func() AckMismatch {
					return AckMismatch{WriteRef: ref(id, p), Ack: ackOf(p), Index: li.index, Duplicates: ackDuplicates(p.Completion)}
				}
				if ackDuplicates(p.Completion) == 0 {
					d.DoubleApplied.add(m)
				} else {
					d.AckIndex.add(m)
				}
			}
		case history.Info:
			switch li.seen {
			case 0:
				d.NotLanded++
			case all:
				d.Recovered.add(landed)
			default:
				if !behindOnly(all&^li.seen, li.index) {
					d.Divergent.add(landed)
				}
			}
		case history.Fail:
			if li.seen != 0 {
				d.FailedApp.add(landed)
			}
		}
	}
	for _, id := range unexpOrder {
		li := unexpected[id]
		d.Unexp.add(func() UnexpectedID { return UnexpectedID{ID: id, Index: li.index, Nodes: nodesOf(li.seen)} })
		if li.dup || li.diverge {
			d.Dup.add(func() DuplicatedID {
				reason := "index-mismatch"
				if li.dup {
					reason = "twice-on-node"
				}
				dupIDs[id] = reason
				return DuplicatedID{ID: id, Reason: reason}
			})
		}
	}
	// Second pass over the audits, only for the listed duplicates: every
	// index each node holds them at.
	if len(dupIDs) > 0 {
		idx := map[string]map[string][]uint64{}
		for _, n := range d.Nodes {
			for _, e := range audits[n] {
				if _, ok := dupIDs[e.ID]; ok {
					if idx[e.ID] == nil {
						idx[e.ID] = map[string][]uint64{}
					}
					idx[e.ID][n] = append(idx[e.ID][n], e.Index)
				}
			}
		}
		for i := range d.Dup.Examples {
			d.Dup.Examples[i].Indexes = idx[d.Dup.Examples[i].ID]
		}
	}

	valid := Valid
	// "Every acknowledged write survived" holds for none: a run whose
	// writes were never acknowledged has nothing of durability to vouch
	// for.
	if d.Unreplicated.Count > 0 || d.MemoryShort.Count > 0 || d.Acked == 0 {
		valid = Unknown
	}
	if missingValid != Valid {
		valid = missingValid
	}
	if d.Lost.Count+d.Dup.Count+d.Unexp.Count+d.FailedApp.Count+d.Divergent.Count+d.DoubleApplied.Count > 0 {
		valid = Invalid
	}
	summary := ledgerSummary(&d)
	if missingSummary != "" {
		summary = missingSummary + "; on the audited nodes: " + summary
	}
	return Result{Name: name, Valid: valid, Summary: summary, Details: d}
}

func ledgerSummary(d *LedgerDetails) string {
	var parts []string
	if d.Lost.Count > 0 {
		l := d.Lost.Examples[0]
		s := fmt.Sprintf("%d of %d acknowledged ids lost; first: %s acked by %s seq %d term %d at %s, missing on %s",
			d.Lost.Count, d.Acked, l.ID, l.Ack.Node, l.Ack.Seq, l.Ack.Term, history.FormatTime(l.Ack.Time), strings.Join(l.MissingOn, ","))
		if len(l.Faults) > 0 {
			labels := make([]string, len(l.Faults))
			for i, w := range l.Faults {
				labels[i] = w.Label()
			}
			s += ", near " + strings.Join(labels, ", ")
		}
		if len(l.State) > 0 {
			s += "; applied state: " + strings.Join(l.State, ", ")
		}
		parts = append(parts, s)
	}
	if d.DoubleApplied.Count > 0 {
		m := d.DoubleApplied.Examples[0]
		parts = append(parts, fmt.Sprintf("%d once-sent writes acknowledged at another index than where they landed, with no duplicates in the ack (applied twice: a double proposal); first: %s acked by %s at seq %d, found at index %d",
			d.DoubleApplied.Count, m.ID, m.Ack.Node, m.Ack.Seq, m.Index))
	}
	if d.MemoryShort.Count > 0 {
		l := d.MemoryShort.Examples[0]
		gaps := make([]string, 0, len(d.MemoryGaps))
		for _, g := range d.MemoryGaps {
			gaps = append(gaps, fmt.Sprintf("%s remembers %d ids, its applied state holds %d events", g.Node, g.Remembered, g.Applied))
		}
		s := fmt.Sprintf("the id memory is missing or smaller than the applied state: %d acknowledged ids absent from the audit (GET /v1/audit/events) of nodes whose entity counts hold every acknowledged event (not lost writes, but exactly-once is unchecked for them); first: %s missing on %s",
			d.MemoryShort.Count, l.ID, strings.Join(l.MissingOn, ","))
		if len(gaps) > 0 {
			s += " (" + strings.Join(gaps, "; ") + ")"
		}
		parts = append(parts, s)
	}
	if d.Unreplicated.Count > 0 {
		l := d.Unreplicated.Examples[0]
		ends := make([]string, 0, len(l.MissingOn))
		for _, n := range l.MissingOn {
			ends = append(ends, fmt.Sprintf("%s applied only to index %d", n, d.Applied[n]))
		}
		parts = append(parts, fmt.Sprintf("%d acknowledged ids not yet on nodes that never caught up (%s); first: %s acked at seq %d — judge the node with the lag and convergence checkers",
			d.Unreplicated.Count, strings.Join(ends, ", "), l.ID, l.Ack.Seq))
	}
	if d.Dup.Count > 0 {
		e := d.Dup.Examples[0]
		parts = append(parts, fmt.Sprintf("%d ids applied twice; first: %s (%s) %v", d.Dup.Count, e.ID, e.Reason, e.Indexes))
	}
	if d.FailedApp.Count > 0 {
		e := d.FailedApp.Examples[0]
		parts = append(parts, fmt.Sprintf("%d ids of failed writes were applied; first: %s at index %d on %s", d.FailedApp.Count, e.ID, e.Index, strings.Join(e.PresentOn, ",")))
	}
	if d.Divergent.Count > 0 {
		e := d.Divergent.Examples[0]
		parts = append(parts, fmt.Sprintf("%d unacknowledged ids landed on some nodes only; first: %s on %s, not on %s", d.Divergent.Count, e.ID, strings.Join(e.PresentOn, ","), strings.Join(e.MissingOn, ",")))
	}
	if d.Unexp.Count > 0 {
		e := d.Unexp.Examples[0]
		parts = append(parts, fmt.Sprintf("%d ids applied that no client sent; first: %s at index %d", d.Unexp.Count, e.ID, e.Index))
	}
	if len(parts) == 0 && d.Acked == 0 {
		return fmt.Sprintf("no write was acknowledged: nothing to check (%d ids sent; %d info writes recovered, %d not applied)",
			d.IDs, d.Recovered.Count, d.NotLanded)
	}
	if len(parts) == 0 {
		s := fmt.Sprintf("all %d acknowledged ids present once on %s; %d info writes recovered, %d not applied",
			d.Acked, strings.Join(d.Nodes, ","), d.Recovered.Count, d.NotLanded)
		if len(d.Removed) > 0 {
			s += "; removed for good, not audited: " + strings.Join(d.Removed, ",")
		}
		return s
	}
	return strings.Join(parts, "; ")
}

func signalName(k stateKey) string {
	if k.signal == "" {
		return "counter"
	}
	return k.signal
}

// memoryGaps compares, per node, the audit entries on the entities read
// with the events their counts hold.
func memoryGaps(nodes []string, audits map[string][]AuditEntry, state map[string]EntityCounts) []MemoryGap {
	var out []MemoryGap
	for _, n := range nodes {
		st := state[n]
		if st == nil {
			continue
		}
		g := MemoryGap{Node: n}
		for _, e := range audits[n] {
			if _, read := st[e.Entity]; read {
				g.Remembered++
			}
		}
		for _, sigs := range st {
			for _, c := range sigs {
				g.Applied += c
			}
		}
		if g.Remembered < g.Applied {
			out = append(out, g)
		}
	}
	return out
}
