package checker

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/harness/history"
)

// Disk faults as the nemesis records them (harness/nemesis, disk.go): f
// "disk", Kind the faultfs kind, Targets the nodes whose disks it acts on,
// Params the faultfs.Faults it armed.
const (
	fDisk           = history.FDisk
	diskFsyncError  = "fsync-error"
	diskFull        = "disk-full"
	diskCorruptRead = "corrupt-read"
	diskStall       = "slow-disk-stall"
)

// diskParams mirrors the parts of faultfs.Faults (harness/faultfs) the
// fencing checker reads; the checker stays free of the FUSE package.
type diskParams struct {
	FsyncError *struct {
		Path   string `json:"path"`
		After  int    `json:"after"`
		Sticky bool   `json:"sticky"`
	} `json:"fsync_error"`
	DiskFull *struct {
		FreeBytes       int64 `json:"free_bytes"`
		CountOverwrites bool  `json:"count_overwrites"`
	} `json:"disk_full"`
	SlowDisk []struct {
		Ops        []string `json:"ops"`
		Stall      bool     `json:"stall"`
		MaxStallMS float64  `json:"max_stall_ms"`
	} `json:"slow_disk"`
	// Effect is, in a heal's ok, what the fault did to each target.
	Effect map[string]DiskEffect `json:"effect"`
}

// DiskEffect is what a disk fault did to a node's disk between its arming
// and its heal (the nemesis records faultfs's counter deltas): zero
// everywhere means the fault never bit.
type DiskEffect struct {
	FsyncEIO     uint64 `json:"fsync_eio,omitempty"`
	LostBytes    uint64 `json:"lost_bytes,omitempty"`
	ENOSPC       uint64 `json:"enospc,omitempty"`
	Stalled      uint64 `json:"stalled,omitempty"`
	Delayed      uint64 `json:"delayed,omitempty"`
	CorruptReads uint64 `json:"corrupt_reads,omitempty"`
	CorruptBytes uint64 `json:"corrupt_bytes,omitempty"`
}

// walSegment is a path a WAL segment has in a node's data dir, to match
// an fsync-error's glob against.
const walSegment = "wal/0000000000000000.wal"

// DiskAck is a write a node acknowledged while every fsync it could make
// was failing: the node carried on after its fsync failed.
type DiskAck struct {
	Node      string `json:"node"`
	Fault     string `json:"fault"`      // the fault window, as FaultWindow.String
	Effective int64  `json:"effective"`  // when the fault took effect
	Index     int64  `json:"index"`      // the ack's history index
	F         string `json:"f"`          // write, add, put-embedding
	Invoked   int64  `json:"invoked"`    // history time of the invoke
	Acked     int64  `json:"acked"`      // history time of the ok
	Seq       uint64 `json:"seq"`        // log index the node answered with
	Term      uint64 `json:"term"`       //
	Process   int    `json:"process"`    //
	FirstID   string `json:"first_id"`   // an id of the write, to find it in the audit
	FaultOpen bool   `json:"fault_open"` // the fault was never healed
}

// DiskExit is a process exit of a node during a disk fault on it.
type DiskExit struct {
	Node   string `json:"node"`
	Fault  string `json:"fault"`
	Time   int64  `json:"time"`
	Status string `json:"status"`
	// Fenced: exit status 4, the node stopped itself after a failed
	// write or fsync. NamesDamage: its log names a corrupt file and
	// offset.
	Fenced      bool   `json:"fenced,omitempty"`
	NamesDamage string `json:"names_damage,omitempty"`
}

