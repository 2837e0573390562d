package checker

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// MemberMatch is one member's replication progress as the leader sees it.
type MemberMatch struct {
	ID    uint64 `json:"id"`
	Match uint64 `json:"match"`
}

// LagSample is one poll of a node's GET /cluster/status, stamped with the
// history clock (Recorder.Now) so samples and ops share a timeline. The
// harness polls every node every 100–250 ms; the sampling interval is the
// resolution of every time the lag checker reports.
type LagSample struct {
	Time    int64         `json:"time"` // ns since the history started
	Node    string        `json:"node"` // name, e.g. "n1"
	ID      uint64        `json:"id"`   // raft id of Node
	Leader  uint64        `json:"leader"`
	Term    uint64        `json:"term"`
	Commit  uint64        `json:"commit"`
	Applied uint64        `json:"applied"`
	Members []MemberMatch `json:"members,omitempty"`
}

// SLO is what replication lag must stay within.
type SLO struct {
	// P99 bounds each follower's p99 lag in time outside fault windows
	// (and outside its catch-up after a heal, which CatchUp bounds).
	P99 time.Duration `json:"p99"`
	// CatchUp bounds the time from a heal until every follower is caught up.
	CatchUp time.Duration `json:"catch_up"`
	// A follower is caught up when it lags by at most CaughtUpLag in time
	// (under load a healthy follower is always a few entries behind, but
	// those entries are only milliseconds old). Entries alone are not
	// enough: when writes stall during a fault, a follower a few entries
	// behind can be seconds stale. CaughtUpEntries decides only for a
	// sample whose lag in time cannot be measured.
	CaughtUpEntries uint64        `json:"caught_up_entries"`
	CaughtUpLag     time.Duration `json:"caught_up_lag"`
}

// DefaultSLO is p99 ≤ 2s outside faults and catch-up ≤ 10s after a heal.
func DefaultSLO() SLO {
	return SLO{P99: 2 * time.Second, CatchUp: 10 * time.Second, CaughtUpEntries: 64, CaughtUpLag: 500 * time.Millisecond}
}

func (s SLO) withDefaults() SLO {
	def := DefaultSLO()
	if s.P99 <= 0 {
		s.P99 = def.P99
	}
	if s.CatchUp <= 0 {
		s.CatchUp = def.CatchUp
	}
	if s.CaughtUpEntries == 0 {
		s.CaughtUpEntries = def.CaughtUpEntries
	}
	if s.CaughtUpLag <= 0 {
		s.CaughtUpLag = def.CaughtUpLag
	}
	return s
}

// LagStats summarizes follower lag samples: in entries (leader commit −
// follower applied) and in ms (how long ago the leader's commit first
// passed the follower's applied index).
type LagStats struct {
	Samples    int     `json:"samples"`
	P50Entries uint64  `json:"p50_entries"`
	P99Entries uint64  `json:"p99_entries"`
	MaxEntries uint64  `json:"max_entries"`
	P50Ms      float64 `json:"p50_ms"`
	P99Ms      float64 `json:"p99_ms"`
	MaxMs      float64 `json:"max_ms"`
}

// FollowerLag is one node's lag while it was a follower.
type FollowerLag struct {
	Node    string   `json:"node"`
	Overall LagStats `json:"overall"`
	Outside LagStats `json:"outside_faults"` // the SLO applies here
	P99OK   bool     `json:"p99_ok"`
}

// WindowLag is follower lag during one fault window.
type WindowLag struct {
	Window    FaultWindow         `json:"window"`
	Followers map[string]LagStats `json:"followers"`
}

// CatchUp is how long a follower took to catch up after a heal.
type CatchUp struct {
	Fault    string `json:"fault"` // window label
	Node     string `json:"node"`
	HealedAt int64  `json:"healed_at"`
	// CaughtUpAt is the first sample at or after the heal that was caught
	// up; -1 if none was.
	CaughtUpAt int64   `json:"caught_up_at"`
	Ms         float64 `json:"ms"` // CaughtUpAt − HealedAt; -1 if never
	// Interrupted: the next fault began before the follower caught up, so
	// this heal is not judged.
	Interrupted bool `json:"interrupted,omitempty"`
	// Undecided: the samples end before the follower caught up and before
	// the SLO ran out; the run stopped sampling too soon to judge.
	Undecided bool `json:"undecided,omitempty"`
	OK        bool `json:"ok"`
}

