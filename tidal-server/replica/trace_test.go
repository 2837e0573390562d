package replica_test

// Data-driven traces in the style of etcd raft's testdata: each file in
// testdata/*.txt is a script of commands, each followed by "----" and the
// output it must produce, then a blank line. Run with -rewrite to write the
// observed outputs back into the files (then read the diff!).
//
// Leader ids are not deterministic, so scripts name nodes through
// variables: "wait-leader as=L" binds L to the leader, "pick as=F not=L"
// binds F to some other node, and "rest" in a partition means every node
// not named elsewhere. Outputs are chosen to be deterministic for a given
// script: outcome classes (ok, unknown-outcome, no-leader, ...) and the
// applied payloads in log order, never indexes or terms.
//
// Commands:
//
//	cluster n=3 [snapshot-every=N] [catch-up=N] [election-ticks=N]
//	wait-leader as=VAR [nodes=A,B]      leader among nodes (default: running)
//	pick as=VAR not=A,B                 lowest running id not listed
//	propose node=A data=S [timeout=D]   prints the outcome class; retries
//	                                    no-leader and overloaded
//	propose-async node=A data=S as=VAR [timeout=D]
//	await VAR                           outcome of a propose-async
//	partition A|B,C|rest                groups separated by |
//	drop-appends from=A to=B            drop log replication A->B; heartbeats
//	                                    pass, so B keeps its leader but lags
//	heal                                undoes partitions and drop-appends
//	stop node=A / start node=A
//	join node=N                         start N, added earlier, with --join
//	wait-role node=A id=N role=R        until A sees member N as R (voter,
//	                                    learner, absent)
//	check-converged [nodes=A,B]         payloads in log order, one line
//	absent data=S                       "absent" unless some node applied S
//	add-member node=A id=N [timeout=D]  add learner N through A; the outcome
//	                                    (retries as propose, and dropped-retry)
//	add-member-async node=A id=N as=VAR [timeout=D]
//	remove-member node=A id=N [timeout=D]
//	members node=A                      voters and learners as A applied them
//	mark-log node=A as=VAR              VAR = the leader A's own durable last
//	                                    index
//	wait-log node=A above=VAR [by=N]    until that index is at least VAR+N
//	settle node=A                       until raft on A knows of everything A
//	                                    applied (so no conf change of A's is
//	                                    pending any more)
//
// There is no sleep: a script waits on conditions (wait-leader,
// check-converged, await), never on time.

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected outputs of testdata/*.txt traces")

type traceCase struct {
	line     int
	cmd      string
	expected string
}

func parseTrace(t *testing.T, path string) []traceCase {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cases []traceCase
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		tc := traceCase{line: n, cmd: line}
		if !sc.Scan() {
			t.Fatalf("%s:%d: command %q has no ---- separator", path, n, line)
		}
		n++
		if strings.TrimSpace(sc.Text()) != "----" {
			t.Fatalf("%s:%d: expected ---- after %q, found %q", path, n, line, sc.Text())
		}
		var out []string
		for sc.Scan() {
			n++
			if strings.TrimSpace(sc.Text()) == "" {
				break
			}
			out = append(out, sc.Text())
		}
		tc.expected = strings.Join(out, "\n")
		cases = append(cases, tc)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return cases
}

func writeTrace(t *testing.T, path string, cases []traceCase, got []string) {
	t.Helper()
	var b strings.Builder
	// Comments at the head of the file are kept; interleaved ones are not.
	data, _ := os.ReadFile(path)
	for _, l := range strings.Split(string(data), "\n") {
		if !strings.HasPrefix(l, "#") {
			break
		}
		b.WriteString(l + "\n")
	}
	for i, tc := range cases {
		fmt.Fprintf(&b, "\n%s\n----\n%s\n", tc.cmd, got[i])
	}
	if err := os.WriteFile(path, []byte(strings.TrimLeft(b.String(), "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestTraces(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no traces in testdata/")
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			cases := parseTrace(t, path)
			tr := &tracer{t: t, vars: map[string]uint64{}, async: map[string]chan error{}}
			got := make([]string, len(cases))
			for i, tc := range cases {
				got[i] = tr.run(tc, path)
				if !*rewrite && got[i] != tc.expected {
					t.Fatalf("%s:%d: %s\nexpected:\n%s\ngot:\n%s", path, tc.line, tc.cmd, tc.expected, got[i])
				}
			}
			if *rewrite {
				writeTrace(t, path, cases, got)
			}
		})
	}
}

type tracer struct {
	t     *testing.T
	c     *cluster
	vars  map[string]uint64
	async map[string]chan error
}

func (tr *tracer) run(tc traceCase, path string) string {
	fields := strings.Fields(tc.cmd)
	args := map[string]string{}
	var pos []string
	for _, f := range fields[1:] {
		if k, v, ok := strings.Cut(f, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, f)
		}
	}
	where := fmt.Sprintf("%s:%d", path, tc.line)
	fail := func(format string, a ...any) string {
		tr.t.Fatalf("%s: %s: %s", where, tc.cmd, fmt.Sprintf(format, a...))
		return ""
	}
	num := func(k string, def int) int {
		v, ok := args[k]
		if !ok {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			fail("%s=%q: expected an integer", k, v)
		}
		return n
	}
	dur := func(k string, def time.Duration) time.Duration {
		v, ok := args[k]
		if !ok {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			fail("%s=%q: expected a duration", k, v)
		}
		return d
	}
	if tr.c == nil && fields[0] != "cluster" {
		return fail("the first command must be cluster")
	}

	switch fields[0] {
	case "cluster":
		tr.c = newCluster(tr.t, num("n", 3), func(cfg *replica.Config) {
			cfg.SnapshotEvery = uint64(num("snapshot-every", 10000))
			cfg.SnapshotCatchUp = uint64(num("catch-up", 5000))
			cfg.ElectionTicks = num("election-ticks", 10)
			cfg.WAL.SegmentSize = 16 << 10
		})
		return "ok"
	case "wait-leader":
		var ids []uint64
		if s, ok := args["nodes"]; ok {
			ids = tr.ids(s, fail)
		}
		l := tr.c.waitLeader(ids...)
		tr.vars[args["as"]] = l
		return "ok"
	case "pick":
		not := map[uint64]bool{}
		if s, ok := args["not"]; ok {
			for _, id := range tr.ids(s, fail) {
				not[id] = true
			}
		}
		for _, id := range tr.c.running() {
			if !not[id] {
				tr.vars[args["as"]] = id
				return "ok"
			}
		}
		return fail("no running node outside %s", args["not"])
	case "propose":
		// Retried while the answer is "certainly not made, retry" (no
		// leader for a moment, overloaded): a spurious election on a loaded
		// machine must not change a script's output. propose-async is one
		// attempt.
		_, err := tr.c.proposeRetrying(tr.id(args["node"], fail), args["data"], dur("timeout", 5*time.Second))
		return outcome(err)
	case "propose-async":
		ch := make(chan error, 1)
		id, data, timeout := tr.id(args["node"], fail), args["data"], dur("timeout", 5*time.Second)
		r := tr.c.node(id).r
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_, err := r.Propose(ctx, []byte(data))
			ch <- err
		}()
		tr.async[args["as"]] = ch
		return "ok"
	case "await":
		ch, ok := tr.async[pos[0]]
		if !ok {
			return fail("no propose-async named %s", pos[0])
		}
		return outcome(<-ch)
	case "partition":
		groups := strings.Split(pos[0], "|")
		named := map[uint64]bool{}
		var parts [][]uint64
		restAt := -1
		for i, g := range groups {
			if g == "rest" {
				restAt = i
				parts = append(parts, nil)
				continue
			}
			ids := tr.ids(g, fail)
			for _, id := range ids {
				named[id] = true
			}
			parts = append(parts, ids)
		}
		if restAt >= 0 {
			for id := range tr.c.nodes {
				if !named[id] {
					parts[restAt] = append(parts[restAt], id)
				}
			}
		}
		tr.c.net.partition(parts...)
		return "ok"
	case "heal":
		tr.c.net.heal()
		return "ok"
	case "stop":
		tr.c.stop(tr.id(args["node"], fail))
		return "ok"
	case "start":
		tr.c.start(tr.id(args["node"], fail), false)
		return "ok"
	case "drop-appends":
		tr.c.net.setFaults(tr.id(args["from"], fail), tr.id(args["to"], fail), linkFaults{dropAppends: true})
		return "ok"
	case "add-member", "add-member-async", "remove-member":
		r := tr.c.node(tr.id(args["node"], fail)).r
		id := uint64(num("id", 0))
		if id == 0 {
			return fail("id=N (N > 0) is required")
		}
		timeout := dur("timeout", 5*time.Second)
		change := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			if fields[0] == "remove-member" {
				return r.RemoveMember(ctx, id)
			}
			return r.AddMember(ctx, replica.Member{ID: id, PeerAddr: peerAddr(id)})
		}
		if fields[0] != "add-member-async" {
			// Retried like propose; a new leader, for one, drops
			// changes until it has applied its predecessor's log.
			return outcome(retrying(change))
		}
		ch := make(chan error, 1)
		go func() { ch <- change() }()
		tr.async[args["as"]] = ch
		return "ok"
	case "members":
		var voters, learners []string
		for _, m := range tr.c.node(tr.id(args["node"], fail)).r.Status().Members {
			if m.Role == "learner" {
				learners = append(learners, strconv.FormatUint(m.ID, 10))
			} else {
				voters = append(voters, strconv.FormatUint(m.ID, 10))
			}
		}
		return fmt.Sprintf("voters=%s learners=%s", strings.Join(voters, ","), strings.Join(learners, ","))
	case "mark-log", "wait-log":
		id := tr.id(args["node"], fail)
		durable := func() uint64 { return durableIndex(tr.c, id) }
		if fields[0] == "mark-log" {
			tr.vars[args["as"]] = durable()
			return "ok"
		}
		base, ok := tr.vars[args["above"]]
		if !ok {
			return fail("no mark-log named %s", args["above"])
		}
		want := base + uint64(num("by", 1))
		waitFor(tr.t, 30*time.Second, fmt.Sprintf("%s: node %d's durable log to reach %d", where, id, want), func() (bool, string) {
			got := durable()
			return got >= want, fmt.Sprint(got)
		})
		return "ok"
	case "settle":
		r := tr.c.node(tr.id(args["node"], fail)).r
		applied := r.Applied()
		waitFor(tr.t, 30*time.Second, fmt.Sprintf("%s: raft to know of applied index %d", where, applied), func() (bool, string) {
			got := replica.RaftApplied(r)
			return got >= applied, fmt.Sprintf("raft applied %d", got)
		})
		return "ok"
	case "join":
		tr.c.start(tr.id(args["node"], fail), true)
		return "ok"
	case "wait-role":
		r := tr.c.node(tr.id(args["node"], fail)).r
		id, want := uint64(num("id", 0)), args["role"]
		waitFor(tr.t, 30*time.Second, fmt.Sprintf("%s: member %d to be %s", where, id, want), func() (bool, string) {
			role := "absent"
			for _, m := range r.Status().Members {
				if m.ID == id {
					role = "voter"
					if m.Role == "learner" {
						role = "learner"
					}
				}
			}
			return role == want, role
		})
		return "ok"
	case "check-converged":
		var ids []uint64
		if s, ok := args["nodes"]; ok {
			ids = tr.ids(s, fail)
		}
		st := tr.c.waitConverged(ids...)
		var out []string
		for _, e := range st.Entries {
			out = append(out, e.Data)
		}
		return strings.Join(out, " ")
	case "absent":
		ids := make([]uint64, 0, len(tr.c.nodes))
		for id := range tr.c.nodes {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		for _, id := range ids {
			if nd := tr.c.nodes[id]; nd.r != nil {
				if _, ok := nd.sm.has(args["data"]); ok {
					return fmt.Sprintf("present on node %d", id)
				}
			}
		}
		return "absent"
	}
	return fail("unknown command")
}

func (tr *tracer) id(s string, fail func(string, ...any) string) uint64 {
	if v, ok := tr.vars[s]; ok {
		return v
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 {
		fail("%q is neither a node id nor a bound variable", s)
	}
	return n
}

func (tr *tracer) ids(s string, fail func(string, ...any) string) []uint64 {
	var out []uint64
	for _, p := range strings.Split(s, ",") {
		out = append(out, tr.id(p, fail))
	}
	return out
}

// outcome names an error's class; these are what the HTTP layer maps to
// status codes, so a trace asserts on what a client would see.
func outcome(err error) string {
	var me *replica.MembershipError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &me) && me.NotFound:
		return "not-found: " + me.Msg
	case errors.As(err, &me):
		return "conflict: " + me.Msg
	case errors.Is(err, replica.ErrUnknownOutcome):
		return "unknown-outcome"
	case errors.Is(err, replica.ErrNoLeader):
		return "no-leader"
	case errors.Is(err, replica.ErrConfChangeDropped):
		return "dropped-retry"
	case errors.Is(err, replica.ErrOverloaded):
		return "overloaded"
	case errors.Is(err, replica.ErrFenced):
		return "fenced"
	case errors.Is(err, replica.ErrRemoved):
		return "removed"
	case errors.Is(err, replica.ErrStopped):
		return "stopped"
	}
	return "error: " + err.Error()
}