// FencingWindow is one disk fault on one node, as the fencing checker
// judged it.
type FencingWindow struct {
	Node  string `json:"node"`
	Fault string `json:"fault"`
	Kind  string `json:"kind"`
	// Judged: an fsync-error window whose fault fails every fsync of the
	// WAL from the moment it took effect (false when After > 0, not
	// sticky, a path glob that misses the WAL, or it never confirmed
	// taking effect; Why says which), a disk-full window that leaves no
	// byte to write, overwrites included (every WAL append fails), or a
	// corrupt-read window (its exits are judged).
	Judged bool   `json:"judged"`
	Why    string `json:"why,omitempty"`
	// Effect is what the fault did to the node's disk, from the heal's
	// record (nil when the heal did not record it, e.g. heal-all).
	Effect *DiskEffect `json:"effect,omitempty"`
	// Writes counts client writes sent to the node after the fault took
	// effect and before its heal's invoke; Refused those that did not end
	// ok before the heal's invoke (refused, timed out, or answered only
	// after the heal).
	Writes  int `json:"writes"`
	Refused int `json:"refused"`
	Acked   int `json:"acked"`
}

// FencingDetails is the Details of a Fencing result.
type FencingDetails struct {
	Windows []FencingWindow `json:"windows"`
	// Acks are the writes acknowledged by a node whose every fsync was
	// failing (the first maxExamples; Acked in each window counts all).
	Acks  []DiskAck  `json:"acks,omitempty"`
	Exits []DiskExit `json:"exits,omitempty"`
	// Silent are exits under corrupt-read whose log does not say which
	// file and offset were damaged.
	Silent []DiskExit `json:"silent,omitempty"`
}

