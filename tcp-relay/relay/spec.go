package relay

import (
	"fmt"
	"time"
)

// Spec is the wire and config form of a Fault: a type name plus flat
// attributes, as in Toxiproxy. Attributes that do not belong to the type
// must be zero; this catches "jitter_ms on bandwidth" typos instead of
// silently ignoring them.
type Spec struct {
	Name      string    `json:"name,omitempty" yaml:"name,omitempty"`
	Type      string    `json:"type" yaml:"type"`
	Direction Direction `json:"direction,omitempty" yaml:"direction,omitempty"`
	// Toxicity defaults to 1 when absent.
	Toxicity *float64 `json:"toxicity,omitempty" yaml:"toxicity,omitempty"`

	LatencyMS     int64 `json:"latency_ms,omitempty" yaml:"latency_ms,omitempty"`
	JitterMS      int64 `json:"jitter_ms,omitempty" yaml:"jitter_ms,omitempty"`
	RateBytes     int64 `json:"rate_bytes,omitempty" yaml:"rate_bytes,omitempty"`
	AverageSize   int64 `json:"average_size,omitempty" yaml:"average_size,omitempty"`
	SizeVariation int64 `json:"size_variation,omitempty" yaml:"size_variation,omitempty"`
	DelayUS       int64 `json:"delay_us,omitempty" yaml:"delay_us,omitempty"`
	Bytes         int64 `json:"bytes,omitempty" yaml:"bytes,omitempty"`
	TimeoutMS     int64 `json:"timeout_ms,omitempty" yaml:"timeout_ms,omitempty"`
}

// FieldError is a Spec (or other input) rejected because of one field.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Msg) }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Types lists every fault type with its attributes, for --help and errors.
var Types = []struct{ Type, Attributes, Doc string }{
	{"blackhole", "", "forward nothing, keep connections open (sender sees TCP backpressure)"},
	{"reject", "", "close new connections at once with RST; existing ones untouched"},
	{"reset", "", "RST existing connections now and new ones while installed (direction picks the side)"},
	{"latency", "latency_ms, jitter_ms", "delay each chunk by latency ± jitter, order preserved"},
	{"bandwidth", "rate_bytes", "cap throughput at rate_bytes per second"},
	{"slicer", "average_size, size_variation, delay_us", "split data into small writes with a delay between them"},
	{"limit_data", "bytes", "close the connection after bytes bytes in the direction"},
	{"timeout", "timeout_ms", "stop forwarding; close after timeout_ms (0: hold until removed)"},
}

// Fault validates s and builds the Fault it describes.
func (s Spec) Fault() (Fault, error) {
	f := Fault{Name: s.Name, Direction: s.Direction, Toxicity: 1}
	if f.Direction == "" {
		f.Direction = Both
	}
	switch f.Direction {
	case Upstream, Downstream, Both:
	default:
		return Fault{}, fieldErr("direction", "expected upstream, downstream or both, found %q", s.Direction)
	}
	if s.Toxicity != nil {
		f.Toxicity = *s.Toxicity
		if !(f.Toxicity >= 0 && f.Toxicity <= 1) {
			return Fault{}, fieldErr("toxicity", "expected a probability in [0,1], found %v", f.Toxicity)
		}
	}
	attrs := []struct {
		field string
		v     int64
		used  bool
	}{
		{"latency_ms", s.LatencyMS, s.Type == "latency"},
		{"jitter_ms", s.JitterMS, s.Type == "latency"},
		{"rate_bytes", s.RateBytes, s.Type == "bandwidth"},
		{"average_size", s.AverageSize, s.Type == "slicer"},
		{"size_variation", s.SizeVariation, s.Type == "slicer"},
		{"delay_us", s.DelayUS, s.Type == "slicer"},
		{"bytes", s.Bytes, s.Type == "limit_data"},
		{"timeout_ms", s.TimeoutMS, s.Type == "timeout"},
	}
	for _, a := range attrs {
		if a.v < 0 {
			return Fault{}, fieldErr(a.field, "expected a value >= 0, found %d", a.v)
		}
		if a.v != 0 && !a.used {
			return Fault{}, fieldErr(a.field, "not an attribute of fault type %q", s.Type)
		}
	}
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	switch s.Type {
	case "blackhole":
		f.Toxic = Blackhole{}
	case "reject":
		f.Toxic = Reject{}
	case "reset":
		f.Toxic = Reset{}
	case "latency":
		if s.JitterMS > s.LatencyMS {
			return Fault{}, fieldErr("jitter_ms", "expected at most latency_ms (%d), found %d", s.LatencyMS, s.JitterMS)
		}
		f.Toxic = Latency{Latency: ms(s.LatencyMS), Jitter: ms(s.JitterMS)}
	case "bandwidth":
		if s.RateBytes == 0 {
			return Fault{}, fieldErr("rate_bytes", "expected bytes per second > 0 (use blackhole to stop traffic)")
		}
		f.Toxic = Bandwidth{Rate: s.RateBytes}
	case "slicer":
		if s.AverageSize == 0 {
			return Fault{}, fieldErr("average_size", "expected a slice size > 0")
		}
		if s.SizeVariation >= s.AverageSize {
			return Fault{}, fieldErr("size_variation", "expected less than average_size (%d), found %d", s.AverageSize, s.SizeVariation)
		}
		f.Toxic = Slicer{AverageSize: int(s.AverageSize), SizeVariation: int(s.SizeVariation), Delay: time.Duration(s.DelayUS) * time.Microsecond}
	case "limit_data":
		f.Toxic = LimitData{Bytes: s.Bytes}
	case "timeout":
		f.Toxic = Timeout{Timeout: ms(s.TimeoutMS)}
	case "":
		return Fault{}, fieldErr("type", "missing; expected one of blackhole, reject, reset, latency, bandwidth, slicer, limit_data, timeout")
	default:
		return Fault{}, fieldErr("type", "expected one of blackhole, reject, reset, latency, bandwidth, slicer, limit_data, timeout, found %q", s.Type)
	}
	if f.Name == "" {
		f.Name = s.Type + "_" + string(f.Direction)
	}
	if err := checkName(f.Name); err != nil {
		return Fault{}, err
	}
	return f, nil
}

// checkName keeps names usable verbatim in URL paths.
func checkName(name string) error {
	if name == "" || len(name) > 128 {
		return fieldErr("name", "expected 1 to 128 characters, found %d", len(name))
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.' || r == ':') {
			return fieldErr("name", "expected letters, digits and _-.: only, found %q in %q", r, name)
		}
	}
	return nil
}

// CheckName reports whether name is a valid relay or fault name.
func CheckName(name string) error { return checkName(name) }

// Spec returns the wire form of f.
func (f Fault) Spec() Spec {
	tox := f.Toxicity
	s := Spec{Name: f.Name, Type: f.Toxic.Type(), Direction: f.Direction, Toxicity: &tox}
	switch t := f.Toxic.(type) {
	case Latency:
		s.LatencyMS, s.JitterMS = t.Latency.Milliseconds(), t.Jitter.Milliseconds()
	case Bandwidth:
		s.RateBytes = t.Rate
	case Slicer:
		s.AverageSize, s.SizeVariation, s.DelayUS = int64(t.AverageSize), int64(t.SizeVariation), t.Delay.Microseconds()
	case LimitData:
		s.Bytes = t.Bytes
	case Timeout:
		s.TimeoutMS = t.Timeout.Milliseconds()
	}
	return s
}
