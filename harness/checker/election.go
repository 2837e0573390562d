package checker

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tidaldb/tidal/harness/history"
)

// ElectionSample is what one node said of its raft state at one moment
// (the runner's status sampler, elections.jsonl): its member id, term
// and the leader it knows, with the process that answered. A sample is
// kept only when the node's process was the same before and after the
// request, so PID says which incarnation of the node answered.
type ElectionSample struct {
	// Time is history time (ns since the history began).
	Time int64  `json:"time"`
	Node string `json:"node"`
	PID  int    `json:"pid"`
	// ID is the member id that answered; Leader the member it names
	// (0: none known); Term its current raft term.
	ID     uint64 `json:"id"`
	Term   uint64 `json:"term"`
	Leader uint64 `json:"leader"`
}

// Claims reports whether the node claims leadership itself in s: only
// such claims count for election safety. A node naming another as leader
// may be stale (partitioned, it has not heard of the newer term), which
// raft allows.
func (s ElectionSample) Claims() bool { return s.ID != 0 && s.Leader == s.ID }

// LeaderClaim is one node's claim of leadership in a term.
type LeaderClaim struct {
	Node string `json:"node"`
	ID   uint64 `json:"id"`
	// First is when it was first seen claiming the term.
	First int64 `json:"first"`
}

// TwoLeaders is a term in which more than one member claimed leadership.
type TwoLeaders struct {
	Term   uint64        `json:"term"`
	Claims []LeaderClaim `json:"claims"`
}

// TermRegression is a node whose term went down: across a restart (the
// last term seen from the old process against the first from the new
// one) or, worse, within one process.
type TermRegression struct {
	Node       string `json:"node"`
	ID         uint64 `json:"id"`
	Restart    bool   `json:"restart"`
	BeforePID  int    `json:"before_pid"`
	BeforeTerm uint64 `json:"before_term"`
	BeforeTime int64  `json:"before_time"`
	AfterPID   int    `json:"after_pid"`
	AfterTerm  uint64 `json:"after_term"`
	AfterTime  int64  `json:"after_time"`
}

// ElectionDetails is the Details of an Election result.
type ElectionDetails struct {
	Samples int `json:"samples"`
	// Terms is how many terms had at least one leadership claim (each
	// judged for a second claimant).
	Terms int `json:"terms_judged"`
	// Restarts counts the restarts judged: a node's last sample before a
	// new process answered, and the new process's first.
	Restarts int `json:"restarts_judged"`
	// Unbracketed lists the exits of a node's process with no sample of
	// that process before it or none of the next one after it: their
	// terms could not be compared.
	Unbracketed []string `json:"unbracketed,omitempty"`
	// LogClaims counts the leadership claims read from the nodes' logs
	// (power-cut-after-election's trigger "became leader at term T") and
	// judged with the samples.
	LogClaims int `json:"log_claims,omitempty"`
	// LogStarts counts the process starts whose term was read from the
	// nodes' logs and judged against the terms they had acted on
	// (electionlog.go); LostTerms are those that started below one.
	LogStarts   int              `json:"log_starts,omitempty"`
	LostTerms   []LostTerm       `json:"lost_terms,omitempty"`
	TwoLeaders  []TwoLeaders     `json:"two_leaders,omitempty"`
	Regressions []TermRegression `json:"term_regressions,omitempty"`
}

// LoggedLeaderClaims reads from the history the leadership claims
// power-cut-after-election saw in a node's log just before it cut the
// node's power ("became leader at term T"), as samples of that process
// with no member id (Election fills it in). A correct node logs that line
// only once its own vote in T is durable, so the first term its next
// process reports must be T or more, and no other member may claim T.
func LoggedLeaderClaims(ops []history.Op) []ElectionSample {
	var out []ElectionSample
	for _, op := range ops {
		if op.Process != history.Nemesis || op.F != history.FPowerCut || op.Type != history.OK || len(op.Value) == 0 {
			continue
		}
		fv, err := history.Decode[history.FaultValue](op)
		if err != nil || fv.Kind != "after-election" || len(fv.Targets) != 1 {
			continue
		}
		var p struct {
			Term   uint64 `json:"term"`
			Leader bool   `json:"leader"`
			PID    int    `json:"pid"`
		}
		if json.Unmarshal(fv.Params, &p) != nil || !p.Leader || p.Term == 0 || p.PID == 0 {
			continue
		}
		// The line came before the cut completed (op.Time), and the
		// process was frozen from then on.
		out = append(out, ElectionSample{Time: op.Time - 1, Node: fv.Targets[0], PID: p.PID, Term: p.Term})
	}
	return out
}