// LagDetails is the Details of a Lag result.
type LagDetails struct {
	SLO        SLO           `json:"slo"`
	Followers  []FollowerLag `json:"followers"`
	Windows    []WindowLag   `json:"windows"`
	CatchUps   []CatchUp     `json:"catch_ups"`
	Violations []string      `json:"violations,omitempty"`
	// Unmeasured counts follower samples taken before any leader was seen.
	Unmeasured int `json:"unmeasured,omitempty"`
	// Unsampled names each follower never sampled after a heal (neither as
	// a follower nor as the leader) while the cluster was still sampled,
	// and the fault window: whether it caught up is not in the samples.
	Unsampled []string `json:"unsampled,omitempty"`
}

type lagPoint struct {
	time    int64
	entries uint64
	ms      float64
}

// commitSeries is the cluster's commit index over time, as reported by
// whichever node claimed leadership at each sample. Raft's commit index
// never goes back, so a deposed leader's stale report is masked with the
// running maximum.
type commitSeries struct {
	times   []int64
	commits []uint64 // non-decreasing
}

func (c commitSeries) nearest(t int64) uint64 {
	i := sort.Search(len(c.times), func(i int) bool { return c.times[i] >= t })
	switch {
	case i == len(c.times):
		return c.commits[i-1]
	case i > 0 && t-c.times[i-1] <= c.times[i]-t:
		return c.commits[i-1]
	}
	return c.commits[i]
}

// reached estimates when the commit index first reached idx (ok false if
// it never did). Between two leader samples the commit index is taken to
// grow linearly, which brings the estimate well under the sampling
// interval when writes flow steadily.
func (c commitSeries) reached(idx uint64) (int64, bool) {
	i := sort.Search(len(c.commits), func(i int) bool { return c.commits[i] >= idx })
	if i == len(c.commits) {
		return 0, false
	}
	if i == 0 || c.commits[i] == c.commits[i-1] {
		return c.times[i], true
	}
	t0, t1 := float64(c.times[i-1]), float64(c.times[i])
	c0, c1 := float64(c.commits[i-1]), float64(c.commits[i])
	return int64(t0 + (t1-t0)*(float64(idx)-c0)/(c1-c0)), true
}

