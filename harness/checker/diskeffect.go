package checker

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/harness/history"
)

// A disk fault is exercised by what it did, not by the nemesis' ok: an
// fsync-error no fsync ran into, a corrupt range no read touched, a
// power cut of a disk that held nothing unsynced took effect and tested
// nothing. The effect is what faultfs counted, which the nemesis records
// per target: a disk fault's heal records the counters' growth while it
// was armed (DiskEffect), a power cut's ok what each disk lost
// (PowerCutLoss). A disk fault healed by heal-all has no record of its
// own; its node's counters over the whole run (nodes/<n>/faultfs.json,
// NodeEvidence.Disks) stand in — they can only say that it did nothing.

// PowerCutLoss mirrors what faultfs reports a power cut undid on one
// disk (faultfs.PowerCutReport); the checker stays free of the FUSE
// package.
type PowerCutLoss struct {
	Files             int   `json:"files"`
	Torn              int   `json:"torn"`
	ChangesUndone     int   `json:"changes_undone"`
	BytesDiscarded    int64 `json:"bytes_discarded"`
	EntriesRolledBack int   `json:"entries_rolled_back"`
	// OutOfOrder: the cut kept a seeded subset of the dirty pages, not a
	// prefix (faultfs.PowerCutOptions.OutOfOrder); PagesKept and
	// PagesDropped count them.
	OutOfOrder   bool `json:"out_of_order,omitempty"`
	PagesKept    int  `json:"pages_kept,omitempty"`
	PagesDropped int  `json:"pages_dropped,omitempty"`
}

// Lost reports whether the cut took anything from the disk.
func (l PowerCutLoss) Lost() bool {
	return l.ChangesUndone > 0 || l.BytesDiscarded > 0 || l.EntriesRolledBack > 0 || l.PagesDropped > 0
}

// powerCutLosses is what a power cut's ok recorded per target, nil when
// it recorded nothing.
func powerCutLosses(ok history.Op) map[string]PowerCutLoss {
	if ok.Type != history.OK || len(ok.Value) == 0 {
		return nil
	}
	fv, err := history.Decode[history.FaultValue](ok)
	if err != nil || len(fv.Params) == 0 {
		return nil
	}
	var p struct {
		Reports map[string]PowerCutLoss `json:"reports"`
	}
	if json.Unmarshal(fv.Params, &p) != nil {
		return nil
	}
	return p.Reports
}

// diskCounter is the counter of DiskEffect that shows a disk fault of
// kind bit, and how to name it.
func diskCounter(kind string, e DiskEffect) (uint64, string) {
	switch kind {
	case diskFsyncError:
		return e.FsyncEIO, "fsyncs failed"
	case diskFull:
		return e.ENOSPC, "ENOSPC returned"
	case diskStall:
		return e.Stalled, "operations stalled"
	case "slow-disk":
		return e.Delayed + e.Stalled, "operations delayed"
	case diskCorruptRead:
		return e.CorruptReads, "corrupt reads served"
	}
	var n uint64
	for _, v := range []uint64{e.FsyncEIO, e.ENOSPC, e.Stalled, e.Delayed, e.CorruptReads, e.LostBytes} {
		n += v
	}
	return n, "faulted operations"
}

// faultEffect is what one disk or power-cut fault did, as far as the run
// recorded it.
type faultEffect struct {
	known bool   // some record says
	bit   bool   // it did something on some target
	what  string // "fsyncs failed: n1 3, n2 0", or why it is not known
}

// diskFaultEffect judges window w of a disk or power-cut fault: ok is the
// fault's completion, effects the heals' records (healEffects), totals
// each node's faultfs counters over the run.
func diskFaultEffect(w FaultWindow, ok history.Op, effects map[int64]map[string]DiskEffect, totals map[string]DiskEffect) faultEffect {
	switch w.F {
	case history.FPowerCut:
		losses := powerCutLosses(ok)
		if losses == nil {
			return faultEffect{what: "the cut recorded no report of what the disks lost"}
		}
		// A cut is exercised once it happened to a running node, whatever
		// it found unsynced: the node died without a flush and restarted
		// from its disk alone. A cut that found everything synced (what
		// the quiet spell before a cut aims at) tests that recovery keeps
		// every synced record, the newest included; what was lost is
		// reported, not required.
		fe := faultEffect{known: true, bit: true}
		var parts []string
		lost := false
		for _, t := range sortedKeys(losses) {
			l := losses[t]
			lost = lost || l.Lost()
			parts = append(parts, fmt.Sprintf("%s %d bytes, %d changes, %d entries", t, l.BytesDiscarded, l.ChangesUndone, l.EntriesRolledBack))
		}
		fe.what = "lost at the cut: " + strings.Join(parts, "; ")
		if !lost {
			fe.what += " (nothing was unsynced: recovery from a fully synced disk)"
		}
		return fe
	case fDisk:
		var per map[string]DiskEffect
		source := "while armed"
		if w.Healed {
			per = effects[w.End]
		}
		if per == nil {
			per, source = map[string]DiskEffect{}, "over the whole run (faultfs.json; the heal recorded no effect)"
			for _, t := range w.Targets {
				if e, ok := totals[t]; ok {
					per[t] = e
				}
			}
		}
		if len(per) == 0 {
			return faultEffect{what: "no record of its effect (neither the heal nor faultfs.json)"}
		}
		fe := faultEffect{known: true}
		var parts []string
		var name string
		for _, t := range sortedKeys(per) {
			var n uint64
			n, name = diskCounter(w.Kind, per[t])
			fe.bit = fe.bit || n > 0
			parts = append(parts, fmt.Sprintf("%s %d", t, n))
		}
		fe.what = fmt.Sprintf("%s %s: %s", name, source, strings.Join(parts, ", "))
		if !fe.bit && source != "while armed" {
			return fe
		}
		if fe.bit && source != "while armed" {
			// Counters over the run cannot tie their growth to this
			// fault: not known to have bitten.
			return faultEffect{what: fe.what}
		}
		return fe
	}
	return faultEffect{}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
