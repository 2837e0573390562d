package nemesis

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/history"
)

// power-cut-after-election cuts a node's power within milliseconds of it
// taking part in an election: right after it becomes candidate, casts a
// vote, or becomes leader. That is when its term and vote (raft's
// HardState) have just changed, and raft may answer for them only once
// they are durable: a node that granted a vote, lost power and came back
// without it could vote again in the same term and elect a second leader.
// A cut at a random moment almost never lands in that window.
//
// Trigger. The status sampler polls every 200 ms, far too slow; the
// node's own log says it at once. etcd raft logs each of these steps at
// Info, and tidal-server passes them to its log file unbuffered:
//
//	<id> became candidate at term <t>
//	<id> [logterm: ..., index: ..., vote: ...] cast MsgVote for <id> [...] at term <t>
//	<id> became leader at term <t>
//
// (a pre-vote, "cast MsgPreVote", changes no durable state and is not a
// trigger). The fault tails the target's log from the moment it is
// injected, polling every millisecond, and cuts on the first such line.
//
// Provocation. Elections are rare in a healthy cluster, so the fault
// makes one: it asks the leader to hand leadership to the target (which
// then campaigns and wins), or, when the target leads, to another node
// (the target then votes for it). Under a partition or a kill the
// transfer may fail; then a natural election may still come, and the
// fault waits for one up to its action timeout (at most 10 s). No
// trigger seen: nothing was cut, and the fault is recorded fail.
//
// The ok records the line that triggered the cut, when it was logged,
// how long after that the node was frozen, and what the disk lost.

// ElectionLogCluster is a DiskCluster whose nodes' logs the harness can
// read as they are written.
type ElectionLogCluster interface {
	DiskCluster
	// NodeLog is the path of name's structured log (its --log-file).
	NodeLog(name string) (string, error)
}

// electionTrigger matches the raft log lines after which a node's term
// or vote has just changed.
var electionTrigger = regexp.MustCompile(`became candidate at term \d+|became leader at term \d+|cast MsgVote for [0-9a-f]+ .*at term \d+`)

// triggerTerm finds the term a trigger line names.
var triggerTerm = regexp.MustCompile(`at term (\d+)`)

// logTime finds the time a slog line (text or JSON) was written.
var logTime = regexp.MustCompile(`time[=":]+"?([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+(?:Z|[+-][0-9:]+))`)

// electionWatchLimit bounds how long the fault waits for a trigger.
var electionWatchLimit = 10 * time.Second

type electionCutParams struct {
	faultfs.PowerCutOptions
	// Provoked says how the fault asked for an election ("transfer n1->n2"),
	// and ProvokeError why that failed, if it did.
	Provoked     string `json:"provoked,omitempty"`
	ProvokeError string `json:"provoke_error,omitempty"`
	// Trigger is the log line the cut followed; LoggedAt when the node
	// wrote it (its own clock, millisecond resolution); SeenAfterMS how
	// long after that the harness read it, and CutDoneAfterMS when the
	// whole cut was over (the node is frozen by its first step, a
	// SIGSTOP, between the two; the rest rolls the disk back).
	Trigger        string  `json:"trigger,omitempty"`
	LoggedAt       string  `json:"logged_at,omitempty"`
	SeenAfterMS    float64 `json:"seen_after_ms,omitempty"`
	CutDoneAfterMS float64 `json:"cut_done_after_ms,omitempty"`
	// Reports is what the disk lost.
	Reports map[string]faultfs.PowerCutReport `json:"reports,omitempty"`
	// Term is the term the trigger line names, Leader whether it said the
	// node became leader, PID the process cut. A correct node logs
	// "became leader at term T" only once its own vote in T is durable
	// (raft counts its self-vote after the storage write), so it must
	// come back at term T or later: the election checker holds it to that.
	Term   uint64 `json:"term,omitempty"`
	Leader bool   `json:"leader,omitempty"`
	PID    int    `json:"pid,omitempty"`
}

type electionCut struct{}

func needsElectionLog(c Cluster, kind string) (ElectionLogCluster, error) {
	if _, err := needsDisks(c, kind); err != nil {
		return nil, err
	}
	ec, ok := c.(ElectionLogCluster)
	if !ok {
		return nil, fmt.Errorf("%s needs the nodes' logs (raft's election lines), which this cluster does not provide", kind)
	}
	return ec, nil
}

func (electionCut) Resolve(_ context.Context, c Cluster, s Step) (history.FaultValue, error) {
	v := history.FaultValue{Kind: "after-election", Targets: slices.Clone(s.Targets)}
	if _, err := needsElectionLog(c, s.Kind); err != nil {
		return v, err
	}
	var p electionCutParams
	if s.Disk != nil && s.Disk.PowerCut != nil {
		p.PowerCutOptions = *s.Disk.PowerCut
	}
	var err error
	if v.Params, err = json.Marshal(p); err != nil {
		return v, err
	}
	return v, checkTargets(c, s, 1)
}

