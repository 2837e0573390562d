package nemesis

import (
	"math/rand/v2"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
)

// DefaultElectionTimeout is the election timeout pause-leader-burst sizes
// its pauses by when the schedule names none: etcd's default (1000ms).
const DefaultElectionTimeout = time.Second

// pause-leader-burst pauses whoever leads, over and over, each pause long
// enough to provoke an election: from one to three election timeouts,
// drawn to the millisecond, so that the paused leader wakes at every phase
// of the election that replaced it — before the new leader's first
// heartbeat reached it, during the vote, after it. A resumed leader that
// still believes it leads may serve a read it should not; pauses shorter
// than an election timeout rarely cause an election at all, and a single
// long pause tests only one wake-up.
//
// Generate expands one draw of the kind into a burst of steps that fills
// the fault duration: each a pause of the leader of that moment (resolved
// at run time, so after the first the new leader is paused), with a gap
// of half to two election timeouts between them for a leader to be
// elected. Each is an ordinary pause-leader fault in the history.
var burstKinds = []Kind{
	{Name: "pause-leader-burst", F: history.FPause, Sub: "leader", Class: Process, MinNodes: 3, Leader: true, OptIn: true,
		fault: signal{sub: "leader", do: pause, undo: resume, undoing: cluster.Paused},
		Doc:   "a burst filling the fault duration: SIGSTOP whoever leads for 1-3 election timeouts (to the ms), SIGCONT, a gap of 0.5-2 election timeouts, again (opt-in)"},
}

func init() { kinds = append(kinds, burstKinds...) }

// electionTimeout is cfg's, or the default.
func (c ScheduleConfig) electionTimeout() time.Duration {
	if c.ElectionTimeout > 0 {
		return c.ElectionTimeout
	}
	return DefaultElectionTimeout
}

// burst draws the steps of a pause-leader-burst starting at t and ending
// by end: at least one pause, however short the window.
func burst(r *rand.Rand, cfg ScheduleConfig, t, end time.Duration) []Step {
	et := cfg.electionTimeout().Milliseconds()
	var out []Step
	for {
		d := time.Duration(et+r.Int64N(2*et+1)) * time.Millisecond
		if len(out) > 0 && t+d > end {
			return out
		}
		out = append(out, Step{At: t, Kind: "pause-leader-burst", Duration: d})
		t += d + time.Duration(et/2+r.Int64N(3*et/2+1))*time.Millisecond
	}
}
