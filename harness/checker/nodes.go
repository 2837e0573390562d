package checker

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/harness/history"
)

// ExitStatus is how a node's process ended (the runner copies it from
// the process backend).
type ExitStatus struct {
	// Code is the exit code; -1 when a signal ended the process.
	Code int `json:"code"`
	// Signal names the signal that ended it ("killed"), if one did.
	Signal string `json:"signal,omitempty"`
	// Text is the status as os/exec words it: "exit status 2".
	Text string `json:"text"`
}

// LogTail is the end of one log file of a node.
type LogTail struct {
	Path  string   `json:"path"`
	Lines []string `json:"lines"`
}

// ProcessExit is one exit of a node's process during a run.
type ProcessExit struct {
	Node string `json:"node"`
	PID  int    `json:"pid"`
	// Time is history time (ns since the history began; negative for an
	// exit before it, while the cluster was coming up).
	Time int64 `json:"time"`
	// Requested is true when the harness (the nemesis, or the cluster on
	// its behalf) asked for this exit — a kill or a stop — while the
	// process was still running.
	Requested bool `json:"requested"`
	// Graceful is true when that request was a graceful stop: SIGTERM,
	// then a wait for the process to drain and exit. Such a stop must end
	// with exit status 0 (tidal-server: 1 failed, 4 fenced, 5 removed; a
	// signal means the drain outlived its deadline and was killed).
	Graceful bool       `json:"graceful,omitempty"`
	Status   ExitStatus `json:"status"`
	Logs     []LogTail  `json:"logs,omitempty"`
}

// NodeFinal is one node as the runner found it after the final heal.
type NodeFinal struct {
	Node string `json:"node"`
	// State is what the harness last did to it: running, killed, paused,
	// stopped, or removed (from the membership, for good).
	State string `json:"state"`
	// Alive: its process had not exited. Serving: it answered
	// /cluster/status. Error says why it did not.
	Alive   bool      `json:"alive"`
	Serving bool      `json:"serving"`
	Error   string    `json:"error,omitempty"`
	Logs    []LogTail `json:"logs,omitempty"`
}

// Removed is the state of a node removed from the membership for good.
const NodeRemoved = "removed"

// NodeEvidence is what the runner records about the nodes' processes and
// what it could read from them after the run (the store's nodes.json).
type NodeEvidence struct {
	// Nodes are every node slot of the run.
	Nodes []string      `json:"nodes"`
	Exits []ProcessExit `json:"exits"`
	// Final is every node after the final heal; none when the run never
	// got that far.
	Final []NodeFinal `json:"final"`
	// AuditErrors and DigestErrors say why a node's /v1/audit/events or
	// /v1/audit/digest could not be read after the run.
	AuditErrors  map[string]string `json:"audit_errors,omitempty"`
	DigestErrors map[string]string `json:"digest_errors,omitempty"`
	// Disks are each node's faultfs fault counters over the whole run
	// (nodes/<n>/faultfs.json, read alongside nodes.json; not part of
	// it): what the disk faults did, for faults whose heal recorded no
	// effect of its own.
	Disks map[string]DiskEffect `json:"-"`
}

// RemovedNodes are the nodes that were out of the membership, for good,
// after the final heal: the only ones a checker may leave out.
func (e NodeEvidence) RemovedNodes() []string {
	var out []string
	for _, f := range e.Final {
		if f.State == NodeRemoved {
			out = append(out, f.Node)
		}
	}
	sort.Strings(out)
	return out
}

// Crash is a node failure the nodes checker found.
type Crash struct {
	Node string `json:"node"`
	// Reason says what was wrong, e.g. "exited on its own (exit status 2)
	// with no kill by the harness outstanding".
	Reason string `json:"reason"`
	// Time is when the process exited (history time); -1 for a node found
	// down after the final heal.
	Time   int64       `json:"time"`
	PID    int         `json:"pid,omitempty"`
	Status *ExitStatus `json:"status,omitempty"`
	Panic  bool        `json:"panic,omitempty"`
	Logs   []LogTail   `json:"logs,omitempty"`
}

// NodesDetails is the Details of a Nodes result.
type NodesDetails struct {
	Nodes   []string `json:"nodes"`
	Removed []string `json:"removed,omitempty"`
	// Crashed are the nodes with at least one crash, sorted.
	Crashed []string `json:"crashed,omitempty"`
	Crashes []Crash  `json:"crashes,omitempty"`
	// Exits counts every process exit; Expected those the harness asked
	// for or that came with the node's removal from the membership.
	Exits    int `json:"exits"`
	Expected int `json:"expected_exits"`
	// GracefulStops counts the exits after a SIGTERM of the harness that
	// were judged (each must be exit status 0).
	GracefulStops int `json:"graceful_stops"`
	// DiskExits are the expected exits a disk fault asked for: a node
	// that fenced itself on fsync-error or disk-full, or refused a log
	// it read corrupt (diskexits.go).
	DiskExits []string `json:"disk_exits,omitempty"`
	// Refused are the nodes that refused to start after a power cut with
	// out-of-order pages (their log names file and offset) and were not
	// running at the end: an outcome docs/ARCHITECTURE.md allows, not a
	// crash; the node needs `tidal-server wal repair`.
	Refused map[string]string `json:"refused,omitempty"`
	// CrashLoops name the nodes that crashed after exiting on their own
	// more than once.
	CrashLoops []string    `json:"crash_loops,omitempty"`
	Final      []NodeFinal `json:"final,omitempty"`
}

