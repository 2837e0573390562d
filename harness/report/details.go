package report

import (
	"encoding/json"
	"sort"

	"github.com/tidaldb/tidal/harness/checker"
)

// detailsAs returns r's details as T. Results fresh from a checker carry
// T (or *T); results read back from results.json carry generic JSON,
// which is decoded through a JSON round trip. ok is false when the
// details are absent or not a T.
func detailsAs[T any](r checker.Result) (T, bool) {
	var zero T
	switch d := r.Details.(type) {
	case nil:
		return zero, false
	case T:
		return d, true
	case *T:
		if d == nil {
			return zero, false
		}
		return *d, true
	}
	b, err := json.Marshal(r.Details)
	if err != nil {
		return zero, false
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return zero, false
	}
	return v, true
}

// resultNamed returns the first result with the given checker name.
func resultNamed(rs []checker.Result, name string) (checker.Result, bool) {
	for _, r := range rs {
		if r.Name == name {
			return r, true
		}
	}
	return checker.Result{}, false
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
