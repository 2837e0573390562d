package ledger

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func sha256Sum(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

func TestDefaultSchemaValidates(t *testing.T) {
	s := DefaultSchema()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.EmbeddingDim != 1536 || len(s.Signals) != 4 {
		t.Fatalf("unexpected default schema %+v", s)
	}
}

func TestParseSchema(t *testing.T) {
	s, err := ParseSchema([]byte(`
embedding_dim: 768
signals:
  - name: view
    half_life: 6h
    windows: [1h, 24h, all]
  - name: purchase
    half_life: 30d
    windows: [7d, 90m]
  - name: dwell
    half_life: 90s
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Schema{EmbeddingDim: 768, Signals: []SignalType{
		{Name: "view", HalfLife: 6 * time.Hour, Windows: []Window{{"1h", time.Hour}, {"24h", 24 * time.Hour}, {"all", 0}}},
		{Name: "purchase", HalfLife: 30 * 24 * time.Hour, Windows: []Window{{"7d", 7 * 24 * time.Hour}, {"90m", 90 * time.Minute}}},
		{Name: "dwell", HalfLife: 90 * time.Second, Windows: defaultWindows()},
	}}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("got %+v\nwant %+v", s, want)
	}
	s, err = ParseSchema([]byte("embedding_dim: 8\n"))
	if err != nil || !reflect.DeepEqual(s.Signals, DefaultSchema().Signals) {
		t.Fatalf("omitted signals should default: %+v %v", s, err)
	}
}

func TestParseSchemaErrorsNameTheField(t *testing.T) {
	cases := []struct{ yaml, want string }{
		{``, "schema: expected a YAML mapping"},
		{`[1, 2]`, "schema: expected a mapping, found a list"},
		{`embedding_dim: wide`, `embedding_dim: expected an integer, found "wide" (line 1)`},
		{`embedding_dim: 0`, "embedding_dim: expected 1..65536, found 0"},
		{`signal: []`, "signal: unknown field"},
		{`signals: {}`, "signals: expected a list"},
		{`signals: []`, "signals: expected at least one signal type"},
		{"signals:\n  - name: view\n    halflife: 6h", "signals[0].halflife: unknown field (expected name, half_life or windows) (line 3)"},
		{"signals:\n  - name: view", "signals[0].half_life: required field is missing"},
		{"signals:\n  - {name: view, half_life: 6h}\n  - {name: like, half_life: 1h}\n  - {name: share, half_life: soon}", `signals[2].half_life: expected a duration such as 6h or 7d, found "soon" (line 4)`},
		{"signals:\n  - {name: view, half_life: 0s}", "signals[0].half_life: expected a duration of at least 1ms"},
		{"signals:\n  - {name: View, half_life: 1h}", `signals[0].name: expected a lower-case name`},
		{"signals:\n  - {name: view, half_life: 1h}\n  - {name: view, half_life: 2h}", `signals[1].name: signal "view" already declared at signals[0]`},
		{"signals:\n  - {name: view, half_life: 1h, windows: [1h, 60m]}", `signals[0].windows[1]: window "60m" has the same duration as windows[0]`},
		{"signals:\n  - {name: view, half_life: 1h, windows: [90s]}", "signals[0].windows[0]: expected \"all\" or a whole number of minutes, found 1m30s"},
		{"signals:\n  - {name: view, half_life: 1h, windows: [-1h]}", `signals[0].windows[0]: expected a positive duration`},
		{"signals:\n  - {name: view, half_life: 1h, windows: [all, all]}", `signals[0].windows[1]: window "all" already declared`},
		{"signals:\n  - {name: view, half_life: 1h, windows: 1h}", "signals[0].windows: expected a list"},
		{"signals:\n  - {name: view, name: like, half_life: 1h}", "signals[0].name: duplicate key"},
	}
	for _, c := range cases {
		_, err := ParseSchema([]byte(c.yaml))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q:\n got  %v\n want %s...", c.yaml, err, c.want)
		}
	}
}

func TestLoadSchema(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "schema.yaml")
	if err := os.WriteFile(path, []byte("signals:\n  - {name: click, half_life: 2h, windows: [5m, all]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := LoadSchema(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Signals) != 1 || s.Signals[0].Name != "click" || s.EmbeddingDim != DefaultEmbeddingDim {
		t.Fatalf("got %+v", s)
	}
	if err := os.WriteFile(path, []byte("signals:\n  - {name: click}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSchema(path); err == nil || !strings.HasPrefix(err.Error(), path+": signals[0].half_life") {
		t.Fatalf("got %v, want the path and the field", err)
	}
	if _, err := LoadSchema(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("got %v", err)
	}
}