// Fencing judges what nodes did under disk faults.
//
// fsync-error: once a sticky fault failing every fsync of the node's WAL
// has taken effect on node X (the nemesis' ok), X cannot make anything
// durable. A tidal node applies an entry only after its own WAL synced
// it, and answers a write only once it applied it, so X must not
// acknowledge any write (write, add, put-embedding) that was invoked
// after the fault took effect and completed before the heal's invoke —
// every log entry that write could produce was staged at X after the
// fault and needed a successful fdatasync there. Such an ack is a node
// that carried on after a failed fsync: Invalid, each listed with its
// seq and term. A node that fenced itself (exit status 4) or refused
// the writes is what should happen. A fault whose shape lets some fsyncs
// succeed (After > 0, not sticky, a glob that misses wal/*.wal) is not
// judged by this rule.
//
// corrupt-read: a node that reads its log back corrupt must not serve
// it: it either stops, with an error naming the file and offset, or
// recovers from its peers. An exit of X during the fault whose log does
// not name a damaged file and offset is Invalid (a refusal nobody can act
// on). If X keeps serving, the ledger, convergence and aggregates
// checkers judge what it served.
//
// slow-disk-stall: while the node's WAL writes or fsyncs are held, it
// cannot make an entry durable either: the same rule, until the heal's
// invoke (the writes it held complete after the heal, and count for
// nothing here). It shows the node stopped acknowledging; the others
// carry on (availability), and it catches up (convergence, lag).
//
// disk-full: with no byte left, overwrites included (free_bytes 0,
// count_overwrites: what the nemesis arms), every WAL append of the node
// fails with ENOSPC from the moment the fault took effect, so the
// fsync-error rule applies as is: no write invoked after that and
// completed before the heal may be acknowledged by it, and it should
// fence (exit 4). A disk-full that leaves room, or lets appends into
// preallocated space through, is not judged; its exits are listed.
//
// The verdict is Unknown when no judged fsync-error window saw a write
// sent to its node and no corrupt-read took effect: no rule was
// exercised. Runs with disk-full alone do not run this checker
// (DiskFaulted).
func Fencing(ops []history.Op, ev NodeEvidence) Result {
	const name = "fencing"
	windows, faults, heals, err := faultWindows(ops)
	if err != nil {
		return unknown(name, "cannot pair the nemesis ops: %v", err)
	}
	healInvoke := healInvokes(heals)
	effects := healEffects(heals)
	var last int64
	if len(ops) > 0 {
		last = ops[len(ops)-1].Time
	}
	pairs, err := history.Pairs(ops)
	if err != nil {
		return unknown(name, "cannot pair the client ops: %v", err)
	}

	d := FencingDetails{}
	exercised := 0
	totalAcked := 0
	for i, w := range windows {
		if w.F != fDisk || (w.Kind != diskFsyncError && w.Kind != diskFull && w.Kind != diskCorruptRead && w.Kind != diskStall) {
			continue
		}
		// The fault is certainly in effect from its ok to its heal's
		// invoke (the heal may clear it at any moment after that).
		until := last
		if w.Healed {
			until = healInvoke[w.End]
		}
		for _, node := range w.Targets {
			fw := FencingWindow{Node: node, Fault: w.String(), Kind: w.Kind}
			if w.Healed {
				if e, ok := effects[w.End][node]; ok {
					fw.Effect = &e
				}
			}
			for _, e := range ev.Exits {
				if e.Node != node || e.Requested || e.Time < w.Start || e.Time > w.End+diskExitGrace {
					continue
				}
				de := DiskExit{Node: node, Fault: w.String(), Time: e.Time, Status: e.Status.Text,
					Fenced: e.Status.Signal == "" && e.Status.Code == ExitFenced, NamesDamage: namedDamage(e.Logs)}
				d.Exits = append(d.Exits, de)
				if w.Kind == diskCorruptRead && de.NamesDamage == "" {
					d.Silent = append(d.Silent, de)
				}
			}
			// What faultfs counted on this node: a fault that did
			// nothing exercised no rule, whatever the nemesis' ok said.
			one := w
			one.Targets = []string{node}
			fe := diskFaultEffect(one, faults[i].Completion, effects, ev.Disks)
			idle := fe.known && !fe.bit
			if w.Kind == diskCorruptRead {
				// A corrupt-read that took effect restarted its node
				// on a corrupt view: it either refused (its exit is
				// judged above) or kept serving (ledger, convergence
				// and aggregates judge what it served) — if the node
				// read a corrupt byte at all.
				fw.Judged = w.Effective >= 0 && !idle
				if idle {
					fw.Why = "no corrupt byte was read (" + fe.what + ")"
				}
				if fw.Judged {
					exercised++
				}
				d.Windows = append(d.Windows, fw)
				continue
			}
			fw.Judged, fw.Why = writesJudged(faults[i].Invoke, w)
			if fw.Judged {
				for _, p := range pairs {
					op := p.Invoke
					if !op.Process.IsClient() || op.Node != node || !isWrite(op.F) || op.Time <= w.Effective {
						continue
					}
					if op.Time >= until {
						continue // invoked once the heal was under way
					}
					if !p.Pending && p.Completion.Time >= until {
						// Answered only after the heal's invoke: the
						// node did not acknowledge it while the fault
						// held (a stall releases such writes at the
						// heal, and they may then succeed).
						fw.Writes++
						fw.Refused++
						continue
					}
					if p.Pending && until < last {
						continue // its outcome may have come after the heal
					}
					fw.Writes++
					if p.Pending || p.Type() != history.OK {
						fw.Refused++
						continue
					}
					fw.Acked++
					totalAcked++
					if len(d.Acks) < maxExamples {
						d.Acks = append(d.Acks, DiskAck{Node: node, Fault: w.String(), Effective: w.Effective, Index: p.Completion.Index,
							F: op.F, Invoked: op.Time, Acked: p.Completion.Time, Seq: p.Completion.Seq, Term: p.Completion.Term,
							Process: int(op.Process), FirstID: firstID(op), FaultOpen: !w.Healed})
					}
				}
				switch {
				case fw.Writes > 0 && idle:
					fw.Why = "the fault did nothing to the disk (" + fe.what + ")"
				case fw.Writes > 0:
					exercised++
				}
			}
			d.Windows = append(d.Windows, fw)
		}
	}
	sort.SliceStable(d.Exits, func(i, j int) bool { return d.Exits[i].Time < d.Exits[j].Time })

	var problems []string
	if totalAcked > 0 {
		a := d.Acks[0]
		problems = append(problems, fmt.Sprintf("%d writes acknowledged by a node whose every fsync or WAL append was failing; first: %s %s (id %s) invoked at %s, acked by %s seq %d term %d at %s, after %s took effect at %s",
			totalAcked, a.F, opRef(a.Index), a.FirstID, history.FormatTime(a.Invoked), a.Node, a.Seq, a.Term, history.FormatTime(a.Acked),
			a.Fault, history.FormatTime(a.Effective)))
	}
	if len(d.Silent) > 0 {
		s := d.Silent[0]
		problems = append(problems, fmt.Sprintf("%d exits under corrupt-read without naming the damaged file and offset; first: %s (%s) at %s during %s",
			len(d.Silent), s.Node, s.Status, history.FormatTime(s.Time), s.Fault))
	}
	if len(problems) > 0 {
		return Result{Name: name, Valid: Invalid, Details: d, Summary: strings.Join(problems, "; ")}
	}
	if len(d.Windows) == 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no fsync-error, disk-full or corrupt-read fault on any node: nothing to check"}
	}
	if exercised == 0 {
		var why []string
		for _, w := range d.Windows {
			if w.Why != "" {
				why = append(why, w.Node+": "+w.Why)
			}
		}
		s := "no write reached a node under a judged fsync-error, disk-full or slow-disk-stall that did something to its disk, and no corrupt-read served a corrupt byte: no rule was exercised"
		if len(why) > 0 {
			s += " (" + strings.Join(why, "; ") + ")"
		}
		return Result{Name: name, Valid: Unknown, Details: d, Summary: s}
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: fencingSummary(d)}
}