func (electionCut) Inject(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	ec, err := needsElectionLog(c, "power-cut-after-election")
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	var p electionCutParams
	if err := json.Unmarshal(v.Params, &p); err != nil {
		return time.Time{}, NotApplied(fmt.Errorf("power-cut-after-election params %s: %w", v.Params, err))
	}
	t := v.Targets[0]
	if st := c.State(t); st != cluster.Running {
		return time.Time{}, NotApplied(fmt.Errorf("%s: expected node running, found %s", t, st))
	}
	path, err := ec.NodeLog(t)
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	if pc, ok := c.(interface{ PID(string) (int, bool) }); ok {
		p.PID, _ = pc.PID(t)
	}
	tail, err := openTail(path)
	if err != nil {
		return time.Time{}, NotApplied(err)
	}
	defer tail.Close()

	wctx, cancel := context.WithTimeout(ctx, electionWatchLimit)
	defer cancel()
	provoked := make(chan string, 1)
	go func() { provoked <- provokeElection(wctx, c, t) }()

	poll := time.NewTicker(time.Millisecond)
	defer poll.Stop()
	for {
		line, err := tail.next(electionTrigger)
		if err != nil {
			return time.Time{}, NotApplied(fmt.Errorf("%s: reading %s: %w", t, path, err))
		}
		if line != "" {
			seen := time.Now()
			reports, err := ec.PowerCut([]string{t}, p.PowerCutOptions)
			done := time.Now()
			cancel()
			p.Trigger, p.Reports = line, reports
			if m := triggerTerm.FindStringSubmatch(line); m != nil {
				p.Term, _ = strconv.ParseUint(m[1], 10, 64)
			}
			p.Leader = strings.Contains(line, "became leader at term")
			if m := logTime.FindStringSubmatch(line); m != nil {
				if at, perr := time.Parse(time.RFC3339Nano, m[1]); perr == nil {
					p.LoggedAt = m[1]
					p.SeenAfterMS = float64(seen.Sub(at).Microseconds()) / 1000
					p.CutDoneAfterMS = float64(done.Sub(at).Microseconds()) / 1000
				}
			}
			p.Provoked = <-provoked
			v.Params, _ = json.Marshal(p)
			if err != nil {
				return time.Time{}, err
			}
			return done, nil
		}
		select {
		case <-wctx.Done():
			p.Provoked = <-provoked
			v.Params, _ = json.Marshal(p)
			return time.Time{}, NotApplied(fmt.Errorf("%s: expected a vote or a leadership change in its log within %s, found none (%s); nothing was cut", t, electionWatchLimit, p.Provoked))
		case <-poll.C:
		}
	}
}

// provokeElection asks for an election the target takes part in and says
// what it asked, and why that failed if it did.
func provokeElection(ctx context.Context, c Cluster, target string) string {
	l, err := leader(ctx, c)
	if err != nil {
		return "no transfer: " + err.Error()
	}
	from, to := l, target
	if l == target {
		// The target leads: hand leadership to another running node, whose
		// campaign the target votes in.
		to = ""
		for _, n := range c.Names() {
			if n != target && c.State(n) == cluster.Running {
				to = n
				break
			}
		}
		if to == "" {
			return "no transfer: no running node other than the leader " + l
		}
	}
	what := fmt.Sprintf("transfer %s->%s", from, to)
	if err := c.TransferLeader(ctx, from, to); err != nil && ctx.Err() == nil {
		return what + " failed: " + err.Error()
	}
	return what
}

// Heal starts the node on what its disk kept.
func (electionCut) Heal(ctx context.Context, c Cluster, v *history.FaultValue) (time.Time, error) {
	return powerCut{}.Heal(ctx, c, v)
}

// logTail reads a growing log file from where it ended when opened, line
// by line.
type logTail struct {
	f   *os.File
	buf []byte
	rd  []byte
}

func openTail(path string) (*logTail, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return nil, err
	}
	return &logTail{f: f, rd: make([]byte, 64<<10)}, nil
}

func (t *logTail) Close() error { return t.f.Close() }

// next reads what was appended since the last call and returns the first
// complete line matching re ("" when none); lines before it are dropped.
func (t *logTail) next(re *regexp.Regexp) (string, error) {
	for {
		n, err := t.f.Read(t.rd)
		t.buf = append(t.buf, t.rd[:n]...)
		if err == io.EOF || n == 0 {
			break
		}
		if err != nil {
			return "", err
		}
	}
	for {
		i := bytes.IndexByte(t.buf, '\n')
		if i < 0 {
			return "", nil
		}
		line := t.buf[:i]
		t.buf = t.buf[i+1:]
		if re.Match(line) {
			return string(line), nil
		}
	}
}

var electionKinds = []Kind{
	{Name: "power-cut-after-election", F: FPowerCut, Sub: "after-election", Class: Disk, MinNodes: 3, pick: one, fault: electionCut{},
		Needs: []Capability{CapDisk, CapElectionLog, CapTransferLeader, CapLeader},
		Doc:   "cut one random node's power within milliseconds of it voting, campaigning or becoming leader (an election provoked by a leader transfer, seen in its log); heal starts it on what survived"},
}

var _ ElectionLogCluster = LiveCluster{}
