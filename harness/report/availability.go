package report

import (
	"sort"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
)

// Availability per fault: what each fault cost the
// clients in writes, measured from the history alone.
//
//   - Outage: the longest stretch without a successful (ok) write, from
//     the fault's invoke until writes succeed again after its heal: a
//     fault that stopped writes for 3s shows 3s even if it was healed
//     after 1s, and one whose heal is followed at once by writes shows
//     only the time writes stalled while it was in effect.
//   - Resumed: from the heal's ok to the first ok write after it; -1 when
//     none followed (the run ended first).
//
// A write is any client op that writes (ledger write, counter add,
// embedding put), on any node: what a client of the cluster sees.

// writeOps are the history fs that write.
var writeOps = map[string]bool{history.FWrite: true, history.FAdd: true, history.FPutEmbedding: true}

// faultAvailability is one fault's figures.
type faultAvailability struct {
	Window    checker.FaultWindow
	OKWrites  int     // ok writes completed while the fault was in effect
	OutageS   float64 // seconds, see above
	OutageEnd bool    // the outage ran to the end of the history
	ResumedS  float64 // seconds from the heal to the first ok write; -1 none
	// Refused counts the client ops answered 503, 504 or 408 while the
	// fault was in effect (checker.CountRefusals).
	Refused checker.WindowRefusals
}

// availability computes the figures of every window from the pairs.
// end is the history's last time.
func availability(pairs []history.Pair, windows []checker.FaultWindow, end int64) []faultAvailability {
	var oks []int64
	for _, p := range pairs {
		if p.Invoke.Process.IsClient() && writeOps[p.Invoke.F] && p.Type() == history.OK {
			oks = append(oks, p.Completion.Time)
		}
	}
	sort.Slice(oks, func(i, j int) bool { return oks[i] < oks[j] })
	refused := checker.CountRefusals(pairs, windows)
	out := make([]faultAvailability, 0, len(windows))
	for i, w := range windows {
		a := faultAvailability{Window: w, ResumedS: -1, Refused: refused[i]}
		first := sort.Search(len(oks), func(i int) bool { return oks[i] >= w.Start })
		after := sort.Search(len(oks), func(i int) bool { return oks[i] >= w.End })
		a.OKWrites = after - first
		if after < len(oks) && w.Healed {
			a.ResumedS = sec(oks[after] - w.End)
		}
		// The longest gap between w.Start, the ok writes after it up to
		// the first one at or after the heal, and that one.
		prev := w.Start
		stop := end
		if after < len(oks) {
			stop = oks[after]
		} else {
			a.OutageEnd = true
		}
		longest := int64(0)
		for i := first; i < len(oks) && oks[i] <= stop; i++ {
			longest = max(longest, oks[i]-prev)
			prev = oks[i]
		}
		if a.OutageEnd {
			longest = max(longest, stop-prev)
		}
		a.OutageS = sec(longest)
		out = append(out, a)
	}
	return out
}