// fencingSummary says what held, per kind.
func fencingSummary(d FencingDetails) string {
	var writes, refused, nodes int
	var fenced, named, bit []string
	for _, w := range d.Windows {
		if w.Kind != diskCorruptRead && w.Judged {
			nodes++
			writes += w.Writes
			refused += w.Refused
		}
		if w.Kind == diskFull && w.Effect != nil {
			bit = append(bit, fmt.Sprintf("%s %d", w.Node, w.Effect.ENOSPC))
		}
	}
	for _, e := range d.Exits {
		switch {
		case e.Fenced:
			fenced = append(fenced, e.Node+" at "+history.FormatTime(e.Time))
		case e.NamesDamage != "":
			named = append(named, e.Node+" at "+history.FormatTime(e.Time))
		}
	}
	var parts []string
	if nodes > 0 {
		parts = append(parts, fmt.Sprintf("no node acknowledged a write while its fsyncs or WAL appends failed (%d writes sent to %d faulted nodes, %d refused or unanswered)", writes, nodes, refused))
	}
	if len(bit) > 0 {
		parts = append(parts, "ENOSPC returned under disk-full: "+strings.Join(bit, ", "))
	}
	if len(fenced) > 0 {
		parts = append(parts, "fenced (exit 4): "+strings.Join(fenced, ", "))
	}
	if len(named) > 0 {
		parts = append(parts, "refused a corrupt log, naming file and offset: "+strings.Join(named, ", "))
	}
	s := strings.Join(parts, "; ")
	var served []string
	for _, w := range d.Windows {
		if w.Kind == diskCorruptRead && w.Judged && !slices.ContainsFunc(d.Exits, func(e DiskExit) bool { return e.Node == w.Node && e.Fault == w.Fault }) {
			served = append(served, w.Node)
		}
	}
	if len(served) > 0 {
		if s != "" {
			s += "; "
		}
		s += "kept running under corrupt-read (what it served is for ledger, convergence, aggregates): " + strings.Join(served, ", ")
	}
	return s
}