// Lag computes follower replication lag from status samples and judges
// it against slo (zero fields take DefaultSLO's values).
//
// Per follower sample: lag in entries is the leader's commit at the
// leader sample nearest in time minus the follower's applied index; lag
// in time is how long before the sample the leader's commit first
// covered the entry after the follower's applied index (interpolated
// between leader samples, see commitSeries.reached). Samples from the
// node that was leader at the time are not follower samples.
//
// Stats are reported per follower overall, per fault window and outside
// fault windows. "Outside" also leaves out each follower's catch-up after
// a heal (from the heal until it caught up, at most slo.CatchUp), which
// the catch-up SLO judges instead. Invalid if any follower's p99 outside
// faults exceeds slo.P99, or any follower took longer than slo.CatchUp to
// catch up after a heal (not judged when the next fault started first).
// Unknown when no leader or no follower was ever sampled.
func Lag(samples []LagSample, faults []FaultWindow, slo SLO) Result {
	const name = "lag"
	slo = slo.withDefaults()
	d := LagDetails{SLO: slo}
	if len(samples) == 0 {
		return Result{Name: name, Valid: Unknown, Summary: "no status samples", Details: d}
	}
	samples = append([]LagSample(nil), samples...)
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].Time < samples[j].Time })

	var series commitSeries
	for _, s := range samples {
		if s.Leader == 0 || s.Leader != s.ID {
			continue
		}
		c := s.Commit
		if n := len(series.commits); n > 0 && series.commits[n-1] > c {
			c = series.commits[n-1]
		}
		series.times = append(series.times, s.Time)
		series.commits = append(series.commits, c)
	}
	if len(series.times) == 0 {
		return Result{Name: name, Valid: Unknown, Summary: "no sample came from a leader; lag cannot be measured", Details: d}
	}

	points := map[string][]lagPoint{}
	// led records when each node was sampled as the leader: a follower
	// that becomes leader after a heal has, by raft's rules, every
	// committed entry, so it has caught up (and has no follower samples
	// left to say so).
	led := map[string][]int64{}
	// ids is each node's raft id as it last reported it; leaders are the
	// leader samples, to tell a follower removed from the membership
	// (which is no longer sampled, and need not catch up) from one the
	// sampler missed.
	ids := map[string]uint64{}
	var leaders []LagSample
	var lastSample int64
	for _, s := range samples {
		lastSample = max(lastSample, s.Time)
		ids[s.Node] = s.ID
		if s.Leader != 0 && s.Leader == s.ID {
			leaders = append(leaders, s)
		}
		if s.Leader != 0 && s.Leader == s.ID {
			led[s.Node] = append(led[s.Node], s.Time)
			continue
		}
		if s.Time < series.times[0] {
			d.Unmeasured++
			continue
		}
		p := lagPoint{time: s.Time}
		if c := series.nearest(s.Time); c > s.Applied {
			p.entries = c - s.Applied
			if at, ok := series.reached(s.Applied + 1); ok && at < s.Time {
				p.ms = float64(s.Time-at) / 1e6
			}
		}
		points[s.Node] = append(points[s.Node], p)
	}
	nodes := make([]string, 0, len(points))
	for n := range points {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	if len(nodes) == 0 {
		return Result{Name: name, Valid: Unknown, Summary: "no follower was ever sampled", Details: d}
	}
	faults = append([]FaultWindow(nil), faults...)
	sort.SliceStable(faults, func(i, j int) bool { return faults[i].Start < faults[j].Start })

	caughtUp := func(p lagPoint) bool {
		if p.ms < 0 {
			return p.entries <= slo.CaughtUpEntries
		}
		return p.ms <= float64(slo.CaughtUpLag)/1e6
	}
	// Catch-up after every heal, and the recovery intervals it excludes
	// from "outside faults".
	recovering := map[string][][2]int64{}
	heals, undecided := 0, 0
	for _, w := range faults {
		if !w.Healed {
			continue
		}
		heals++
		nextStart := int64(math.MaxInt64)
		for _, o := range faults {
			if o.Start > w.End && o.Start < nextStart {
				nextStart = o.Start
			}
		}
		for _, n := range nodes {
			cu := CatchUp{Fault: w.Label(), Node: n, HealedAt: w.End, CaughtUpAt: -1, Ms: -1}
			pts := points[n]
			i := sort.Search(len(pts), func(i int) bool { return pts[i].time >= w.End })
			if i == len(pts) && !ledSince(led[n], w.End) {
				if removedSince(leaders, ids[n], w.End) {
					continue // no longer a member: nothing to catch up
				}
				// Never sampled after the heal: whether it caught up is
				// not in the samples, so it is not judged true.
				d.Unsampled = append(d.Unsampled, fmt.Sprintf("follower %s never sampled after the heal of %s (window %s..%s)",
					n, w.Label(), history.FormatTime(w.Start), history.FormatTime(w.End)))
				continue
			}
			ledAt := int64(-1)
			for _, t := range led[n] {
				if t >= w.End && t < nextStart {
					ledAt = t
					break
				}
			}
			for ; i < len(pts) && pts[i].time < nextStart; i++ {
				if ledAt >= 0 && pts[i].time > ledAt {
					break
				}
				if caughtUp(pts[i]) {
					cu.CaughtUpAt = pts[i].time
					cu.Ms = float64(pts[i].time-w.End) / 1e6
					break
				}
			}
			if cu.CaughtUpAt < 0 && ledAt >= 0 {
				cu.CaughtUpAt = ledAt
				cu.Ms = float64(ledAt-w.End) / 1e6
			}
			end := cu.CaughtUpAt
			switch {
			case cu.CaughtUpAt >= 0:
				cu.OK = cu.Ms <= float64(slo.CatchUp)/1e6
			case i < len(pts), nextStart <= lastSample && nextStart < w.End+int64(slo.CatchUp):
				// The next fault began first (the node may have no
				// follower samples after it, e.g. because it leads now).
				cu.Interrupted, cu.OK = true, true
				end = nextStart
			case pts[len(pts)-1].time-w.End < int64(slo.CatchUp):
				cu.Undecided, cu.OK = true, true
				end = pts[len(pts)-1].time
				undecided++
			default:
				end = w.End + int64(slo.CatchUp)
			}
			if lim := w.End + int64(slo.CatchUp); end > lim || end < 0 {
				end = lim
			}
			recovering[n] = append(recovering[n], [2]int64{w.End, end})
			d.CatchUps = append(d.CatchUps, cu)
			if !cu.OK {
				if cu.CaughtUpAt < 0 {
					d.Violations = append(d.Violations, fmt.Sprintf("%s never caught up after the heal of %s at %s", n, w.Label(), history.FormatTime(w.End)))
				} else {
					d.Violations = append(d.Violations, fmt.Sprintf("%s took %.0fms to catch up after the heal of %s at %s (SLO %v)", n, cu.Ms, w.Label(), history.FormatTime(w.End), slo.CatchUp))
				}
			}
		}
	}

	inFault := func(t int64) bool {
		for _, w := range faults {
			if w.Contains(t) {
				return true
			}
		}
		return false
	}
	for _, n := range nodes {
		var outside []lagPoint
	points:
		for _, p := range points[n] {
			if inFault(p.time) {
				continue
			}
			for _, r := range recovering[n] {
				if p.time >= r[0] && p.time <= r[1] {
					continue points
				}
			}
			outside = append(outside, p)
		}
		fl := FollowerLag{Node: n, Overall: lagStats(points[n]), Outside: lagStats(outside)}
		fl.P99OK = fl.Outside.P99Ms <= float64(slo.P99)/1e6
		if !fl.P99OK {
			d.Violations = append(d.Violations, fmt.Sprintf("%s p99 lag outside faults %.0fms (%d entries) over %d samples exceeds the SLO of %v",
				n, fl.Outside.P99Ms, fl.Outside.P99Entries, fl.Outside.Samples, slo.P99))
		}
		d.Followers = append(d.Followers, fl)
	}
	for _, w := range faults {
		wl := WindowLag{Window: w, Followers: map[string]LagStats{}}
		for _, n := range nodes {
			var in []lagPoint
			for _, p := range points[n] {
				if w.Contains(p.time) {
					in = append(in, p)
				}
			}
			if len(in) > 0 {
				wl.Followers[n] = lagStats(in)
			}
		}
		d.Windows = append(d.Windows, wl)
	}

	if len(d.Violations) > 0 {
		return Result{Name: name, Valid: Invalid, Details: d, Summary: "lag SLO violated: " + strings.Join(d.Violations, "; ")}
	}
	var worst FollowerLag
	for _, f := range d.Followers {
		if f.Outside.P99Ms >= worst.Outside.P99Ms {
			worst = f
		}
	}
	slowest := -1.0
	for _, c := range d.CatchUps {
		slowest = math.Max(slowest, c.Ms)
	}
	s := fmt.Sprintf("p99 lag outside faults ≤ %.0fms (worst %s, SLO %v)", worst.Outside.P99Ms, worst.Node, slo.P99)
	if slowest >= 0 {
		s += fmt.Sprintf("; slowest catch-up %.0fms after %d heals (SLO %v)", slowest, heals, slo.CatchUp)
	}
	if len(d.Unsampled) > 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: fmt.Sprintf(
			"%s; but %d catch-ups not measured: %s", s, len(d.Unsampled), strings.Join(d.Unsampled, "; "))}
	}
	if undecided > 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: fmt.Sprintf(
			"%s; but %d catch-ups undecided: sampling stopped before the followers caught up and before the %v SLO ran out", s, undecided, slo.CatchUp)}
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: s}
}

