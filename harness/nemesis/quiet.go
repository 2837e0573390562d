package nemesis

import (
	"context"
	"encoding/json"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// Quiet spells before power cuts. Under a steady closed-loop workload the
// newest writes are always in flight when a cut lands: not acknowledged
// yet, so their loss proves nothing. A recovery that drops the newest
// valid record of the log (a torn-tail rule that cuts one record too
// many, say) then loses only writes whose outcome is unknown, and no
// checker can tell. So before each power cut the nemesis closes the
// workload's gate for new ops for a moment (Runner.QuietBeforeCut): the
// ops in flight complete, their acks and fsyncs are done, and the cut
// lands on a log whose newest records are acknowledged. The gate opens
// again as soon as the cut took effect (or failed).
//
// The spell is recorded as a window of f "quiet" (kind "before-cut",
// the cut's kind in params): an invoke/ok pair when the gate closes, a
// heal-quiet pair when it opens, so the report shows it like any fault
// window and a reader sees why writes paused.

// FQuiet is the history f of a quiet spell.
const FQuiet = history.FQuiet

// Quieter is a gate on the workload's new ops: Close holds every client
// before its next op, Open lets them go again. Ops in flight are not
// touched.
type Quieter interface {
	Close()
	Open()
}

type quietParams struct {
	Before string `json:"before"`
	MS     int64  `json:"ms"`
}

// quietBefore closes the gate for QuietBeforeCut before a power cut of
// kind k and returns what opens it again; for other kinds, or without a
// gate, it does nothing. power-cut-after-election is not quieted: it
// lands on an election, not on writes.
func (r *Runner) quietBefore(ctx context.Context, k Kind) (reopen func()) {
	if r.Quiet == nil || r.QuietBeforeCut <= 0 || (k.F != FPowerCut && k.F != history.FStopPowerCut) || k.Name == "power-cut-after-election" {
		return func() {}
	}
	params, _ := json.Marshal(quietParams{Before: k.Name, MS: r.QuietBeforeCut.Milliseconds()})
	v := history.FaultValue{Kind: "before-cut", Params: params}
	inv := r.rec.Invoke(history.Nemesis, FQuiet, v, "")
	r.Quiet.Close()
	r.rec.Complete(inv, history.OK, v, nil, 0, 0)
	t := time.NewTimer(r.QuietBeforeCut)
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	t.Stop()
	return func() {
		inv := r.rec.Invoke(history.Nemesis, history.HealOf(FQuiet), v, "")
		r.Quiet.Open()
		r.rec.Complete(inv, history.OK, v, nil, 0, 0)
	}
}
