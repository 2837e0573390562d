package checker

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/harness/history"
)

// FaultWindow is the time a fault may have been acting on the cluster, in
// history time (ns since start).
type FaultWindow struct {
	F       string   `json:"f"`
	Kind    string   `json:"kind,omitempty"`
	Targets []string `json:"targets,omitempty"`
	// Start is the fault's invoke: from then on it may be in effect.
	Start int64 `json:"start"`
	// Effective is when the nemesis saw it take effect; -1 when it never
	// said (the invoke completed info, or not at all).
	Effective int64 `json:"effective"`
	// End is the ok of its heal (or its own completion for an instant
	// fault). Open windows end at the history's last op.
	End    int64 `json:"end"`
	Healed bool  `json:"healed"`
}

// Label names the fault for people: "partition(halves)".
func (w FaultWindow) Label() string {
	if w.Kind == "" {
		return w.F
	}
	return w.F + "(" + w.Kind + ")"
}

func (w FaultWindow) String() string {
	end := history.FormatTime(w.End)
	if !w.Healed {
		end += " (never healed)"
	}
	s := fmt.Sprintf("%s %s..%s", w.Label(), history.FormatTime(w.Start), end)
	if len(w.Targets) > 0 {
		s += " on " + strings.Join(w.Targets, ",")
	}
	return s
}

// Contains reports whether history time t falls inside the window.
func (w FaultWindow) Contains(t int64) bool { return t >= w.Start && t <= w.End }

// Overlaps reports whether the window intersects [from, to].
func (w FaultWindow) Overlaps(from, to int64) bool { return w.Start <= to && w.End >= from }

// FaultWindows derives fault windows from the nemesis ops of a history,
// ordered by start. A fault whose invoke failed never happened and has no
// window. A heal-<f> that took effect (ok) closes every open window of f;
// heal-all closes every open window. See history.FaultValue for the shapes.
func FaultWindows(ops []history.Op) ([]FaultWindow, error) {
	var last int64
	if len(ops) > 0 {
		last = ops[len(ops)-1].Time
	}
	var nemesis []history.Op
	for _, op := range ops {
		if op.Process == history.Nemesis {
			nemesis = append(nemesis, op)
		}
	}
	pairs, err := history.Pairs(nemesis)
	if err != nil {
		return nil, err
	}

	// Heals that took effect, in time order.
	type heal struct {
		fault string // "" = all
		at    int64
	}
	var heals []heal
	var faults []history.Pair
	for _, p := range pairs {
		if p.Invoke.Process != history.Nemesis {
			continue
		}
		if f, ok := history.HealedBy(p.Invoke.F); ok {
			if p.Type() == history.OK {
				heals = append(heals, heal{fault: f, at: p.Completion.Time})
			}
			continue
		}
		if p.Type() != history.Fail {
			faults = append(faults, p)
		}
	}
	sort.SliceStable(heals, func(i, j int) bool { return heals[i].at < heals[j].at })

	windows := make([]FaultWindow, 0, len(faults))
	for _, p := range faults {
		var fv history.FaultValue
		if len(p.Invoke.Value) > 0 {
			if fv, err = history.Decode[history.FaultValue](p.Invoke); err != nil {
				return nil, err
			}
		}
		w := FaultWindow{F: p.Invoke.F, Kind: fv.Kind, Targets: fv.Targets, Start: p.Invoke.Time, Effective: -1, End: last}
		if p.Type() == history.OK {
			w.Effective = p.Completion.Time
		}
		if fv.Instant && !p.Pending {
			w.End, w.Healed = p.Completion.Time, true
		} else {
			// The first heal of this f (or of all) at or after the fault
			// was invoked. A heal racing the fault's own completion still
			// ends it: the nemesis serializes its steps per fault.
			for _, h := range heals {
				if h.at >= p.Invoke.Time && (h.fault == "" || h.fault == w.F) {
					w.End, w.Healed = h.at, true
					break
				}
			}
		}
		windows = append(windows, w)
	}
	return windows, nil
}

// faultsAround lists the windows overlapping [from-margin, to+margin].
func faultsAround(windows []FaultWindow, from, to, margin int64) []FaultWindow {
	var out []FaultWindow
	for _, w := range windows {
		if w.Overlaps(from-margin, to+margin) {
			out = append(out, w)
		}
	}
	return out
}