// ledSince reports whether any of the times a node was sampled as the
// leader is at or after t.
func ledSince(led []int64, t int64) bool {
	for _, l := range led {
		if l >= t {
			return true
		}
	}
	return false
}

// removedSince reports whether a leader sampled at or after t listed the
// membership's match indexes without id: the member was removed.
func removedSince(leaders []LagSample, id uint64, t int64) bool {
	for _, s := range leaders {
		if s.Time < t || len(s.Members) == 0 {
			continue
		}
		found := false
		for _, m := range s.Members {
			found = found || m.ID == id
		}
		if !found {
			return true
		}
	}
	return false
}

// lagStats uses nearest-rank percentiles.
func lagStats(points []lagPoint) LagStats {
	st := LagStats{Samples: len(points)}
	if len(points) == 0 {
		return st
	}
	entries := make([]uint64, len(points))
	ms := make([]float64, len(points))
	for i, p := range points {
		entries[i], ms[i] = p.entries, p.ms
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i] < entries[j] })
	sort.Float64s(ms)
	rank := func(q float64) int {
		r := int(math.Ceil(q*float64(len(points)))) - 1
		return max(r, 0)
	}
	st.P50Entries, st.P99Entries, st.MaxEntries = entries[rank(0.50)], entries[rank(0.99)], entries[len(entries)-1]
	st.P50Ms, st.P99Ms, st.MaxMs = ms[rank(0.50)], ms[rank(0.99)], ms[len(ms)-1]
	return st
}
