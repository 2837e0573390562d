package checker

import (
	"fmt"
	"regexp"
	"slices"

	"github.com/tidaldb/tidal/harness/history"
)

// Exits a disk fault asks for. A node whose fsync fails or whose disk is
// full must stop writing: tidal-server fences itself and exits with
// status 4 ("fenced", README exit statuses). A node that reads its log
// back corrupt must refuse it, naming the file and offset, and not serve
// what it read. Neither is a crash while that fault acts on that node;
// the same exit anywhere else is one, and so is a second exit on its own
// within one fault (the node came back only to fail again: a crash loop).

// ExitFenced is tidal-server's exit status after a failed disk write or
// fsync fenced it.
const ExitFenced = 4

// diskExitGrace is how long after a disk fault's heal a node's exit still
// counts as caused by it: the failing fsync may complete just before the
// heal and the process exit just after.
const diskExitGrace = int64(2e9)

// corruptionRefusal is how tidal-server refuses a log it read damaged
// (wal.CorruptionError): the file and the offset are named.
var corruptionRefusal = regexp.MustCompile(`corruption in \S+ at offset \d+`)

// diskExit is the disk fault window that explains an exit of node on its
// own, if any, and why.
func diskExit(windows []FaultWindow, e ProcessExit) (int, string, bool) {
	for i, w := range windows {
		if w.F != history.FDisk || !slices.Contains(w.Targets, e.Node) {
			continue
		}
		if e.Time < w.Start || e.Time > w.End+diskExitGrace && w.Healed {
			continue
		}
		switch w.Kind {
		case "fsync-error", "disk-full":
			if e.Status.Signal == "" && e.Status.Code == ExitFenced {
				return i, fmt.Sprintf("fenced itself (exit status %d) during %s", ExitFenced, w.Label()), true
			}
		case "corrupt-read":
			if e.Status.Signal == "" && e.Status.Code != 0 && logsMatch(e.Logs, corruptionRefusal) {
				return i, "refused its log, read corrupt, naming file and offset, during " + w.Label(), true
			}
		}
	}
	return -1, "", false
}

func logsMatch(logs []LogTail, re *regexp.Regexp) bool { return logsLine(logs, re) != "" }

// logsLine is the last log line re matches, "" if none does.
func logsLine(logs []LogTail, re *regexp.Regexp) string {
	found := ""
	for _, l := range logs {
		for _, line := range l.Lines {
			if re.MatchString(line) {
				found = line
			}
		}
	}
	return found
}

// ReorderCut is the history kind of a power cut whose disks kept a
// seeded subset of their unsynced pages, out of order (nemesis kind
// power-cut-reorder, faultfs PowerCutOptions.OutOfOrder).
const ReorderCut = "reorder"

// reorderRefusal explains an exit of a node that refused to start after
// an out-of-order power cut on it: a hole of lost pages before data that
// survived reads as corruption (records follow the damage, so it is not
// a torn tail), and tidal-server then refuses its log naming file and
// offset, as docs/ARCHITECTURE.md promises, until an operator repairs it.
// The damage stays on disk, so every later start refuses alike: each is
// the same refusal, not a crash loop. It returns the explanation quoting
// the refusal.
func reorderRefusal(windows []FaultWindow, e ProcessExit) (string, bool) {
	if e.Status.Signal != "" || e.Status.Code == 0 {
		return "", false
	}
	for _, w := range windows {
		if w.F != history.FPowerCut || w.Kind != ReorderCut || !slices.Contains(w.Targets, e.Node) || e.Time < w.Start {
			continue
		}
		if line := logsLine(e.Logs, corruptionRefusal); line != "" {
			return "refused to start after a power cut with out-of-order pages: " + corruptionRefusal.FindString(line) + " (" + line + ")", true
		}
	}
	return "", false
}

// diskExits judges the exits on their own that disk faults explain: the
// first per node and fault window is expected; a later one in the same
// window is a crash loop.
type diskExits struct {
	windows []FaultWindow
	seen    map[[2]int]int // (window, exit count) by node index
	nodes   map[string]int
}

func newDiskExits(windows []FaultWindow) *diskExits {
	return &diskExits{windows: windows, seen: map[[2]int]int{}, nodes: map[string]int{}}
}

// judge returns whether e is expected, and else (when a disk fault was
// acting) why it is a crash; "" when no disk fault speaks for it.
func (d *diskExits) judge(e ProcessExit) (expected bool, reason, label string) {
	if why, ok := reorderRefusal(d.windows, e); ok {
		return true, "", why
	}
	i, why, ok := diskExit(d.windows, e)
	if !ok {
		return false, "", ""
	}
	n, ok := d.nodes[e.Node]
	if !ok {
		n = len(d.nodes)
		d.nodes[e.Node] = n
	}
	key := [2]int{i, n}
	d.seen[key]++
	if d.seen[key] == 1 {
		return true, "", why
	}
	return false, fmt.Sprintf("crash loop: exited on its own %d times during %s (%s); the fault explains one exit, not a restart that fails again",
		d.seen[key], d.windows[i].Label(), e.Status.Text), why
}