// Nodes checks that no node crashed: every exit of a node's process was
// asked for by the harness (a nemesis kill or restart, a stop) or came
// with the removal of its member by the nemesis, and every node not
// removed for good was running and serving after the final heal.
//
// An exit is a crash when the process ended on its own with no kill by
// the harness outstanding — whatever its code: the server's documented
// exit codes (removed, fenced) say why it stopped, not that stopping was
// expected — or when its log holds a Go panic, or when a requested stop
// ended with a non-zero exit code instead of the signal or a clean exit.
// The one exception is an exit a disk fault on that node asks for
// (diskexits.go): fenced (status 4) during fsync-error or disk-full, or
// refusing a log read corrupt during corrupt-read — once per fault; a
// second such exit within it is a crash loop.
// Any crash is Invalid. Without a record of the nodes after the final
// heal the result is Unknown: a crash could not have been seen.
func Nodes(ops []history.Op, ev NodeEvidence) Result {
	const name = "nodes"
	d := NodesDetails{Nodes: slices.Sorted(slices.Values(ev.Nodes)), Removed: ev.RemovedNodes(), Exits: len(ev.Exits), Final: ev.Final}
	windows, err := FaultWindows(ops)
	if err != nil {
		return Result{Name: name, Valid: Unknown, Summary: "cannot derive fault windows to place node exits: " + err.Error(), Details: d}
	}
	disk := newDiskExits(windows)
	ownExits := map[string]int{}
	for _, e := range ev.Exits {
		panicked := hasPanic(e.Logs)
		removal := duringRemoval(windows, e.Node, e.Time)
		graceful := e.Requested && e.Graceful && !removal
		if graceful {
			d.GracefulStops++
		}
		requestedEnd := e.Requested && (e.Status.Signal != "" || e.Status.Code == 0)
		if graceful {
			requestedEnd = e.Status.Signal == "" && e.Status.Code == 0
		}
		if !panicked && (removal || requestedEnd) {
			d.Expected++
			continue
		}
		var loop string
		if !panicked && !e.Requested {
			ownExits[e.Node]++
			expected, why, label := disk.judge(e)
			if expected {
				d.Expected++
				d.DiskExits = append(d.DiskExits, fmt.Sprintf("%s %s at %s", e.Node, label, history.FormatTime(e.Time)))
				if r, ok := reorderRefusal(windows, e); ok {
					if d.Refused == nil {
						d.Refused = map[string]string{}
					}
					d.Refused[e.Node] = r
				} else {
					delete(d.Refused, e.Node)
				}
				continue
			}
			loop = why
		}
		status := e.Status
		c := Crash{Node: e.Node, Time: e.Time, PID: e.PID, Status: &status, Panic: panicked, Logs: e.Logs}
		switch {
		case panicked:
			c.Reason = fmt.Sprintf("panicked (%s)", e.Status.Text)
		case loop != "":
			c.Reason = loop
		case graceful:
			c.Reason = fmt.Sprintf("exited with %s after the harness's SIGTERM (expected exit status 0: a graceful stop drains and exits clean; %s)", e.Status.Text, exitMeaning(e.Status))
		case e.Status.Signal == "" && e.Status.Code == ExitFenced:
			c.Reason = fmt.Sprintf("fenced itself (%s) with no fsync-error or disk-full on it outstanding: its disk failed without a fault, or a fenced node was restarted into another failure", e.Status.Text)
		case e.Requested:
			c.Reason = fmt.Sprintf("exited with %s while the harness was stopping it (expected a signal or exit status 0)", e.Status.Text)
		default:
			c.Reason = fmt.Sprintf("exited on its own (%s) with no kill by the harness outstanding", e.Status.Text)
		}
		d.Crashes = append(d.Crashes, c)
	}
	final := map[string]NodeFinal{}
	for _, f := range ev.Final {
		final[f.Node] = f
	}
	exited := map[string]bool{} // nodes whose crash exit already quotes their logs
	for _, c := range d.Crashes {
		exited[c.Node] = true
	}
	var unchecked []string
	for _, n := range d.Nodes {
		f, ok := final[n]
		logs := f.Logs
		if exited[n] {
			logs = nil
		}
		switch {
		case !ok:
			unchecked = append(unchecked, n)
		case f.State == NodeRemoved:
		case (!f.Alive || f.State != "running") && d.Refused[n] != "":
			// Its last exit was the refusal; it stays down until repaired.
		case !f.Alive || f.State != "running":
			d.Crashes = append(d.Crashes, Crash{Node: n, Time: -1, Logs: logs,
				Reason: fmt.Sprintf("not running after the final heal (harness state %s, process alive %t)", f.State, f.Alive)})
		case !f.Serving:
			d.Crashes = append(d.Crashes, Crash{Node: n, Time: -1, Logs: logs,
				Reason: "running but not serving after the final heal: " + f.Error})
		}
	}
	for n := range d.Refused {
		if f, ok := final[n]; ok && f.Alive && f.State == "running" {
			delete(d.Refused, n) // it started again on a repaired or rewritten log
		}
	}
	for n, k := range ownExits {
		if k > 1 && slices.ContainsFunc(d.Crashes, func(c Crash) bool { return c.Node == n && c.Time >= 0 }) {
			d.CrashLoops = append(d.CrashLoops, fmt.Sprintf("%s exited on its own %d times", n, k))
		}
	}
	slices.Sort(d.CrashLoops)
	sort.SliceStable(d.Crashes, func(i, j int) bool { return d.Crashes[i].Node < d.Crashes[j].Node })
	for _, c := range d.Crashes {
		if !slices.Contains(d.Crashed, c.Node) {
			d.Crashed = append(d.Crashed, c.Node)
		}
	}
	if len(d.Crashes) > 0 {
		parts := make([]string, 0, len(d.Crashes))
		for _, c := range d.Crashes {
			p := c.Node + " " + c.Reason
			if c.Time >= 0 {
				p += " at " + history.FormatTime(c.Time)
			}
			if last := lastLogLine(c.Logs); last != "" {
				p += "; last log line: " + last
			}
			parts = append(parts, p)
		}
		summary := fmt.Sprintf("%d of %d nodes crashed: %s", len(d.Crashed), len(d.Nodes), strings.Join(parts, "; "))
		if len(d.CrashLoops) > 0 {
			summary += "; crash loop: " + strings.Join(d.CrashLoops, ", ")
		}
		return Result{Name: name, Valid: Invalid, Details: d, Summary: summary}
	}
	if len(d.Nodes) == 0 || len(ev.Final) == 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "the nodes were not checked after the final heal; a crash could not have been seen"}
	}
	if len(unchecked) > 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: fmt.Sprintf("%s not checked after the final heal", strings.Join(unchecked, ","))}
	}
	s := fmt.Sprintf("no node crashed: %d process exits, all asked for by the harness or by a member removal; every node running and serving after the final heal", d.Exits)
	if d.GracefulStops > 0 {
		s += fmt.Sprintf("; %d graceful stops (SIGTERM) exited with status 0", d.GracefulStops)
	}
	if len(d.DiskExits) > 0 {
		s = fmt.Sprintf("no node crashed: %d process exits, all asked for by the harness, by a member removal, or by a disk fault (%s); every node running and serving after the final heal",
			d.Exits, strings.Join(d.DiskExits, "; "))
	}
	if len(d.Refused) > 0 {
		var parts []string
		for _, n := range slices.Sorted(maps.Keys(d.Refused)) {
			parts = append(parts, n+" "+d.Refused[n])
		}
		s = fmt.Sprintf("no node crashed (%d process exits); down at the end, as allowed: %s; the others running and serving after the final heal",
			d.Exits, strings.Join(parts, "; "))
	}
	if len(d.Removed) > 0 {
		s += "; removed for good: " + strings.Join(d.Removed, ",")
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: s}
}

