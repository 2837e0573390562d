package checker

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/harness/history"
)

// Outcomes counts operations by how they ended. Pending ops (no
// completion in the history) count as info and are also counted apart.
type Outcomes struct {
	OK      int `json:"ok"`
	Fail    int `json:"fail"`
	Info    int `json:"info"`
	Pending int `json:"pending,omitempty"`
}

func (o *Outcomes) add(p history.Pair) {
	switch p.Type() {
	case history.OK:
		o.OK++
	case history.Fail:
		o.Fail++
	default:
		o.Info++
		if p.Pending {
			o.Pending++
		}
	}
}

// StatsDetails is the Details of a Stats result.
type StatsDetails struct {
	Total  Outcomes                       `json:"total"`
	ByF    map[string]Outcomes            `json:"by_f"`
	ByNode map[string]map[string]Outcomes `json:"by_node"` // node -> f -> outcomes
	Faults map[string]Outcomes            `json:"faults,omitempty"`
	// NeverOK lists client operations that never once succeeded.
	NeverOK []string `json:"never_ok,omitempty"`
}

// Stats counts client operation outcomes per f and per node, and nemesis
// ops per f (whether the faults a run asked for took effect is judged by
// Faults, not here). Like Jepsen's stats checker it refuses to vouch for a run in
// which some operation never succeeded — the other checkers then had
// nothing of it to check — but as Unknown, not Invalid: nothing was
// shown to be wrong.
func Stats(ops []history.Op) Result {
	const name = "stats"
	pairs, err := history.Pairs(ops)
	if err != nil {
		return unknown(name, "cannot pair the history: %v", err)
	}
	d := StatsDetails{ByF: map[string]Outcomes{}, ByNode: map[string]map[string]Outcomes{}, Faults: map[string]Outcomes{}}
	for _, p := range pairs {
		f := p.Invoke.F
		if !p.Invoke.Process.IsClient() {
			o := d.Faults[f]
			o.add(p)
			d.Faults[f] = o
			continue
		}
		d.Total.add(p)
		o := d.ByF[f]
		o.add(p)
		d.ByF[f] = o
		node := p.Invoke.Node
		if d.ByNode[node] == nil {
			d.ByNode[node] = map[string]Outcomes{}
		}
		o = d.ByNode[node][f]
		o.add(p)
		d.ByNode[node][f] = o
	}
	fs := make([]string, 0, len(d.ByF))
	for f := range d.ByF {
		fs = append(fs, f)
	}
	sort.Strings(fs)
	parts := make([]string, 0, len(fs))
	for _, f := range fs {
		o := d.ByF[f]
		if o.OK == 0 {
			d.NeverOK = append(d.NeverOK, f)
		}
		parts = append(parts, fmt.Sprintf("%s %d ok/%d fail/%d info", f, o.OK, o.Fail, o.Info))
	}
	switch {
	case len(fs) == 0:
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no client operations"}
	case len(d.NeverOK) > 0:
		return Result{Name: name, Valid: Unknown, Details: d, Summary: fmt.Sprintf("%s never succeeded; %s", strings.Join(d.NeverOK, ", "), strings.Join(parts, "; "))}
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: strings.Join(parts, "; ")}
}
