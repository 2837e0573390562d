package checker

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The nodes' logs say two things about terms that the status samples,
// taken every 200 ms, almost never catch:
//
//   - the term each process started at: raft logs
//     "newRaft <id> [peers: [...], term: <T>, ...]" when it starts, with
//     the term read back from its durable HardState;
//   - terms a node provably acted on: "<id> became leader at term <T>" in
//     its own log (raft counts a candidate's own vote only once it is
//     durable), and "<c> received MsgVoteResp from <id> at term <T>" in a
//     candidate's log (a voter answers only once its vote is durable).
//
// Whatever a node acted on in term T must survive anything: a process of
// that node starting later at a term below T lost a term or vote it had
// answered for, and may vote again in T — two leaders in one term.

// LogTerm is one line of a node's log that names a term.
type LogTerm struct {
	// Node is the slot whose term it is; ID its member id.
	Node string    `json:"node"`
	ID   uint64    `json:"id"`
	Term uint64    `json:"term"`
	At   time.Time `json:"at"`
	// Line is the log line and Log the node whose log holds it.
	Log  string `json:"log"`
	Line string `json:"line"`
}

// ElectionLogs are the terms the nodes' logs show.
type ElectionLogs struct {
	// Starts are the terms processes started at.
	Starts []LogTerm `json:"starts"`
	// Acted are terms a node provably acted on.
	Acted []LogTerm `json:"acted"`
}

var (
	newRaftLine  = regexp.MustCompile(`newRaft ([0-9a-f]+) \[peers: \[[^\]]*\], term: (\d+),`)
	leaderLine   = regexp.MustCompile(`msg="?([0-9a-f]+) became leader at term (\d+)`)
	voteRespLine = regexp.MustCompile(`msg="?([0-9a-f]+) received MsgVoteResp from ([0-9a-f]+) at term (\d+)`)
	lineTime     = regexp.MustCompile(`time[=":]+"?([0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+(?:Z|[+-][0-9:]+))`)
)

// ReadElectionLogs reads the election lines of the nodes' logs (node
// name -> path). A missing log is skipped; a log that cannot be read is
// an error naming it.
func ReadElectionLogs(logs map[string]string) (ElectionLogs, error) {
	var out ElectionLogs
	nameOf := map[uint64]string{}
	type vote struct {
		voter uint64
		t     LogTerm
	}
	var votes []vote
	for node, path := range logs {
		f, err := os.Open(path)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("election logs: %w", err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if !strings.Contains(line, "term") {
				continue
			}
			tm := lineTime.FindStringSubmatch(line)
			if tm == nil {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, tm[1])
			if err != nil {
				continue
			}
			if m := newRaftLine.FindStringSubmatch(line); m != nil {
				id, _ := strconv.ParseUint(m[1], 16, 64)
				term, _ := strconv.ParseUint(m[2], 10, 64)
				nameOf[id] = node
				out.Starts = append(out.Starts, LogTerm{Node: node, ID: id, Term: term, At: at, Log: node, Line: line})
			} else if m := leaderLine.FindStringSubmatch(line); m != nil {
				id, _ := strconv.ParseUint(m[1], 16, 64)
				term, _ := strconv.ParseUint(m[2], 10, 64)
				out.Acted = append(out.Acted, LogTerm{Node: node, ID: id, Term: term, At: at, Log: node, Line: line})
			} else if m := voteRespLine.FindStringSubmatch(line); m != nil && m[1] != m[2] {
				voter, _ := strconv.ParseUint(m[2], 16, 64)
				term, _ := strconv.ParseUint(m[3], 10, 64)
				votes = append(votes, vote{voter, LogTerm{ID: voter, Term: term, At: at, Log: node, Line: line}})
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return out, fmt.Errorf("election logs: %s: %w", path, err)
		}
	}
	for _, v := range votes {
		v.t.Node = nameOf[v.voter]
		out.Acted = append(out.Acted, v.t)
	}
	sort.SliceStable(out.Starts, func(i, j int) bool { return out.Starts[i].At.Before(out.Starts[j].At) })
	sort.SliceStable(out.Acted, func(i, j int) bool { return out.Acted[i].At.Before(out.Acted[j].At) })
	return out, nil
}

// LostTerm is a process that started below a term its node had acted on.
type LostTerm struct {
	Start LogTerm `json:"start"`
	Acted LogTerm `json:"acted"`
}

// lostTerms finds every start below a term its member acted on earlier.
func (l ElectionLogs) lostTerms() []LostTerm {
	var out []LostTerm
	for _, s := range l.Starts {
		var worst *LogTerm
		for i := range l.Acted {
			a := &l.Acted[i]
			if a.ID == s.ID && a.Term > s.Term && a.At.Before(s.At) && (worst == nil || a.Term > worst.Term) {
				worst = a
			}
		}
		if worst != nil {
			out = append(out, LostTerm{Start: s, Acted: *worst})
		}
	}
	return out
}

func (lt LostTerm) String() string {
	what := "became leader in it"
	if lt.Acted.Log != lt.Start.Node {
		what = "its vote in it reached " + lt.Acted.Log
	}
	return fmt.Sprintf("%s (id %d) restarted at term %d (%s) though it had acted in term %d: %s at %s (%s's log: %s)",
		lt.Start.Node, lt.Start.ID, lt.Start.Term, lt.Start.At.Format("15:04:05.000"), lt.Acted.Term, what,
		lt.Acted.At.Format("15:04:05.000"), lt.Acted.Log, strings.TrimSpace(lt.Acted.Line))
}