// writesJudged reports whether an fsync-error fault fails every fsync of
// the node's WAL, or a disk-full fault every WAL append, from the moment
// it took effect, and why not.
func writesJudged(inv history.Op, w FaultWindow) (bool, string) {
	if w.Effective < 0 {
		return false, "the fault never confirmed taking effect"
	}
	fv, err := history.Decode[history.FaultValue](inv)
	if err != nil {
		return false, err.Error()
	}
	var p diskParams
	if len(fv.Params) > 0 {
		if err := json.Unmarshal(fv.Params, &p); err != nil {
			return false, fmt.Sprintf("params %s: %v", fv.Params, err)
		}
	}
	if w.Kind == diskStall {
		for _, sd := range p.SlowDisk {
			if sd.Stall && sd.MaxStallMS == 0 && (len(sd.Ops) == 0 || slices.Contains(sd.Ops, "write") || slices.Contains(sd.Ops, "fsync")) {
				return true, ""
			}
		}
		return false, "no unbounded stall of writes or fsyncs in the fault's params"
	}
	if w.Kind == diskFull {
		switch f := p.DiskFull; {
		case f == nil:
			return false, "no disk_full in the fault's params"
		case f.FreeBytes > 0:
			return false, fmt.Sprintf("%d bytes left to write", f.FreeBytes)
		case !f.CountOverwrites:
			return false, "overwrites not counted: appends into the preallocated WAL segment succeed"
		}
		return true, ""
	}
	switch e := p.FsyncError; {
	case e == nil:
		return false, "no fsync_error in the fault's params"
	case !e.Sticky:
		return false, "one-shot: fsyncs after the first failure succeed"
	case e.After > 0:
		return false, fmt.Sprintf("the first %d fsyncs succeed", e.After)
	case e.Path != "" && !globMatches(e.Path, walSegment):
		return false, fmt.Sprintf("glob %q misses the WAL's segments", e.Path)
	}
	return true, ""
}

// globMatches is faultfs's path rule: a pattern without "/" matches the
// base name at any depth.
func globMatches(glob, rel string) bool {
	if !strings.Contains(glob, "/") {
		rel = path.Base(rel)
	}
	ok, _ := path.Match(glob, rel)
	return ok
}

// healInvokes maps each heal's completion time to its invoke time.
// healEffects maps the time of each heal's ok to what it recorded the
// fault did, per node.
func healEffects(heals []history.Pair) map[int64]map[string]DiskEffect {
	out := map[int64]map[string]DiskEffect{}
	for _, h := range heals {
		if h.Type() != history.OK {
			continue
		}
		fv, err := history.Decode[history.FaultValue](h.Completion)
		if err != nil || len(fv.Params) == 0 {
			continue
		}
		var p diskParams
		if json.Unmarshal(fv.Params, &p) == nil && p.Effect != nil {
			out[h.Completion.Time] = p.Effect
		}
	}
	return out
}

func healInvokes(heals []history.Pair) map[int64]int64 {
	out := map[int64]int64{}
	for _, h := range heals {
		if h.Type() == history.OK {
			out[h.Completion.Time] = h.Invoke.Time
		}
	}
	return out
}

func isWrite(f string) bool {
	return f == history.FWrite || f == history.FAdd || f == history.FPutEmbedding
}

// firstID is an event id of a write op, "" if it has none.
func firstID(op history.Op) string {
	switch op.F {
	case history.FWrite:
		if v, err := history.Decode[history.WriteValue](op); err == nil && len(v.Events) > 0 {
			return v.Events[0].ID
		}
	case history.FAdd:
		if v, err := history.Decode[history.AddValue](op); err == nil && len(v.IDs) > 0 {
			return v.IDs[0]
		}
	case history.FPutEmbedding:
		if v, err := history.Decode[history.PutEmbeddingValue](op); err == nil {
			return v.ID
		}
	}
	return ""
}

func opRef(index int64) string { return fmt.Sprintf("op %d", index) }

// namedDamage returns the first log line naming a corrupt file and
// offset, "" if none does.
func namedDamage(logs []LogTail) string {
	for _, l := range logs {
		if i := slices.IndexFunc(l.Lines, corruptionRefusal.MatchString); i >= 0 {
			return strings.TrimSpace(l.Lines[i])
		}
	}
	return ""
}

// DiskFaulted reports whether the history holds a disk fault the fencing
// checker has a rule for (fsync-error, disk-full or corrupt-read): the
// runner runs Fencing only then, as it runs Counter only on counter
// workloads.
func DiskFaulted(ops []history.Op) bool {
	for _, op := range ops {
		if op.Process != history.Nemesis || op.Type != history.Invoke || op.F != fDisk {
			continue
		}
		if fv, err := history.Decode[history.FaultValue](op); err == nil &&
			(fv.Kind == diskFsyncError || fv.Kind == diskFull || fv.Kind == diskCorruptRead || fv.Kind == diskStall) {
			return true
		}
	}
	return false
}