// exitRemoved is tidal-server's exit status for a member removed from
// the cluster.
const exitRemoved = 5

// Election checks election safety from the status samples: at most one
// member claims leadership in any term (raft's Election Safety), and no
// node's term goes down, across a restart (its term and vote must be
// durable before it acts on them) or within one process. exits are the
// node process exits (nodes.json); each one whose term could not be
// compared across it is named.
//
// Invalid on two claimants of one term, or a term that went down, each
// named with the samples that show it. Unknown when there are no
// samples, when no sample ever claimed leadership (nothing to judge),
// or when members restarted and no restart could be compared, by the
// samples or by the nodes' logs. An exit whose member never came back
// (removed for good) is no restart. Valid says
// how many terms, samples and restarts were judged.
func Election(samples []ElectionSample, exits []ProcessExit) Result {
	return ElectionWithLogs(samples, exits, nil)
}

// ElectionWithLogs is Election, also judging every process start the
// nodes' logs show against the terms the node had acted on before it
// (ElectionLogs): a start below such a term is Invalid.
func ElectionWithLogs(samples []ElectionSample, exits []ProcessExit, logs *ElectionLogs) Result {
	const name = "election"
	d := ElectionDetails{Samples: len(samples)}
	if logs != nil {
		d.LogStarts = len(logs.Starts)
		d.LostTerms = logs.lostTerms()
	}
	if len(samples) == 0 && len(d.LostTerms) > 0 {
		return Result{Name: name, Valid: Invalid, Details: d, Summary: d.LostTerms[0].String()}
	}
	if len(samples) == 0 {
		return Result{Name: name, Valid: Unknown, Details: d, Summary: "no status samples with term and leader: election safety could not be judged"}
	}
	ss := slices.Clone(samples)
	// A claim read from a node's log has no member id: it is the id the
	// same process answered the sampler with. One without any sample of
	// its process cannot be placed and is left out.
	idOf := map[int]uint64{}
	for _, s := range ss {
		if s.PID != 0 && s.ID != 0 {
			idOf[s.PID] = s.ID
		}
	}
	ss = slices.DeleteFunc(ss, func(s ElectionSample) bool {
		if s.ID != 0 {
			return false
		}
		return s.PID == 0 || idOf[s.PID] == 0
	})
	for i := range ss {
		if ss[i].ID == 0 {
			ss[i].ID = idOf[ss[i].PID]
			ss[i].Leader = ss[i].ID
			d.LogClaims++
		}
	}
	d.Samples = len(ss) - d.LogClaims
	sort.SliceStable(ss, func(i, j int) bool { return ss[i].Time < ss[j].Time })

	// Two leaders in one term: only a node's own claim counts.
	claims := map[uint64][]LeaderClaim{}
	for _, s := range ss {
		if !s.Claims() {
			continue
		}
		cs := claims[s.Term]
		if !slices.ContainsFunc(cs, func(c LeaderClaim) bool { return c.ID == s.ID }) {
			claims[s.Term] = append(cs, LeaderClaim{Node: s.Node, ID: s.ID, First: s.Time})
		}
	}
	d.Terms = len(claims)
	for term, cs := range claims {
		if len(cs) > 1 {
			d.TwoLeaders = append(d.TwoLeaders, TwoLeaders{Term: term, Claims: cs})
		}
	}
	sort.Slice(d.TwoLeaders, func(i, j int) bool { return d.TwoLeaders[i].Term < d.TwoLeaders[j].Term })

	// Terms per member, in time order. A slot re-added by membership
	// churn is a new member (new id, empty log, term learned afresh), so
	// the sequence is per slot and id.
	type key struct {
		node string
		id   uint64
	}
	seqs := map[key][]ElectionSample{}
	var keys []key
	for _, s := range ss {
		k := key{s.Node, s.ID}
		if _, ok := seqs[k]; !ok {
			keys = append(keys, k)
		}
		seqs[k] = append(seqs[k], s)
	}
	judged := map[int]bool{} // PIDs whose exit was bracketed
	for _, k := range keys {
		seq := seqs[k]
		for i := 1; i < len(seq); i++ {
			a, b := seq[i-1], seq[i]
			restart := a.PID != b.PID
			if restart {
				d.Restarts++
				judged[a.PID] = true
			}
			if b.Term < a.Term {
				d.Regressions = append(d.Regressions, TermRegression{Node: k.node, ID: k.id, Restart: restart,
					BeforePID: a.PID, BeforeTerm: a.Term, BeforeTime: a.Time, AfterPID: b.PID, AfterTerm: b.Term, AfterTime: b.Time})
			}
		}
	}
	// An exit is a restart to judge only if its member came back: a later
	// process on the same slot answering with the same member id (any id,
	// when the exited process was never sampled). A member removed for
	// good (exit status 5), whose slot may be re-added as a new member,
	// has no "after" to compare.
	cameBack := func(e ProcessExit) bool {
		if e.Status.Code == exitRemoved {
			return false
		}
		id := idOf[e.PID]
		for _, s := range ss {
			if s.Node == e.Node && s.Time > e.Time && s.PID != e.PID && (id == 0 || s.ID == id) {
				return true
			}
		}
		return false
	}
	for _, e := range exits {
		if !judged[e.PID] && cameBack(e) {
			d.Unbracketed = append(d.Unbracketed, fmt.Sprintf("%s pid %d at %s", e.Node, e.PID, history.FormatTime(e.Time)))
		}
	}

	if len(d.TwoLeaders) > 0 || len(d.Regressions) > 0 || len(d.LostTerms) > 0 {
		var parts []string
		for _, lt := range d.LostTerms {
			parts = append(parts, lt.String())
		}
		for _, tl := range d.TwoLeaders {
			var who []string
			for _, c := range tl.Claims {
				who = append(who, fmt.Sprintf("%s (id %d, first at %s)", c.Node, c.ID, history.FormatTime(c.First)))
			}
			parts = append(parts, fmt.Sprintf("two leaders in term %d: %s", tl.Term, strings.Join(who, " and ")))
		}
		for _, r := range d.Regressions {
			where := "within one process (pid " + fmt.Sprint(r.AfterPID) + ")"
			if r.Restart {
				where = fmt.Sprintf("across a restart (pid %d -> %d)", r.BeforePID, r.AfterPID)
			}
			parts = append(parts, fmt.Sprintf("%s (id %d) term went %d -> %d %s: last seen %d at %s, then %d at %s",
				r.Node, r.ID, r.BeforeTerm, r.AfterTerm, where, r.BeforeTerm, history.FormatTime(r.BeforeTime), r.AfterTerm, history.FormatTime(r.AfterTime)))
		}
		return Result{Name: name, Valid: Invalid, Details: d, Summary: strings.Join(parts, "; ")}
	}
	if d.Terms == 0 {
		return Result{Name: name, Valid: Unknown, Details: d,
			Summary: fmt.Sprintf("no node claimed leadership in any of %d samples: too few to judge election safety", d.Samples)}
	}
	if len(d.Unbracketed) > 0 && d.Restarts == 0 && d.LogStarts == 0 {
		return Result{Name: name, Valid: Unknown, Details: d,
			Summary: fmt.Sprintf("%d restarts, none with a sample before and after it and no node log to read: terms across restarts could not be judged (%d terms judged for a second leader)", len(d.Unbracketed), d.Terms)}
	}
	s := fmt.Sprintf("one leader per term in %d terms judged over %d samples; no term went down, %d restarts compared", d.Terms, d.Samples, d.Restarts)
	if d.LogStarts > 0 {
		s += fmt.Sprintf("; %d process starts in the nodes' logs at or above every term they had acted on", d.LogStarts)
	}
	if d.LogClaims > 0 {
		s += fmt.Sprintf("; %d leadership claims read from node logs at a power cut", d.LogClaims)
	}
	if len(d.Unbracketed) > 0 {
		s += fmt.Sprintf(" (%d exits not bracketed by samples: %s)", len(d.Unbracketed), strings.Join(d.Unbracketed, ", "))
	}
	return Result{Name: name, Valid: Valid, Details: d, Summary: s}
}
