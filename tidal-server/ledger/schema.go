package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Schema declares the signal types the ledger accepts and the embedding
// dimension the vectors package enforces. Every node of a cluster must run
// with the same schema: it shapes the replicated state, so Snapshot records
// the signal part of it and Restore refuses a snapshot taken under another.
type Schema struct {
	Signals      []SignalType `yaml:"signals"`
	EmbeddingDim int          `yaml:"embedding_dim"`
}

// SignalType is one kind of engagement event. HalfLife drives the decayed
// score; Windows are the sliding windows whose counts the ledger keeps.
type SignalType struct {
	Name     string
	HalfLife time.Duration
	Windows  []Window
}

// Window is a sliding count window. Name is how queries refer to it (the
// string written in the schema, e.g. "1h"); Duration 0 is the "all" window,
// the total count.
type Window struct {
	Name     string
	Duration time.Duration
}

// Limits a schema must respect. They keep per-key state small and the
// snapshot format simple; nothing in practice needs more.
const (
	MaxSignals          = 64
	MaxWindowsPerSignal = 16
	MaxEmbeddingDim     = 65536
	// DefaultEmbeddingDim is the width of the reference deployment's
	// embeddings.
	DefaultEmbeddingDim = 1536
	// BucketsPerWindow is how many buckets a window is cut into; a window
	// of duration W counts in buckets of W/BucketsPerWindow (see doc.go
	// for the resulting error bound).
	BucketsPerWindow = 60
)

var signalNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// DefaultSchema is the schema used when no --schema file is given.
// Half-lives reflect how long each signal stays informative: a view is
// stale within hours, a share matters for a week.
func DefaultSchema() Schema {
	return Schema{
		Signals: []SignalType{
			{Name: "view", HalfLife: 6 * time.Hour, Windows: defaultWindows()},
			{Name: "like", HalfLife: 72 * time.Hour, Windows: defaultWindows()},
			{Name: "share", HalfLife: 168 * time.Hour, Windows: defaultWindows()},
			{Name: "skip", HalfLife: 24 * time.Hour, Windows: defaultWindows()},
		},
		EmbeddingDim: DefaultEmbeddingDim,
	}
}

func defaultWindows() []Window {
	return []Window{{"1h", time.Hour}, {"24h", 24 * time.Hour}, {"all", 0}}
}

// Signal returns the signal type with the given name.
func (s Schema) Signal(name string) (SignalType, bool) {
	for _, st := range s.Signals {
		if st.Name == name {
			return st, true
		}
	}
	return SignalType{}, false
}

// Validate checks the schema; the error names the offending field the way
// the YAML file spells it ("signals[2].windows[1]: ...").
func (s Schema) Validate() error {
	if len(s.Signals) == 0 {
		return &FieldError{Field: "signals", Message: "expected at least one signal type, found none"}
	}
	if len(s.Signals) > MaxSignals {
		return &FieldError{Field: "signals", Message: fmt.Sprintf("expected at most %d signal types, found %d", MaxSignals, len(s.Signals))}
	}
	if s.EmbeddingDim <= 0 || s.EmbeddingDim > MaxEmbeddingDim {
		return &FieldError{Field: "embedding_dim", Message: fmt.Sprintf("expected 1..%d, found %d", MaxEmbeddingDim, s.EmbeddingDim)}
	}
	seen := map[string]int{}
	for i, st := range s.Signals {
		at := func(f string) string { return fmt.Sprintf("signals[%d]%s", i, f) }
		if !signalNameRE.MatchString(st.Name) {
			return &FieldError{Field: at(".name"), Message: fmt.Sprintf("expected a lower-case name matching %s, found %q", signalNameRE, st.Name)}
		}
		if j, dup := seen[st.Name]; dup {
			return &FieldError{Field: at(".name"), Message: fmt.Sprintf("signal %q already declared at signals[%d]", st.Name, j)}
		}
		seen[st.Name] = i
		if st.HalfLife < time.Millisecond {
			return &FieldError{Field: at(".half_life"), Message: fmt.Sprintf("expected a duration of at least 1ms, found %v", st.HalfLife)}
		}
		if len(st.Windows) > MaxWindowsPerSignal {
			return &FieldError{Field: at(".windows"), Message: fmt.Sprintf("expected at most %d windows, found %d", MaxWindowsPerSignal, len(st.Windows))}
		}
		names := map[string]int{}
		durations := map[time.Duration]int{}
		for j, w := range st.Windows {
			wf := at(fmt.Sprintf(".windows[%d]", j))
			if w.Name == "" || len(w.Name) > 32 {
				return &FieldError{Field: wf, Message: fmt.Sprintf("expected a window name of 1..32 bytes, found %q", w.Name)}
			}
			if k, dup := names[w.Name]; dup {
				return &FieldError{Field: wf, Message: fmt.Sprintf("window %q already declared at windows[%d]", w.Name, k)}
			}
			names[w.Name] = j
			if k, dup := durations[w.Duration]; dup {
				return &FieldError{Field: wf, Message: fmt.Sprintf("window %q has the same duration as windows[%d]", w.Name, k)}
			}
			durations[w.Duration] = j
			// Whole minutes make the bucket width (W/60) a whole number of
			// seconds, so bucket boundaries are exact in unix ms.
			if w.Duration < 0 || w.Duration%time.Minute != 0 {
				return &FieldError{Field: wf, Message: fmt.Sprintf("expected \"all\" or a whole number of minutes, found %v", w.Duration)}
			}
		}
	}
	return nil
}

