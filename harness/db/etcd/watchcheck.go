package etcd

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/report"
)

// WatchAnomaly is one thing a watcher saw that etcd's watch guarantees
// rule out.
type WatchAnomaly struct {
	Node string `json:"node"`
	// Kind: "missed" (an append at a revision the watcher passed, never
	// delivered), "duplicated", "out-of-order", "phantom" (delivered, but
	// no node holds that key at that revision).
	Kind string `json:"kind"`
	Key  string `json:"key"`
	Rev  uint64 `json:"rev"`
	Line int    `json:"line,omitempty"`
}

// WatchAnomalies counts every anomaly and keeps the first few.
type WatchAnomalies struct {
	Count    int            `json:"count"`
	Examples []WatchAnomaly `json:"examples,omitempty"`
}

// Add counts a, keeping it as an example while there are fewer than 20.
func (w *WatchAnomalies) Add(a WatchAnomaly) {
	w.Count++
	if len(w.Examples) < 20 {
		w.Examples = append(w.Examples, a)
	}
}

// WatchDetails is the Details of a CheckWatch result.
type WatchDetails struct {
	Nodes     map[string]int    `json:"events_by_node"`
	Reconnect map[string]int    `json:"reconnects_by_node"`
	Unfinish  map[string]string `json:"not_finished,omitempty"`
	Anomalies WatchAnomalies    `json:"anomalies"`
}

// CheckWatch checks what every node's watcher of the append prefix saw
// against the keys the nodes hold after the heal (the audits: key ->
// revision, agreed by the ledger checker): every event delivered once, in
// revision order, with no gaps up to the revision the watcher reached,
// and none that no node holds — etcd's documented watch guarantees
// (ordered, unique, reliable, resumable from a revision). A watcher that
// never reached the final revision makes the result unknown.
func CheckWatch(run *report.Run, audits map[string][]checker.AuditEntry) checker.Result {
	const name = "watch"
	expected := map[string]uint64{}
	for _, entries := range audits {
		for _, e := range entries {
			expected[appendPrefix+e.ID] = e.Index
		}
	}
	d := WatchDetails{Nodes: map[string]int{}, Reconnect: map[string]int{}, Unfinish: map[string]string{}}
	files, _ := filepath.Glob(filepath.Join(run.NodesDir(), "*", WatchFile))
	if len(files) == 0 {
		return checker.Result{Name: name, Valid: checker.Unknown, Details: d, Summary: "no watch files in the run store"}
	}
	sort.Strings(files)
	for _, path := range files {
		node := filepath.Base(filepath.Dir(path))
		if err := checkWatchFile(node, path, expected, &d); err != nil {
			return checker.Result{Name: name, Valid: checker.Unknown, Details: d, Summary: err.Error()}
		}
	}
	var counts []string
	for _, n := range sortedKeys(d.Nodes) {
		counts = append(counts, fmt.Sprintf("%s %d", n, d.Nodes[n]))
	}
	switch {
	case d.Anomalies.Count > 0:
		by := map[string]int{}
		for _, a := range d.Anomalies.Examples {
			by[a.Kind]++
		}
		return checker.Result{Name: name, Valid: checker.Invalid, Details: d,
			Summary: fmt.Sprintf("%d watch anomalies (first kinds %v); events %s", d.Anomalies.Count, by, strings.Join(counts, ", "))}
	case len(d.Unfinish) > 0:
		var why []string
		for _, n := range sortedKeys(d.Unfinish) {
			why = append(why, n+": "+d.Unfinish[n])
		}
		return checker.Result{Name: name, Valid: checker.Unknown, Details: d,
			Summary: "watchers did not reach the final revision: " + strings.Join(why, "; ")}
	}
	return checker.Result{Name: name, Valid: checker.Valid, Details: d,
		Summary: fmt.Sprintf("every watcher saw every append once, in revision order, no gaps (events %s; %d reconnects)", strings.Join(counts, ", "), sum(d.Reconnect))}
}

func checkWatchFile(node, path string, expected map[string]uint64, d *WatchDetails) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	seen := map[string]uint64{}
	var prev, end uint64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for line := 1; sc.Scan(); line++ {
		var l WatchLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("%s line %d: %w", path, line, err)
		}
		switch {
		case l.Start > 0:
			d.Reconnect[node]++
		case l.End > 0:
			end = l.End
		case l.Key != "":
			d.Nodes[node]++
			a := WatchAnomaly{Node: node, Key: l.Key, Rev: l.Rev, Line: line}
			if r, dup := seen[l.Key]; dup && r == l.Rev {
				a.Kind = "duplicated"
				d.Anomalies.Add(a)
			} else if l.Rev < prev {
				a.Kind = "out-of-order"
				d.Anomalies.Add(a)
			} else if want, ok := expected[l.Key]; !ok || want != l.Rev {
				a.Kind = "phantom"
				d.Anomalies.Add(a)
			}
			seen[l.Key] = l.Rev
			if l.Rev > prev {
				prev = l.Rev
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	d.Reconnect[node]-- // the first start is not a reconnect
	if end == 0 {
		d.Unfinish[node] = fmt.Sprintf("stopped at revision %d", prev)
		end = prev
	}
	var missed []WatchAnomaly
	for k, rev := range expected {
		if rev <= end && seen[k] != rev {
			missed = append(missed, WatchAnomaly{Node: node, Kind: "missed", Key: k, Rev: rev})
		}
	}
	sort.Slice(missed, func(i, j int) bool {
		return missed[i].Rev < missed[j].Rev || missed[i].Rev == missed[j].Rev && missed[i].Key < missed[j].Key
	})
	for _, m := range missed {
		d.Anomalies.Add(m)
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sum(m map[string]int) int {
	t := 0
	for _, v := range m {
		t += v
	}
	return t
}
