package history

// FClock is the f of clock faults (clock-skew, clock-jump): FaultValue.Kind
// is "skew" or "jump", Params a ClockParams. Its heal, heal-clock, sets
// every target's clock back to the true one.
const FClock = "clock"

// ClockParams is the Params of a clock fault: how far each target's clock
// was moved (its clock minus the true one, in ms) and the bound the nodes
// run with (--max-clock-skew, in ms), so that a checker knows which nodes
// were beyond it without reading the run's configuration.
type ClockParams struct {
	OffsetsMS map[string]int64 `json:"offsets_ms"`
	BoundMS   int64            `json:"bound_ms"`
}
