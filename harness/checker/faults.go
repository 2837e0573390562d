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
	ws, _, _, err := faultWindows(ops)
	return ws, err
}

// faultWindows is FaultWindows, with each window's fault op pair (same
// order) and the history's heal pairs.
func faultWindows(ops []history.Op) (windows []FaultWindow, of []history.Pair, heals []history.Pair, err error) {
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
		return nil, nil, nil, err
	}

	// Heals that took effect, in time order. A heal that failed or whose
	// outcome is unknown ends nothing: the fault may still be in effect.
	type heal struct {
		fault string // "" = all
		at    int64
	}
	var healed []heal
	var faults []history.Pair
	for _, p := range pairs {
		if p.Invoke.Process != history.Nemesis {
			continue
		}
		if f, ok := history.HealedBy(p.Invoke.F); ok {
			heals = append(heals, p)
			if p.Type() == history.OK {
				healed = append(healed, heal{fault: f, at: p.Completion.Time})
			}
			continue
		}
		if p.Type() != history.Fail {
			faults = append(faults, p)
		}
	}
	sort.SliceStable(healed, func(i, j int) bool { return healed[i].at < healed[j].at })

	windows = make([]FaultWindow, 0, len(faults))
	for _, p := range faults {
		var fv history.FaultValue
		if len(p.Invoke.Value) > 0 {
			if fv, err = history.Decode[history.FaultValue](p.Invoke); err != nil {
				return nil, nil, nil, err
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
			for _, h := range healed {
				if h.at >= p.Invoke.Time && (h.fault == "" || h.fault == w.F) {
					w.End, w.Healed = h.at, true
					break
				}
			}
		}
		windows = append(windows, w)
	}
	return windows, faults, heals, nil
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

// FaultKind is a fault kind a run asked the nemesis for, and how the
// history records it: ops of f F whose FaultValue.Kind is Kind.
type FaultKind struct {
	Name    string `json:"name"` // as the schedule names it: "isolate-leader"
	F       string `json:"f"`
	Kind    string `json:"kind"`
	Instant bool   `json:"instant,omitempty"`
}

// FaultKindOutcome is what became of the faults of one requested kind.
type FaultKindOutcome struct {
	FaultKind
	Invoked    int `json:"invoked"`
	TookEffect int `json:"took_effect"` // completed ok
	Failed     int `json:"failed"`      // completed fail: certainly never happened
	// Unconfirmed completed info or never completed: they may have
	// happened, and their windows stay open until a heal is confirmed.
	Unconfirmed int `json:"unconfirmed"`
	// Healed counts faults that took effect and were then healed (an
	// instant fault is over when it takes effect).
	Healed int `json:"healed"`
	// Disk and power-cut kinds: Bit counts the healed faults whose
	// recorded effect shows they did something (fsyncs failed, corrupt
	// bytes read, bytes lost at the cut) or whose effect was not
	// recorded; NoEffect says, for the first few that did nothing, what
	// was recorded.
	Bit      int      `json:"bit,omitempty"`
	NoEffect []string `json:"no_effect,omitempty"`
	// Refused are starts refused after the kind's faults, as the nemesis
	// recorded them (a node that would not start after a power cut with
	// out-of-order pages: its message).
	Refused []string `json:"refused,omitempty"`
	// Errors are the first few errors its injections ended with.
	Errors []string `json:"errors,omitempty"`
}

// Cycled reports whether the kind was exercised at least once: invoked,
// took effect, and healed — and, for a disk or power-cut kind, did
// something to a disk (Bit).
func (o FaultKindOutcome) Cycled() bool {
	if isDiskKind(o.F) {
		return o.Bit > 0
	}
	return o.Healed > 0
}

func isDiskKind(f string) bool { return f == history.FDisk || f == history.FPowerCut }

// FailedHeal is a heal (heal-<f> or heal-all) that did not complete ok:
// the faults it was to end stay open.
type FailedHeal struct {
	F       string       `json:"f"`
	Time    int64        `json:"time"` // history time of its invoke
	Outcome history.Type `json:"outcome"`
	Error   string       `json:"error,omitempty"`
}

// FaultsDetails is the Details of a Faults result.
type FaultsDetails struct {
	Kinds       []FaultKindOutcome `json:"kinds"`
	FailedHeals []FailedHeal       `json:"failed_heals,omitempty"`
	// Unhealed are the windows of faults that may still have been in
	// effect when the history ended.
	Unhealed []FaultWindow `json:"unhealed,omitempty"`
	// Other counts fault invokes of kinds that were not requested.
	Other int `json:"other,omitempty"`
}

// Faults checks that the faults a run asked for happened: each requested
// kind needs at least one fault that was invoked, took effect (ok) and
// was healed by a heal that took effect — else the run exercised nothing
// of that kind, and the other checkers' true says nothing about it:
// Unknown, naming the kind. A fault still possibly in effect when the
// history ends (its heal failed, or never came) is Unknown too: what the
// nodes reported afterwards was read from a cluster that may still have
// been faulted. No requested kind is Unknown: there is nothing to vouch for.
//
// A disk or power-cut fault is exercised only if it did something
// (diskFaultEffect): one that took effect and was healed but whose
// recorded effect is zero — no fsync failed, no corrupt byte was read, a
// cut lost nothing — does not count, and a kind with no other is Unknown,
// "not exercised", saying what was recorded.
func Faults(ops []history.Op, requested []FaultKind) Result {
	return FaultsWithDisks(ops, requested, nil)
}

// FaultsWithDisks is Faults knowing each node's faultfs counters over the
// run (NodeEvidence.Disks), for disk faults whose heal recorded no effect.
func FaultsWithDisks(ops []history.Op, requested []FaultKind, totals map[string]DiskEffect) Result {
	const name = "faults"
	d := FaultsDetails{}
	windows, faults, heals, err := faultWindows(ops)
	if err != nil {
		return unknown(name, "cannot pair the nemesis ops: %v", err)
	}
	effects := healEffects(heals)
	for _, k := range requested {
		d.Kinds = append(d.Kinds, FaultKindOutcome{FaultKind: k})
	}
	kindOf := func(op history.Op) (int, error) {
		var fv history.FaultValue
		if len(op.Value) > 0 {
			var err error
			if fv, err = history.Decode[history.FaultValue](op); err != nil {
				return -1, err
			}
		}
		for i, k := range requested {
			// A fault that failed before its kind was resolved records the
			// kind's name instead (a slow-links without a mesh, say).
			if k.F == op.F && (k.Kind == fv.Kind || k.Name == fv.Kind) {
				return i, nil
			}
		}
		return -1, nil
	}
	// Failed faults have no window; count them from the pairs.
	nemesis := make([]history.Op, 0)
	for _, op := range ops {
		if op.Process == history.Nemesis {
			nemesis = append(nemesis, op)
		}
	}
	pairs, err := history.Pairs(nemesis)
	if err != nil {
		return unknown(name, "cannot pair the nemesis ops: %v", err)
	}
	windowOf := map[int64]FaultWindow{} // by invoke index
	for i, p := range faults {
		windowOf[p.Invoke.Index] = windows[i]
	}
	for _, p := range pairs {
		if _, heal := history.HealedBy(p.Invoke.F); heal {
			continue
		}
		i, err := kindOf(p.Invoke)
		if err != nil {
			return unknown(name, "%v", err)
		}
		if i < 0 {
			d.Other++
			continue
		}
		o := &d.Kinds[i]
		o.Invoked++
		switch p.Type() {
		case history.OK:
			o.TookEffect++
			if w, ok := windowOf[p.Invoke.Index]; ok && w.Healed {
				o.Healed++
				if isDiskKind(p.Invoke.F) {
					switch fe := diskFaultEffect(w, p.Completion, effects, totals); {
					case fe.bit || !fe.known:
						o.Bit++
					case len(o.NoEffect) < 3:
						o.NoEffect = append(o.NoEffect, fmt.Sprintf("%s: %s", w, fe.what))
					}
				}
			}
		case history.Fail:
			o.Failed++
		default:
			o.Unconfirmed++
		}
		if p.Completion.Error != "" && len(o.Errors) < 3 {
			o.Errors = append(o.Errors, p.Completion.Error)
		}
	}
	for _, p := range heals {
		if p.Type() != history.OK {
			d.FailedHeals = append(d.FailedHeals, FailedHeal{F: p.Invoke.F, Time: p.Invoke.Time, Outcome: p.Type(), Error: p.Completion.Error})
		}
	}
	for _, w := range windows {
		if !w.Healed {
			d.Unhealed = append(d.Unhealed, w)
		}
	}

	if len(requested) == 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no fault kind was requested: nothing to check"}
	}
	var problems, fine []string
	for _, o := range d.Kinds {
		switch {
		case o.Cycled() && isDiskKind(o.F) && o.Bit < o.Healed:
			fine = append(fine, fmt.Sprintf("%s ×%d (%d did nothing to a disk)", o.Name, o.Bit, o.Healed-o.Bit))
		case o.Cycled():
			fine = append(fine, fmt.Sprintf("%s ×%d", o.Name, o.Healed))
		case o.Invoked == 0:
			problems = append(problems, o.Name+" was never injected")
		case o.Healed > 0 && isDiskKind(o.F):
			p := fmt.Sprintf("%s not exercised: took effect and was healed %d times but did nothing to a disk", o.Name, o.Healed)
			if len(o.NoEffect) > 0 {
				p += " (first: " + o.NoEffect[0] + ")"
			}
			problems = append(problems, p)
		case o.TookEffect == 0:
			p := fmt.Sprintf("%s never took effect (%d invoked: %d failed, %d unconfirmed)", o.Name, o.Invoked, o.Failed, o.Unconfirmed)
			if len(o.Errors) > 0 {
				p += "; first error: " + o.Errors[0]
			}
			problems = append(problems, p)
		default:
			problems = append(problems, fmt.Sprintf("%s took effect %d times but was never healed", o.Name, o.TookEffect))
		}
	}
	if len(d.Unhealed) > 0 {
		labels := make([]string, len(d.Unhealed))
		for i, w := range d.Unhealed {
			labels[i] = w.String()
		}
		p := "faults possibly still in effect at the end: " + strings.Join(labels, "; ")
		if len(d.FailedHeals) > 0 {
			h := d.FailedHeals[len(d.FailedHeals)-1]
			p += fmt.Sprintf(" (last failed heal: %s %s", h.F, h.Outcome)
			if h.Error != "" {
				p += ": " + h.Error
			}
			p += ")"
		}
		problems = append(problems, p)
	}
	if len(problems) > 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: strings.Join(problems, "; ")}
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: "every requested fault kind took effect and was healed: " + strings.Join(fine, ", ")}
}
