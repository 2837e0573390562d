package checker

import "github.com/tidaldb/tidal/harness/history"

// FaultWindowValues is FaultWindows with what the nemesis recorded of each
// fault: its completion's value when it took effect (that carries what
// only the effect tells, a partition's grudge), else its invoke's. The
// report draws per-node lanes from them.
func FaultWindowValues(ops []history.Op) ([]FaultWindow, []history.FaultValue, error) {
	windows, of, _, err := faultWindows(ops)
	if err != nil {
		return nil, nil, err
	}
	values := make([]history.FaultValue, len(windows))
	for i, p := range of {
		op := p.Invoke
		if p.Type() == history.OK && len(p.Completion.Value) > 0 {
			op = p.Completion
		}
		if len(op.Value) == 0 {
			continue
		}
		if values[i], err = history.Decode[history.FaultValue](op); err != nil {
			return nil, nil, err
		}
	}
	return windows, values, nil
}
