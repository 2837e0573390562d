package ledger

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Event is one engagement signal. TS is unix milliseconds; the node stamps
// it before the write is logged when the client gave none, so every
// replica folds the same value.
type Event struct {
	ID     string
	Entity uint64
	Signal string
	Weight float64
	TS     int64
}

// Bounds on event fields, checked by ValidateEvent.
const (
	MaxIDLen = 128
	// MaxWeight keeps weight sums and decayed sums far from float64
	// overflow whatever the number of events.
	MaxWeight = 1e9
	// MinTS and MaxTS (2000-01-01 and 2100-01-01 in unix ms) catch the
	// common unit mistakes: seconds land below MinTS, micro- and
	// nanoseconds above MaxTS.
	MinTS int64 = 946684800000
	MaxTS int64 = 4102444800000
)

// FieldError names the offending field relative to the value checked
// (e.g. "weight" for an event, "signals[2].half_life" for a schema); an
// API layer prefixes it with the event's position ("events[3].").
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// EventError is a FieldError located in a batch: Index is the event's
// position. Error() reads "events[3].weight: ...".
type EventError struct {
	Index int
	Err   *FieldError
}

func (e *EventError) Error() string {
	return fmt.Sprintf("events[%d].%s: %s", e.Index, e.Err.Field, e.Err.Message)
}

func (e *EventError) Unwrap() error { return e.Err }

// ConflictError reports an event id already used with a different payload
// (entity, signal or weight). The whole batch is refused.
type ConflictError struct {
	Index    int      // position of the offending event in its batch
	ID       string   // the reused id
	Entity   uint64   // the offending event's payload
	Signal   string   //
	Weight   float64  //
	Previous Location // where the id was first used; Index 0 = earlier in the same, not yet logged, batch
}

func (e *ConflictError) Error() string {
	where := fmt.Sprintf("log index %d (term %d) position %d", e.Previous.Index, e.Previous.Term, e.Previous.Position)
	if e.Previous.Index == 0 {
		where = fmt.Sprintf("events[%d] of this batch", e.Previous.Position)
	}
	return fmt.Sprintf("events[%d].id: id %q was applied at %s as {entity %d, signal %q, weight %s}, found {entity %d, signal %q, weight %s}",
		e.Index, e.ID, where,
		e.Previous.Entity, e.Previous.Signal, fmtWeight(e.Previous.Weight),
		e.Entity, e.Signal, fmtWeight(e.Weight))
}

// ErrAlreadyApplied is wrapped by the error of Apply, ApplyAt and Consume
// when the command's position (entry index, first position: see Span) is
// below the applied position: applying a log position twice would fold
// its events twice, so it is refused as a replay.
var ErrAlreadyApplied = errors.New("ledger: log index already applied")

func fmtWeight(w float64) string { return strconv.FormatFloat(w, 'g', -1, 64) }

// ValidateEvent checks one event against the schema. Rules and why:
//   - id: 1..128 bytes of visible ASCII (0x21-0x7E), so ids are safe in
//     logs, NDJSON and (percent-encoded) URL paths;
//   - signal: declared in the schema;
//   - weight: finite and 0 < weight <= MaxWeight. Zero and negative weights
//     are refused: scores rank engagement, and a negative weight would let
//     one client cancel others' signals. The API substitutes 1 when the
//     client omits the weight;
//   - ts: unix ms within [MinTS, MaxTS). Closeness to "now" is the node's
//     business (the ledger reads no clock).
func (s Schema) ValidateEvent(e Event) *FieldError {
	if e.ID == "" || len(e.ID) > MaxIDLen {
		return &FieldError{Field: "id", Message: fmt.Sprintf("expected 1..%d bytes, found %d", MaxIDLen, len(e.ID))}
	}
	for i := 0; i < len(e.ID); i++ {
		if c := e.ID[i]; c < 0x21 || c > 0x7e {
			return &FieldError{Field: "id", Message: fmt.Sprintf("expected visible ASCII, found byte 0x%02x at offset %d", c, i)}
		}
	}
	if s.signalIndex(e.Signal) < 0 {
		return &FieldError{Field: "signal", Message: fmt.Sprintf("unknown signal %q (schema declares %s)", e.Signal, s.signalNames())}
	}
	if math.IsNaN(e.Weight) || math.IsInf(e.Weight, 0) || e.Weight <= 0 || e.Weight > MaxWeight {
		return &FieldError{Field: "weight", Message: fmt.Sprintf("expected a finite number in (0, %g], found %s", float64(MaxWeight), fmtWeight(e.Weight))}
	}
	if e.TS < MinTS || e.TS >= MaxTS {
		return &FieldError{Field: "ts", Message: fmt.Sprintf("expected unix milliseconds in [%d, %d) (years 2000..2099), found %d", MinTS, MaxTS, e.TS)}
	}
	return nil
}

func (s Schema) signalIndex(name string) int {
	for i, st := range s.Signals {
		if st.Name == name {
			return i
		}
	}
	return -1
}

func (s Schema) signalNames() string {
	out := ""
	for i, st := range s.Signals {
		if i > 0 {
			out += ", "
		}
		out += strconv.Quote(st.Name)
	}
	return out
}