// LoadSchema reads and parses a YAML schema file.
func LoadSchema(path string) (Schema, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Schema{}, fmt.Errorf("ledger: reading schema: %w", err)
	}
	s, err := ParseSchema(data)
	if err != nil {
		return Schema{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ParseSchema parses a YAML schema:
//
//	embedding_dim: 768          # optional, default 1536
//	signals:                    # optional, default: DefaultSchema's signals
//	  - name: view
//	    half_life: 6h           # Go duration, or whole days as "7d"
//	    windows: [1h, 24h, all] # optional, default [1h, 24h, all]
//
// Unknown keys are errors (a typo such as "halflife" must not silently
// fall back to a default). Errors name the field and its line.
func ParseSchema(data []byte) (Schema, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return Schema{}, &FieldError{Field: "schema", Message: "expected a YAML mapping, found an empty document"}
		}
		return Schema{}, &FieldError{Field: "schema", Message: err.Error()}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	s := Schema{EmbeddingDim: DefaultEmbeddingDim}
	err := eachKey(root, "", func(key string, v *yaml.Node) error {
		switch key {
		case "embedding_dim":
			n, err := strconv.Atoi(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil {
				return nodeError(v, "embedding_dim", "expected an integer, found "+describe(v))
			}
			s.EmbeddingDim = n
		case "signals":
			if v.Kind != yaml.SequenceNode {
				return nodeError(v, "signals", "expected a list of signal types, found "+describe(v))
			}
			s.Signals = []SignalType{}
			for i, item := range v.Content {
				st, err := parseSignal(item, fmt.Sprintf("signals[%d]", i))
				if err != nil {
					return err
				}
				s.Signals = append(s.Signals, st)
			}
		default:
			return nodeError(v, key, "unknown field (expected signals or embedding_dim)")
		}
		return nil
	})
	if err != nil {
		return Schema{}, err
	}
	if s.Signals == nil {
		s.Signals = DefaultSchema().Signals
	}
	if err := s.Validate(); err != nil {
		return Schema{}, err
	}
	return s, nil
}

func parseSignal(n *yaml.Node, path string) (SignalType, error) {
	var st SignalType
	var sawHalfLife, sawWindows bool
	err := eachKey(n, path, func(key string, v *yaml.Node) error {
		field := path + "." + key
		switch key {
		case "name":
			if v.Kind != yaml.ScalarNode {
				return nodeError(v, field, "expected a string, found "+describe(v))
			}
			st.Name = v.Value
		case "half_life":
			d, err := parseDuration(v.Value)
			if v.Kind != yaml.ScalarNode || err != nil {
				return nodeError(v, field, "expected a duration such as 6h or 7d, found "+describe(v))
			}
			st.HalfLife = d
			sawHalfLife = true
		case "windows":
			if v.Kind != yaml.SequenceNode {
				return nodeError(v, field, "expected a list such as [1h, 24h, all], found "+describe(v))
			}
			sawWindows = true
			for j, wn := range v.Content {
				wf := fmt.Sprintf("%s[%d]", field, j)
				if wn.Kind != yaml.ScalarNode {
					return nodeError(wn, wf, "expected a duration or \"all\", found "+describe(wn))
				}
				if wn.Value == "all" {
					st.Windows = append(st.Windows, Window{Name: "all"})
					continue
				}
				d, err := parseDuration(wn.Value)
				if err != nil || d <= 0 {
					return nodeError(wn, wf, "expected a positive duration such as 1h or 7d, or \"all\", found "+describe(wn))
				}
				st.Windows = append(st.Windows, Window{Name: wn.Value, Duration: d})
			}
		default:
			return nodeError(v, field, "unknown field (expected name, half_life or windows)")
		}
		return nil
	})
	if err != nil {
		return SignalType{}, err
	}
	if !sawHalfLife {
		return SignalType{}, nodeError(n, path+".half_life", "required field is missing")
	}
	if !sawWindows {
		st.Windows = defaultWindows()
	}
	return st, nil
}

func eachKey(n *yaml.Node, path string, fn func(key string, v *yaml.Node) error) error {
	if n.Kind != yaml.MappingNode {
		where := path
		if where == "" {
			where = "schema"
		}
		return nodeError(n, where, "expected a mapping, found "+describe(n))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := k.Value
		if path != "" {
			field = path + "." + k.Value
		}
		if seen[k.Value] {
			return nodeError(k, field, "duplicate key")
		}
		seen[k.Value] = true
		if err := fn(k.Value, v); err != nil {
			return err
		}
	}
	return nil
}

func nodeError(n *yaml.Node, field, msg string) error {
	return &FieldError{Field: field, Message: fmt.Sprintf("%s (line %d)", msg, n.Line)}
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	default:
		return "nothing"
	}
}

// parseDuration accepts Go durations plus whole days ("7d"), the unit
// people reach for with half-lives and windows and Go lacks.
func parseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n < 0 || n > 365*100 {
			return 0, fmt.Errorf("invalid day count %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}
