package shard

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/*.txt with what the package produces")

// TestDataDriven runs the scripts in testdata/*.txt, traces of the shard
// map in the style of etcd raft's interaction tests:
//
//	command key=value ...
//	input lines (validate only)
//	----
//	expected output
//
// Blocks are separated by blank lines; lines starting with # between
// blocks are comments. A script holds one current map, set by bootstrap
// (or a validate that passes) and replaced by every change that succeeds.
// Run with -rewrite to regenerate the expected output after an intended
// change, then read the diff.
//
// Commands:
//
//	bootstrap shards=S r=R nodes=A,B,...   placement table of the new map
//	show                                   placement table of the current map
//	route entities=A,B,...                 entity -> slot -> group (leader)
//	split-batch entities=A,B,...           one line per part: group: positions
//	add-node node=N | remove-node node=N
//	add-learner group=G node=N | promote group=G node=N
//	remove-replica group=G node=N | set-leader group=G node=N
//	split group=G at=SLOT | merge left=G right=H
//	                                       each prints the epoch change and the
//	                                       groups it touched, or its error
//	check-route group=G epoch=E entities=A,B,...
//	                                       ok, or the error and its JSON
//	not-leader group=G [hint=N]            the error and its JSON
//	encode                                 size, header and CRC of the encoding
//	decode [flip=OFF] [version=V] [truncate=N] [slots=K]
//	                                       decodes the current map's encoding,
//	                                       altered: a byte flipped (CRC left
//	                                       stale), the version or slot count
//	                                       rewritten (CRC recomputed), cut
//	validate                               a map given as input lines:
//	                                       "epoch=E r=R nodes=.. meta=.. [next-group=G]"
//	                                       then per group "group=G slots=A-B leader=N
//	                                       voters=.. [learners=..] [conf=E] [slots-epoch=E]"
func TestDataDriven(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata: %v", err)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) { runScript(t, path) })
	}
}

func runScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := &script{}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	var out bytes.Buffer
	for i := 0; i < len(lines); {
		line := lines[i]
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			i++
			continue
		}
		cmdLine, at := line, i+1
		i++
		var input []string
		for i < len(lines) && lines[i] != "----" {
			input = append(input, lines[i])
			i++
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: command without ---- separator", path, at)
		}
		i++
		var expected []string
		for i < len(lines) && strings.TrimSpace(lines[i]) != "" {
			expected = append(expected, lines[i])
			i++
		}
		got, err := sc.run(cmdLine, input)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", path, at, cmdLine, err)
		}
		got = strings.TrimRight(got, "\n")
		if want := strings.Join(expected, "\n"); got != want && !*rewrite {
			t.Errorf("%s:%d: %s\n got:\n%s\n want:\n%s", path, at, cmdLine, got, want)
		}
		out.WriteString(cmdLine + "\n")
		for _, in := range input {
			out.WriteString(in + "\n")
		}
		out.WriteString("----\n" + got + "\n")
	}
	if *rewrite {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type script struct {
	m   Map
	has bool
}

type args map[string]string

func parseArgs(words []string) (args, error) {
	a := args{}
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			return nil, fmt.Errorf("expected key=value, found %q", w)
		}
		a[k] = v
	}
	return a, nil
}

func (a args) uint(key string) (uint64, error) {
	v, ok := a[key]
	if !ok {
		return 0, fmt.Errorf("missing %s=", key)
	}
	return strconv.ParseUint(v, 10, 64)
}

func (a args) list(key string) ([]uint64, error) {
	v, ok := a[key]
	if !ok {
		return nil, fmt.Errorf("missing %s=", key)
	}
	return parseList(v)
}

func parseList(v string) ([]uint64, error) {
	var out []uint64
	if v == "" {
		return nil, nil
	}
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

func nodeIDs(v []uint64) []NodeID {
	out := make([]NodeID, len(v))
	for i, x := range v {
		out[i] = NodeID(x)
	}
	return out
}

func (sc *script) run(cmdLine string, input []string) (string, error) {
	words := strings.Fields(cmdLine)
	a, err := parseArgs(words[1:])
	if err != nil {
		return "", err
	}
	if words[0] != "bootstrap" && words[0] != "validate" && !sc.has {
		return "", fmt.Errorf("%s before any bootstrap", words[0])
	}
	switch words[0] {
	case "bootstrap":
		s, err1 := a.uint("shards")
		r, err2 := a.uint("r")
		nodes, err3 := a.list("nodes")
		if err := firstErr(err1, err2, err3); err != nil {
			return "", err
		}
		m, err := Bootstrap(int(s), int(r), nodeIDs(nodes))
		if err != nil {
			return "error: " + err.Error(), nil
		}
		sc.m, sc.has = m, true
		return table(&m), nil
	case "show":
		return table(&sc.m), nil
	case "route":
		ents, err := a.list("entities")
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, e := range ents {
			g, _ := sc.m.Group(sc.m.GroupOf(e))
			fmt.Fprintf(&b, "entity %d -> slot %d -> group %d [%d,%d) leader %d\n", e, SlotOf(e), g.ID, g.Start, g.End, g.Leader)
		}
		return b.String(), nil
	case "split-batch":
		ents, err := a.list("entities")
		if err != nil {
			return "", err
		}
		var b strings.Builder
		for _, p := range sc.m.SplitBatch(ents) {
			fmt.Fprintf(&b, "group %d: positions %s entities %s\n", p.Group, joinInts(p.Indexes), joinInts(pick(ents, p.Indexes)))
		}
		return b.String(), nil
	case "add-node", "remove-node", "add-learner", "promote", "remove-replica", "set-leader", "split", "merge":
		return sc.change(words[0], a)
	case "check-route":
		g, err1 := a.uint("group")
		e, err2 := a.uint("epoch")
		ents, err3 := a.list("entities")
		if err := firstErr(err1, err2, err3); err != nil {
			return "", err
		}
		err := sc.m.CheckRoute(GroupID(g), e, ents)
		if err == nil {
			return "ok", nil
		}
		return routeError(err)
	case "not-leader":
		g, err := a.uint("group")
		if err != nil {
			return "", err
		}
		hint := uint64(0)
		if _, ok := a["hint"]; ok {
			if hint, err = a.uint("hint"); err != nil {
				return "", err
			}
		}
		return routeError(sc.m.NotLeaderOf(GroupID(g), NodeID(hint)))
	case "encode":
		b := sc.m.Encode()
		return fmt.Sprintf("%d bytes: header %s, crc %s", len(b), hex.EncodeToString(b[:headerLen]), hex.EncodeToString(b[len(b)-4:])), nil
	case "decode":
		return sc.decode(a)
	case "validate":
		m, err := parseMap(input)
		if err != nil {
			return "", err
		}
		if err := m.Validate(); err != nil {
			return err.Error(), nil
		}
		sc.m, sc.has = m, true
		return "ok", nil
	}
	return "", fmt.Errorf("unknown command %q", words[0])
}

func (sc *script) change(op string, a args) (string, error) {
	var (
		next  Map
		err   error
		extra string
	)
	switch op {
	case "add-node", "remove-node":
		n, aerr := a.uint("node")
		if aerr != nil {
			return "", aerr
		}
		if op == "add-node" {
			next, err = sc.m.AddNode(NodeID(n))
		} else {
			next, err = sc.m.RemoveNode(NodeID(n))
		}
	case "split":
		g, err1 := a.uint("group")
		at, err2 := a.uint("at")
		if err := firstErr(err1, err2); err != nil {
			return "", err
		}
		var id GroupID
		next, id, err = sc.m.Split(GroupID(g), Slot(at))
		extra = fmt.Sprintf(" (new group %d)", id)
	case "merge":
		l, err1 := a.uint("left")
		r, err2 := a.uint("right")
		if err := firstErr(err1, err2); err != nil {
			return "", err
		}
		next, err = sc.m.Merge(GroupID(l), GroupID(r))
	default:
		g, err1 := a.uint("group")
		n, err2 := a.uint("node")
		if err := firstErr(err1, err2); err != nil {
			return "", err
		}
		f := map[string]func(GroupID, NodeID) (Map, error){
			"add-learner": sc.m.AddLearner, "promote": sc.m.Promote,
			"remove-replica": sc.m.RemoveReplica, "set-leader": sc.m.SetLeader,
		}[op]
		next, err = f(GroupID(g), NodeID(n))
	}
	if err != nil {
		return "error: " + err.Error(), nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d -> %d%s\n", sc.m.Epoch, next.Epoch, extra)
	if !slicesEqual(sc.m.Nodes, next.Nodes) {
		fmt.Fprintf(&b, "nodes %s\n", joinIDs(next.Nodes))
	}
	// Print the groups whose description changed, and any that went.
	for _, g := range next.Groups {
		if old, ok := sc.m.Group(g.ID); !ok || groupLine(old) != groupLine(g) {
			b.WriteString(groupLine(g) + "\n")
		}
	}
	for _, g := range sc.m.Groups {
		if _, ok := next.Group(g.ID); !ok {
			fmt.Fprintf(&b, "group %d retired\n", g.ID)
		}
	}
	sc.m = next
	return b.String(), nil
}

func (sc *script) decode(a args) (string, error) {
	b := sc.m.Encode()
	recrc := func() {
		body := b[:len(b)-4]
		binary.LittleEndian.PutUint32(b[len(body):], crc32.Checksum(body, castagnoli))
	}
	if v, ok := a["version"]; ok {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			return "", err
		}
		binary.LittleEndian.PutUint16(b[4:6], uint16(n))
		recrc()
	}
	if v, ok := a["slots"]; ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return "", err
		}
		binary.LittleEndian.PutUint32(b[headerLen+8:], uint32(n))
		recrc()
	}
	if v, ok := a["flip"]; ok {
		off, err := strconv.Atoi(v)
		if err != nil {
			return "", err
		}
		b[off] ^= 0xff
	}
	if v, ok := a["truncate"]; ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			return "", err
		}
		b = b[:n]
	}
	m, err := Decode(b)
	if err != nil {
		return "error: " + err.Error(), nil
	}
	return fmt.Sprintf("ok: epoch %d, %d groups", m.Epoch, len(m.Groups)), nil
}

func routeError(err error) (string, error) {
	body, ok := EncodeRouteError(err)
	if !ok {
		return "", fmt.Errorf("not a routing error: %v", err)
	}
	back, derr := DecodeRouteError(body)
	if derr != nil {
		return "", derr
	}
	if back.Error() != err.Error() {
		return "", fmt.Errorf("JSON round trip changed the error: %q became %q", err, back)
	}
	s := err.Error() + "\n"
	if len(body) > 200 {
		// The map inside an epoch mismatch is long; its epoch is what
		// matters in a trace.
		return s + fmt.Sprintf("json: %d bytes, %s...", len(body), body[:120]), nil
	}
	return s + "json: " + string(body), nil
}

func table(m *Map) string {
	var b strings.Builder
	fmt.Fprintf(&b, "epoch %d, %d slots, R=%d, nodes %s, meta %s\n", m.Epoch, NumSlots, m.ReplicationFactor, joinIDs(m.Nodes), joinIDs(m.Meta))
	for _, g := range m.Groups {
		b.WriteString(groupLine(g) + "\n")
	}
	for _, n := range m.Nodes {
		leads := 0
		for _, g := range m.Groups {
			if g.Leader == n {
				leads++
			}
		}
		gs := m.GroupsOn(n)
		fmt.Fprintf(&b, "node %d: %d replicas, leads %d, groups %s\n", n, len(gs), leads, joinIDs(gs))
	}
	return b.String()
}

func groupLine(g Group) string {
	var rs []string
	for _, r := range g.Replicas {
		s := fmt.Sprintf("%d", r.Node)
		if r.ID != ReplicaID(r.Node) {
			s += fmt.Sprintf("#%d", r.ID)
		}
		if r.Role == Learner {
			s += "(learner)"
		}
		rs = append(rs, s)
	}
	return fmt.Sprintf("group %d: slots [%d,%d) leader %d replicas %s conf-epoch %d slots-epoch %d",
		g.ID, g.Start, g.End, g.Leader, strings.Join(rs, " "), g.ConfEpoch, g.SlotsEpoch)
}

// parseMap builds a map from the validate command's input lines, with
// nothing checked: that is Validate's job.
func parseMap(lines []string) (Map, error) {
	if len(lines) == 0 {
		return Map{}, fmt.Errorf("validate needs a map line")
	}
	a, err := parseArgs(strings.Fields(lines[0]))
	if err != nil {
		return Map{}, err
	}
	e, err1 := a.uint("epoch")
	r, err2 := a.uint("r")
	nodes, err3 := a.list("nodes")
	meta, err4 := a.list("meta")
	if err := firstErr(err1, err2, err3, err4); err != nil {
		return Map{}, err
	}
	m := Map{Epoch: e, ReplicationFactor: int(r), Nodes: nodeIDs(nodes), Meta: nodeIDs(meta), NextGroupID: GroupID(len(lines))}
	if _, ok := a["next-group"]; ok {
		n, err := a.uint("next-group")
		if err != nil {
			return Map{}, err
		}
		m.NextGroupID = GroupID(n)
	}
	for _, line := range lines[1:] {
		ga, err := parseArgs(strings.Fields(line))
		if err != nil {
			return Map{}, err
		}
		id, err1 := ga.uint("group")
		leader, err2 := ga.uint("leader")
		voters, err3 := ga.list("voters")
		if err := firstErr(err1, err2, err3); err != nil {
			return Map{}, err
		}
		lo, hi, ok := strings.Cut(ga["slots"], "-")
		start, err4 := strconv.ParseUint(lo, 10, 32)
		end, err5 := strconv.ParseUint(hi, 10, 32)
		if err := firstErr(err4, err5); err != nil || !ok {
			return Map{}, fmt.Errorf("slots=%q, expected A-B", ga["slots"])
		}
		g := Group{ID: GroupID(id), Start: Slot(start), End: Slot(end), Leader: NodeID(leader), ConfEpoch: 1, SlotsEpoch: 1}
		for k, key := range []string{"conf", "slots-epoch"} {
			if _, ok := ga[key]; ok {
				v, err := ga.uint(key)
				if err != nil {
					return Map{}, err
				}
				*[]*uint64{&g.ConfEpoch, &g.SlotsEpoch}[k] = v
			}
		}
		learners, _ := parseList(ga["learners"])
		for _, n := range voters {
			g.Replicas = append(g.Replicas, Replica{Node: NodeID(n), ID: ReplicaID(n), Role: Voter})
			g.NextReplicaID = max(g.NextReplicaID, ReplicaID(n)+1)
		}
		for _, n := range learners {
			g.Replicas = append(g.Replicas, Replica{Node: NodeID(n), ID: ReplicaID(n), Role: Learner})
			g.NextReplicaID = max(g.NextReplicaID, ReplicaID(n)+1)
		}
		sortReplicas(g.Replicas)
		m.Groups = append(m.Groups, g)
	}
	return m, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func joinInts[T ~int | ~uint64](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

func pick(xs []uint64, idx []int) []uint64 {
	out := make([]uint64, len(idx))
	for i, k := range idx {
		out[i] = xs[k]
	}
	return out
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