// exitMeaning says what tidal-server means by an exit status.
func exitMeaning(s ExitStatus) string {
	if s.Signal != "" {
		return "a signal ended it: the drain did not finish before its deadline, or something else killed it"
	}
	switch s.Code {
	case 1:
		return "1 means it failed while serving or stopping"
	case ExitFenced:
		return "4 means it fenced itself after a failed write or fsync"
	case 5:
		return "5 means it was removed from the cluster"
	}
	return fmt.Sprintf("%d is no documented status", s.Code)
}

// duringRemoval reports whether history time t falls while the nemesis
// was removing node's member, or after it removed it for good: a node
// that leaves the membership may exit on its own.
func duringRemoval(windows []FaultWindow, node string, t int64) bool {
	for _, w := range windows {
		if w.F != history.FRemoveMember || !slices.Contains(w.Targets, node) {
			continue
		}
		end := w.End
		if !w.Healed {
			end = math.MaxInt64
		}
		if t >= w.Start && t <= end {
			return true
		}
	}
	return false
}

// hasPanic reports whether a log tail holds a Go runtime panic or fatal
// error, which is how a Go program that crashes ends its stderr.
func hasPanic(logs []LogTail) bool {
	for _, l := range logs {
		for _, line := range l.Lines {
			if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") {
				return true
			}
		}
	}
	return false
}

// lastLogLine is the last line worth quoting in a one-line summary: the
// panic if there is one, else the last line of the first log.
func lastLogLine(logs []LogTail) string {
	for _, l := range logs {
		for _, line := range l.Lines {
			if strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ") {
				return line
			}
		}
	}
	for _, l := range logs {
		for i := len(l.Lines) - 1; i >= 0; i-- {
			if s := strings.TrimSpace(l.Lines[i]); s != "" && !strings.HasPrefix(s, "=== ") {
				return s
			}
		}
	}
	return ""
}
