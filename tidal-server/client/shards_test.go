package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/shard"
)

// fakeCluster is a sharded cluster of fake nodes that implements the
// client contract of docs/ARCHITECTURE.md "Shards" and "API details": GET
// /v1/shards, routed writes (X-Tidal-Shard, X-Tidal-Map-Epoch) answered
// by the group's leader or a 421, unrouted writes split by the receiving
// node and answered 204 (one group) or 200/207 with the per-group body,
// and routed entity reads. Groups are in-process: a node "forwards" a part
// by applying it to the group directly.
type fakeCluster struct {
	t     *testing.T
	nodes map[shard.NodeID]*httptest.Server

	mu sync.Mutex
	m  shard.Map
	// leader is each group's actual raft leader; it may differ from the
	// map's preferred leader (then a routed request at the preferred one
	// is answered not_leader).
	leader map[shard.GroupID]shard.NodeID
	// failWith makes every write to the group fail with this status
	// (503: refused before proposing, so definite).
	failWith map[shard.GroupID]int
	// applied: per group, event id -> entity; seq per group.
	// behind holds nodes whose map is behind the cluster's: such a node
	// routes with its own map once, then catches up (as a node that
	// answered an older epoch_mismatch fetches the newer map).
	behind  map[shard.NodeID]shard.Map
	applied map[shard.GroupID]map[string]uint64
	seq     map[shard.GroupID]uint64
	reqs    []fakeReq
}

// fakeReq is one request a node received.
type fakeReq struct {
	node    shard.NodeID
	method  string
	path    string
	group   string // X-Tidal-Shard of the request; "" unrouted
	epoch   string // X-Tidal-Map-Epoch of the request
	timeout string // X-Tidal-Timeout-Ms of the request
	status  int
}

// newFakeCluster starts n fake nodes holding a map of shards groups at
// replication factor rf.
func newFakeCluster(t *testing.T, n, shards, rf int) *fakeCluster {
	t.Helper()
	fc := &fakeCluster{t: t, nodes: map[shard.NodeID]*httptest.Server{}, leader: map[shard.GroupID]shard.NodeID{},
		failWith: map[shard.GroupID]int{}, applied: map[shard.GroupID]map[string]uint64{}, seq: map[shard.GroupID]uint64{}}
	var ids []shard.NodeID
	for i := 1; i <= n; i++ {
		id := shard.NodeID(i)
		ids = append(ids, id)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fc.serve(id, w, r) }))
		t.Cleanup(srv.Close)
		fc.nodes[id] = srv
	}
	m, err := shard.Bootstrap(shards, rf, ids)
	if err != nil {
		t.Fatal(err)
	}
	fc.setMap(m)
	return fc
}

// setMap installs m on every node; each group is led by its preferred
// leader.
func (fc *fakeCluster) setMap(m shard.Map) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.m = m
	fc.leader = map[shard.GroupID]shard.NodeID{}
	for _, g := range m.Groups {
		fc.leader[g.ID] = g.Leader
	}
}

func (fc *fakeCluster) client(seed shard.NodeID, opts ...Option) *Client {
	c := New(fc.nodes[seed].Listener.Addr().String(), append([]Option{WithBackoff(time.Millisecond, 5*time.Millisecond)}, opts...)...)
	fc.t.Cleanup(c.CloseIdleConnections)
	return c
}

func (fc *fakeCluster) requests() []fakeReq {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return slices.Clone(fc.reqs)
}

func (fc *fakeCluster) resetRequests() {
	fc.mu.Lock()
	fc.reqs = nil
	fc.mu.Unlock()
}

// appliedIn returns the group that applied event id, 0 if none; it fails
// the test if more than one group did.
func (fc *fakeCluster) appliedIn(id string) shard.GroupID {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	var in shard.GroupID
	for g, ids := range fc.applied {
		if _, ok := ids[id]; ok {
			if in != 0 {
				fc.t.Errorf("event %s applied in groups %d and %d", id, in, g)
			}
			in = g
		}
	}
	return in
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (fc *fakeCluster) serve(node shard.NodeID, w http.ResponseWriter, r *http.Request) {
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	defer func() {
		fc.mu.Lock()
		fc.reqs = append(fc.reqs, fakeReq{node: node, method: r.Method, path: r.URL.Path, group: r.Header.Get(headerShard),
			epoch: r.Header.Get(headerMapEpoch), timeout: r.Header.Get(headerTimeout), status: sw.status})
		fc.mu.Unlock()
	}()
	w = sw
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/v1/shards":
		fc.mu.Lock()
		m := fc.m
		var nodes []map[string]any
		for _, n := range m.Nodes {
			nodes = append(nodes, map[string]any{"id": n, "client_addr": fc.nodes[n].Listener.Addr().String()})
		}
		fc.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"map": &m, "nodes": nodes})
	case r.Method == http.MethodPost && r.URL.Path == "/v1/signals":
		fc.write(node, w, r)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/entities/"):
		fc.read(node, w, r)
	default:
		writeError(w, http.StatusNotFound, CodeNotFound, "", "no route "+r.URL.Path)
	}
}

// route checks a routed request (X-Tidal-Shard present) as a node would:
// CheckRoute, then leadership when needLeader. It writes the 421 and
// returns false when the request cannot be served here.
func (fc *fakeCluster) route(node shard.NodeID, w http.ResponseWriter, r *http.Request, entities []uint64, needLeader bool) (shard.GroupID, bool) {
	gv, err := strconv.ParseUint(r.Header.Get(headerShard), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, headerShard, err.Error())
		return 0, false
	}
	epoch, _ := strconv.ParseUint(r.Header.Get(headerMapEpoch), 10, 64)
	g := shard.GroupID(gv)
	fc.mu.Lock()
	m, leader := fc.m, fc.leader[g]
	old, isBehind := fc.behind[node]
	fc.mu.Unlock()
	if isBehind {
		if rerr := old.CheckRoute(g, epoch, entities); rerr != nil {
			fc.mu.Lock()
			delete(fc.behind, node)
			fc.mu.Unlock()
			body, _ := shard.EncodeRouteError(rerr)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(misdirected)
			_, _ = w.Write(body)
			return 0, false
		}
	}
	rerr := m.CheckRoute(g, epoch, entities)
	if rerr == nil {
		grp, _ := m.Group(g)
		_, hosts := grp.Replica(node)
		if !hosts || (needLeader && leader != node) {
			rerr = m.NotLeaderOf(g, leader)
		}
	}
	if rerr != nil {
		body, _ := shard.EncodeRouteError(rerr)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(misdirected)
		_, _ = w.Write(body)
		return 0, false
	}
	return g, true
}

// apply applies a part to group g and returns its ack, or the status it
// fails with.
func (fc *fakeCluster) apply(g shard.GroupID, events []Event) (GroupAck, int) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if st := fc.failWith[g]; st != 0 {
		return GroupAck{}, st
	}
	if fc.applied[g] == nil {
		fc.applied[g] = map[string]uint64{}
	}
	dups := 0
	for _, e := range events {
		if _, ok := fc.applied[g][e.ID]; ok {
			dups++
			continue
		}
		fc.applied[g][e.ID] = e.Entity
	}
	fc.seq[g]++
	return GroupAck{Group: uint64(g), Seq: fc.seq[g], Term: 2, Node: uint64(fc.leader[g]), Duplicates: dups}, 0
}

func ackHeaders(w http.ResponseWriter, ga GroupAck, epoch uint64) {
	w.Header().Set("X-Tidal-Seq", strconv.FormatUint(ga.Seq, 10))
	w.Header().Set("X-Tidal-Term", strconv.FormatUint(ga.Term, 10))
	w.Header().Set("X-Tidal-Node", strconv.FormatUint(ga.Node, 10))
	if ga.Duplicates > 0 {
		w.Header().Set("X-Tidal-Duplicates", strconv.Itoa(ga.Duplicates))
	}
	w.Header().Set(headerShard, strconv.FormatUint(ga.Group, 10))
	w.Header().Set(headerMapEpoch, strconv.FormatUint(epoch, 10))
}

func (fc *fakeCluster) write(node shard.NodeID, w http.ResponseWriter, r *http.Request) {
	var body struct {
		Events []Event `json:"events"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, "", err.Error())
		return
	}
	ents := make([]uint64, len(body.Events))
	for i, e := range body.Events {
		ents[i] = e.Entity
	}
	fc.mu.Lock()
	m := fc.m
	fc.mu.Unlock()
	if r.Header.Get(headerShard) != "" {
		g, ok := fc.route(node, w, r, ents, true)
		if !ok {
			return
		}
		ga, st := fc.apply(g, body.Events)
		if st != 0 {
			writeError(w, st, codeForStatus(st), "", fmt.Sprintf("group %d refuses writes", g))
			return
		}
		ackHeaders(w, ga, m.Epoch)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// Unrouted: split and apply every part (the one hop to each leader).
	parts := m.SplitBatch(ents)
	if len(parts) == 1 {
		ga, st := fc.apply(parts[0].Group, body.Events)
		if st != 0 {
			writeError(w, st, codeForStatus(st), "", fmt.Sprintf("group %d refuses writes", parts[0].Group))
			return
		}
		ackHeaders(w, ga, m.Epoch)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	ans := map[string]any{"epoch": m.Epoch}
	var groups, failed []map[string]any
	for _, p := range parts {
		evs := make([]Event, len(p.Indexes))
		for i, j := range p.Indexes {
			evs[i] = body.Events[j]
		}
		ga, st := fc.apply(p.Group, evs)
		if st != 0 {
			for _, j := range p.Indexes {
				failed = append(failed, map[string]any{"position": j, "id": body.Events[j].ID, "group": p.Group, "status": st,
					"indefinite": st == http.StatusGatewayTimeout, "error": map[string]string{"code": codeForStatus(st), "message": fmt.Sprintf("group %d refuses writes", p.Group)}})
			}
			continue
		}
		groups = append(groups, map[string]any{"group": ga.Group, "seq": ga.Seq, "term": ga.Term, "node": ga.Node,
			"duplicates": ga.Duplicates, "events": p.Indexes})
	}
	ans["groups"], ans["failed"] = groups, failed
	w.Header().Set("Content-Type", "application/json")
	if len(failed) > 0 {
		w.WriteHeader(http.StatusMultiStatus)
	}
	_ = json.NewEncoder(w).Encode(ans)
}

func (fc *fakeCluster) read(node shard.NodeID, w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseUint(strings.TrimPrefix(r.URL.Path, "/v1/entities/"), 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeInvalidArgument, "entity", err.Error())
		return
	}
	if r.Header.Get(headerShard) != "" {
		if _, ok := fc.route(node, w, r, []uint64{id}, r.URL.Query().Get("consistency") != "local"); !ok {
			return
		}
	}
	fc.mu.Lock()
	w.Header().Set(headerMapEpoch, strconv.FormatUint(fc.m.Epoch, 10))
	fc.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(Entity{Entity: id, AppliedIndex: uint64(node)})
}

// batch returns n events with ids prefix-i on entities 1000+i.
func batch(prefix string, n int) []Event {
	evs := make([]Event, n)
	for i := range evs {
		evs[i] = Event{ID: fmt.Sprintf("%s-%d", prefix, i), Entity: uint64(1000 + i), Signal: "view"}
	}
	return evs
}

// checkApplied checks that res reports every event applied, in batch
// order, by the group m assigns it, and that that group — and only it —
// applied it.
func checkApplied(t *testing.T, fc *fakeCluster, m *shard.Map, evs []Event, res *WriteResult) {
	t.Helper()
	if len(res.Events) != len(evs) {
		t.Fatalf("result has %d events, expected %d", len(res.Events), len(evs))
	}
	for i, e := range evs {
		want := m.GroupOf(e.Entity)
		got := res.Events[i]
		if got.Err != nil || got.Group != uint64(want) || got.Seq == 0 {
			t.Errorf("event %d (%s, entity %d): result %+v, expected applied by group %d", i, e.ID, e.Entity, got, want)
		}
		if in := fc.appliedIn(e.ID); in != want {
			t.Errorf("event %d (%s, entity %d): applied in group %d, expected %d", i, e.ID, e.Entity, in, want)
		}
	}
	covered := 0
	for _, ga := range res.Groups {
		covered += len(ga.Events)
		for _, p := range ga.Events {
			if res.Events[p].Group != ga.Group {
				t.Errorf("group ack %d lists event %d, which the result gives group %d", ga.Group, p, res.Events[p].Group)
			}
		}
	}
	if covered != len(evs) {
		t.Errorf("group acks cover %d events, expected %d", covered, len(evs))
	}
}

// TestShardedWriteSplitsAndMerges: the first write goes unrouted (the
// node splits it and announces its map); the client then fetches the map
// once and sends each later batch's parts straight to their leaders; the
// merged result is in batch order.
func TestShardedWriteSplitsAndMerges(t *testing.T) {
	fc := newFakeCluster(t, 3, 2, 2)
	c := fc.client(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	first := batch("a", 20)
	res, err := c.Write(ctx, first)
	if err != nil {
		t.Fatalf("first write: %v", err)
	}
	checkApplied(t, fc, &fc.m, first, res)
	if reqs := fc.requests(); len(reqs) != 1 || reqs[0].group != "" || reqs[0].status != http.StatusOK {
		t.Fatalf("first write: requests %+v, expected one unrouted POST answered 200 with the split body", reqs)
	}
	if res.Attempts != 1 {
		t.Errorf("first write: %d attempts, expected 1", res.Attempts)
	}

	fc.resetRequests()
	second := batch("b", 20)
	res, err = c.Write(ctx, second)
	if err != nil {
		t.Fatalf("second write: %v", err)
	}
	checkApplied(t, fc, &fc.m, second, res)
	reqs := fc.requests()
	var fetches, posts int
	for _, r := range reqs {
		switch r.path {
		case "/v1/shards":
			fetches++
		case "/v1/signals":
			posts++
			g, _ := strconv.ParseUint(r.group, 10, 64)
			if r.group == "" || r.epoch != "1" || r.status != http.StatusNoContent || r.node != fc.m.Groups[g-1].Leader {
				t.Errorf("second write: part %+v, expected routed to its group's leader with epoch 1 and answered 204", r)
			}
			if r.timeout == "" {
				t.Errorf("second write: part %+v carries no %s, expected the caller's deadline", r, headerTimeout)
			}
		}
	}
	if fetches != 1 || posts != 2 {
		t.Errorf("second write: %d map fetches and %d posts (%+v), expected 1 and 2 (one per group)", fetches, posts, reqs)
	}
	if got := c.ShardMap(); got == nil || got.Epoch != 1 {
		t.Errorf("cached map %+v, expected epoch 1", got)
	}

	fc.resetRequests()
	ack, err := c.WriteSignals(ctx, batch("c", 20))
	if err != nil {
		t.Fatalf("WriteSignals: %v", err)
	}
	if ack.Seq == 0 || ack.Attempts != 2 {
		t.Errorf("WriteSignals ack %+v, expected a seq and 2 attempts (one per group)", ack)
	}
	if reqs := fc.requests(); len(reqs) != 2 {
		t.Errorf("third write: requests %+v, expected 2 (no further map fetch)", reqs)
	}
}

// TestShardedWriteFollowsNotLeader: a routed part at the map's preferred
// leader, which is not the leader, is answered not_leader; the client
// retries once at the hint and remembers it.
func TestShardedWriteFollowsNotLeader(t *testing.T) {
	fc := newFakeCluster(t, 3, 2, 2)
	c := fc.client(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.RefreshShards(ctx); err != nil {
		t.Fatal(err)
	}
	g2 := fc.m.Groups[1]
	other := g2.Voters()[0]
	if other == g2.Leader {
		other = g2.Voters()[1]
	}
	fc.mu.Lock()
	fc.leader[g2.ID] = other
	fc.mu.Unlock()

	evs := batch("nl", 20)
	fc.resetRequests()
	res, err := c.Write(ctx, evs)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	checkApplied(t, fc, &fc.m, evs, res)
	var toG2 []fakeReq
	for _, r := range fc.requests() {
		if r.group == strconv.FormatUint(uint64(g2.ID), 10) {
			toG2 = append(toG2, r)
		}
	}
	if len(toG2) != 2 || toG2[0].node != g2.Leader || toG2[0].status != misdirected || toG2[1].node != other || toG2[1].status != http.StatusNoContent {
		t.Fatalf("group %d's part: requests %+v, expected 421 at node %d then 204 at the hinted node %d", g2.ID, toG2, g2.Leader, other)
	}
	if res.Attempts != 3 {
		t.Errorf("%d attempts, expected 3 (group 1's part, and group 2's twice)", res.Attempts)
	}

	fc.resetRequests()
	if _, err := c.Write(ctx, batch("nl2", 20)); err != nil {
		t.Fatalf("second write: %v", err)
	}
	for _, r := range fc.requests() {
		if r.group == strconv.FormatUint(uint64(g2.ID), 10) && (r.node != other || r.status != http.StatusNoContent) {
			t.Errorf("second write: group %d's part %+v, expected straight to the remembered leader %d", g2.ID, r, other)
		}
	}

	// A leader that moves again while the hint is followed: the second
	// not_leader fails the part's events, definitely (421 means not
	// applied), and the other group's part still lands.
	fc.mu.Lock()
	fc.leader[g2.ID] = 0
	fc.mu.Unlock()
	evs = batch("nl3", 20)
	res, err = c.Write(ctx, evs)
	var we *WriteError
	if !errors.As(err, &we) || we.Indefinite || IsIndefinite(err) {
		t.Fatalf("write with no leader for group %d: %v, expected a definite *WriteError", g2.ID, err)
	}
	for i, e := range evs {
		inG2 := fc.m.GroupOf(e.Entity) == g2.ID
		if got := res.Events[i]; inG2 != (got.Err != nil) {
			t.Errorf("event %d (group %d): %+v, expected failed exactly when in group %d", i, fc.m.GroupOf(e.Entity), got, g2.ID)
		}
	}
}

// TestShardedWriteEpochMismatchReSplits: group 1's upper half moves to a
// new group, 3, led by another node; a batch routed with the old map is
// answered epoch_mismatch for group 1's part, and the client adopts the
// carried map and sends that part again, split by it.
func TestShardedWriteEpochMismatchReSplits(t *testing.T) {
	fc := newFakeCluster(t, 3, 2, 2)
	c := fc.client(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.RefreshShards(ctx); err != nil {
		t.Fatal(err)
	}
	old := fc.m
	g1 := old.Groups[0]
	split, g3, err := old.Split(g1.ID, (g1.Start+g1.End)/2)
	if err != nil {
		t.Fatal(err)
	}
	grp3, _ := split.Group(g3)
	newLeader := grp3.Voters()[0]
	if newLeader == grp3.Leader {
		newLeader = grp3.Voters()[1]
	}
	moved, err := split.SetLeader(g3, newLeader)
	if err != nil {
		t.Fatal(err)
	}
	fc.setMap(moved)

	evs := batch("em", 40)
	var inG3 int
	for _, e := range evs {
		if moved.GroupOf(e.Entity) == g3 {
			inG3++
		}
	}
	if inG3 == 0 {
		t.Fatal("no event of the batch falls in the moved range; pick other entities")
	}
	fc.resetRequests()
	res, err := c.Write(ctx, evs)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	checkApplied(t, fc, &moved, evs, res)
	if got := c.ShardMap(); got.Epoch != moved.Epoch {
		t.Errorf("cached map at epoch %d, expected the carried map's %d", got.Epoch, moved.Epoch)
	}
	var mismatches, toG3 int
	for _, r := range fc.requests() {
		if r.status == misdirected {
			mismatches++
		}
		if r.group == strconv.FormatUint(uint64(g3), 10) {
			toG3++
			if r.node != newLeader || r.epoch != strconv.FormatUint(moved.Epoch, 10) {
				t.Errorf("group %d's part %+v, expected at node %d with epoch %d", g3, r, newLeader, moved.Epoch)
			}
		}
	}
	if mismatches != 1 || toG3 != 1 {
		t.Errorf("requests %+v: %d 421s and %d parts for group %d, expected 1 and 1", fc.requests(), mismatches, toG3, g3)
	}
}

// TestShardedWritePartialFailure: one group refuses writes (503) or
// times out (504); its events are reported failed — definitely, or with
// an unknown outcome — while the other group's land, on the routed path
// and on the unrouted one (the node's 207 body).
func TestShardedWritePartialFailure(t *testing.T) {
	for _, tc := range []struct {
		routed bool
		status int
	}{{false, http.StatusServiceUnavailable}, {true, http.StatusServiceUnavailable}, {false, http.StatusGatewayTimeout}, {true, http.StatusGatewayTimeout}} {
		routed, status := tc.routed, tc.status
		indefinite := status == http.StatusGatewayTimeout
		is := IsUnavailable
		if indefinite {
			is = IsTimeout
		}
		t.Run(fmt.Sprintf("routed=%v,status=%d", routed, status), func(t *testing.T) {
			fc := newFakeCluster(t, 3, 2, 2)
			c := fc.client(2)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if routed {
				if _, err := c.RefreshShards(ctx); err != nil {
					t.Fatal(err)
				}
			}
			bad := fc.m.Groups[1].ID
			fc.mu.Lock()
			fc.failWith[bad] = status
			fc.mu.Unlock()

			evs := batch("pf", 20)
			res, err := c.Write(ctx, evs)
			var we *WriteError
			if !errors.As(err, &we) {
				t.Fatalf("write: %v, expected a *WriteError", err)
			}
			if !is(err) || IsIndefinite(err) != indefinite || we.Indefinite != indefinite {
				t.Errorf("write error %v: status %d %v, indefinite %v; expected status %d and indefinite %v", err, status, is(err), IsIndefinite(err), status, indefinite)
			}
			failed := 0
			for i, e := range evs {
				got := res.Events[i]
				if fc.m.GroupOf(e.Entity) == bad {
					failed++
					if !is(got.Err) || IsIndefinite(got.Err) != indefinite || got.Group != uint64(bad) {
						t.Errorf("event %d in group %d: %+v, expected a %d failure from that group, indefinite %v", i, bad, got, status, indefinite)
					}
					if in := fc.appliedIn(e.ID); in != 0 {
						t.Errorf("event %d applied in group %d, expected not applied", i, in)
					}
					continue
				}
				if got.Err != nil || fc.appliedIn(e.ID) != fc.m.GroupOf(e.Entity) {
					t.Errorf("event %d: %+v, expected applied by group %d", i, got, fc.m.GroupOf(e.Entity))
				}
			}
			if we.Failed != failed || we.Total != len(evs) {
				t.Errorf("WriteError says %d of %d failed, expected %d of %d", we.Failed, we.Total, failed, len(evs))
			}
			if len(res.Groups) != 1 || res.Groups[0].Group == uint64(bad) {
				t.Errorf("group acks %+v, expected only the healthy group's", res.Groups)
			}
			if _, err := c.WriteSignals(ctx, batch("pf2", 20)); !errors.As(err, &we) {
				t.Errorf("WriteSignals: %v, expected a *WriteError for a partly failed batch", err)
			}
		})
	}
}

// countingServer is a single-group node: every write is 204 with the
// write headers and no map epoch. previous makes it a release before the
// shard map (404 on /v1/shards); otherwise it answers /v1/shards with
// its one-group map.
type countingServer struct {
	previous bool
	mu       sync.Mutex
	seq      uint64
	reqs     []string
}

func (s *countingServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	s.reqs = append(s.reqs, r.Method+" "+r.URL.Path+" "+r.Header.Get(headerShard))
	s.seq++
	seq := s.seq
	s.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/signals":
		w.Header().Set("X-Tidal-Seq", strconv.FormatUint(seq, 10))
		w.Header().Set("X-Tidal-Term", "3")
		w.Header().Set("X-Tidal-Node", "1")
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/entities/"):
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"entity":%s,"applied_index":%d}`, strings.TrimPrefix(r.URL.Path, "/v1/entities/"), seq)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/shards" && !s.previous:
		m, _ := shard.Bootstrap(1, 1, []shard.NodeID{1})
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"map": &m, "nodes": []map[string]any{{"id": 1, "client_addr": r.Host}}})
	default:
		writeError(w, http.StatusNotFound, CodeNotFound, "", "404 page not found")
	}
}

func (s *countingServer) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.reqs)
}

// TestSingleGroupUnchanged: against a single group — of this release or
// the previous one — every call is exactly today's one request: no map
// fetch, no route headers, the Ack from the headers.
func TestSingleGroupUnchanged(t *testing.T) {
	for _, previous := range []bool{false, true} {
		t.Run(fmt.Sprintf("previous=%v", previous), func(t *testing.T) {
			s := &countingServer{previous: previous}
			_, c := serve(t, s)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var want []string
			for i := range 5 {
				ack, err := c.WriteSignals(ctx, batch(fmt.Sprintf("s%d", i), 10))
				if err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
				if ack != (Ack{Seq: uint64(2*i + 1), Term: 3, Node: 1, Attempts: 1}) {
					t.Errorf("write %d: ack %+v, expected seq %d term 3 node 1 in one attempt", i, ack, 2*i+1)
				}
				if _, err := c.Entity(ctx, 42); err != nil {
					t.Fatalf("read %d: %v", i, err)
				}
				want = append(want, "POST /v1/signals ", "GET /v1/entities/42 ")
			}
			res, err := c.Write(ctx, batch("w", 3))
			if err != nil || len(res.Groups) != 1 || res.Groups[0].Group != 1 || res.Attempts != 1 {
				t.Errorf("Write: %+v, %v; expected all three events applied by group 1 in one attempt", res, err)
			}
			want = append(want, "POST /v1/signals ")
			if got := s.requests(); !slices.Equal(got, want) {
				t.Errorf("requests:\n%q\nexpected exactly today's:\n%q", got, want)
			}
			if c.ShardMap() != nil {
				t.Errorf("client cached a map %+v from a single group that announced none", c.ShardMap())
			}
		})
	}
}

// TestPreviousReleaseAnswers404: asked for the map, a server of the
// previous release answers 404; the client takes that as a single group
// (no map, no error) and goes on writing to it as today.
func TestPreviousReleaseAnswers404(t *testing.T) {
	s := &countingServer{previous: true}
	_, c := serve(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := c.RefreshShards(ctx)
	if m != nil || err != nil {
		t.Fatalf("RefreshShards on a previous release: %+v, %v; expected no map and no error", m, err)
	}
	if _, err := c.WriteSignals(ctx, batch("p", 4)); err != nil {
		t.Fatalf("write: %v", err)
	}
	want := []string{"GET /v1/shards ", "POST /v1/signals "}
	if got := s.requests(); !slices.Equal(got, want) {
		t.Errorf("requests %q, expected %q (one 404, then today's write, no second fetch)", got, want)
	}

	// The same server of this release answers with its one-group map,
	// which routes nothing either.
	s2 := &countingServer{}
	_, c2 := serve(t, s2)
	if m, err := c2.RefreshShards(ctx); err != nil || m == nil || len(m.Groups) != 1 {
		t.Fatalf("RefreshShards on a single group: %+v, %v; expected its one-group map", m, err)
	}
	if _, err := c2.WriteSignals(ctx, batch("p", 4)); err != nil {
		t.Fatalf("write: %v", err)
	}
	if got := s2.requests(); !slices.Equal(got, want) {
		t.Errorf("requests %q, expected %q (a one-group map routes nothing)", got, want)
	}
}

// TestShardedEntityRead: a linearizable read goes to the owning group's
// leader, following a not_leader hint; a local read to one of the
// group's replicas.
func TestShardedEntityRead(t *testing.T) {
	fc := newFakeCluster(t, 3, 2, 2)
	c := fc.client(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A read-only client learns of the map from a read's answer.
	if _, err := c.Entity(ctx, 99); err != nil {
		t.Fatal(err)
	}
	if reqs := fc.requests(); len(reqs) != 1 || reqs[0].group != "" {
		t.Fatalf("first read: requests %+v, expected one unrouted read", reqs)
	}
	fc.resetRequests()
	if _, err := c.Entity(ctx, 99); err != nil {
		t.Fatal(err)
	}
	if reqs := fc.requests(); len(reqs) != 2 || reqs[0].path != "/v1/shards" || reqs[1].group == "" {
		t.Fatalf("second read: requests %+v, expected the map fetched, then a routed read", reqs)
	}
	for _, entity := range []uint64{1, 2, 3, 4, 5, 6, 7, 8} {
		g := fc.m.GroupOf(entity)
		grp, _ := fc.m.Group(g)
		fc.resetRequests()
		e, err := c.Entity(ctx, entity)
		if err != nil || e.Entity != entity || shard.NodeID(e.AppliedIndex) != grp.Leader {
			t.Errorf("linearizable read of %d: %+v, %v; expected an answer from group %d's leader %d", entity, e, err, g, grp.Leader)
		}
		e, err = c.Entity(ctx, entity, Local())
		if err != nil {
			t.Fatalf("local read of %d: %v", entity, err)
		}
		if _, ok := grp.Replica(shard.NodeID(e.AppliedIndex)); !ok {
			t.Errorf("local read of %d answered by node %d, expected a replica of group %d (%+v)", entity, e.AppliedIndex, g, grp.Replicas)
		}
		if n := len(fc.requests()); n != 2 {
			t.Errorf("reads of %d: %d requests, expected 2", entity, n)
		}
	}

	g := fc.m.Groups[0]
	other := g.Voters()[0]
	if other == g.Leader {
		other = g.Voters()[1]
	}
	fc.mu.Lock()
	fc.leader[g.ID] = other
	fc.mu.Unlock()
	var entity uint64 = 1
	for fc.m.GroupOf(entity) != g.ID {
		entity++
	}
	e, err := c.Entity(ctx, entity)
	if err != nil || shard.NodeID(e.AppliedIndex) != other {
		t.Errorf("read after a leader change: %+v, %v; expected an answer from the new leader %d", e, err, other)
	}
}

// TestShardedWriteLearnsNewNodeAddress: a map carried by an
// epoch_mismatch names a node added since the client's fetch, with no
// address; the part for it goes unrouted meanwhile, and the next call
// fetches the map's addresses and routes to the new node directly.
func TestShardedWriteLearnsNewNodeAddress(t *testing.T) {
	t.Run("Regression: new node's address fetched", func(t *testing.T) {
		fc := newFakeCluster(t, 4, 2, 2)
		start, err := shard.Bootstrap(2, 2, []shard.NodeID{1, 2, 3})
		if err != nil {
			t.Fatal(err)
		}
		fc.setMap(start)
		c := fc.client(1)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.RefreshShards(ctx); err != nil {
			t.Fatal(err)
		}
		// Group 2 moves to node 4, which then leads it.
		g2 := start.Groups[1]
		m := start
		step := func(next shard.Map, err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			m = next
		}
		step(m.AddNode(4))
		step(m.AddLearner(g2.ID, 4))
		step(m.Promote(g2.ID, 4))
		step(m.SetLeader(g2.ID, 4))
		for _, n := range g2.Voters() {
			step(m.RemoveReplica(g2.ID, n))
			break
		}
		// Group 1's range moves too, so its part meets an epoch_mismatch
		// that carries the map naming node 4.
		next, _, err := m.Split(start.Groups[0].ID, (start.Groups[0].Start+start.Groups[0].End)/2)
		step(next, err)
		fc.setMap(m)

		evs := batch("nn", 40)
		res, err := c.Write(ctx, evs)
		if err != nil {
			t.Fatalf("first write after the move: %v", err)
		}
		checkApplied(t, fc, &m, evs, res)

		fc.resetRequests()
		evs = batch("nn2", 40)
		res, err = c.Write(ctx, evs)
		if err != nil {
			t.Fatalf("second write: %v", err)
		}
		checkApplied(t, fc, &m, evs, res)
		toNode4 := false
		for _, r := range fc.requests() {
			if r.group == strconv.FormatUint(uint64(g2.ID), 10) && r.node == 4 && r.status == http.StatusNoContent {
				toNode4 = true
			}
		}
		if !toNode4 {
			t.Errorf("second write: requests %+v, expected group %d's part routed straight to its new leader, node 4", fc.requests(), g2.ID)
		}
	})
}

// TestShardedWritesConcurrentWithMapChange: writers share one client (one
// cache) while a group splits under them; every event lands, in exactly
// one group (appliedIn fails the test on a second). Run with -race.
func TestShardedWritesConcurrentWithMapChange(t *testing.T) {
	fc := newFakeCluster(t, 3, 2, 2)
	c := fc.client(3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	final, _, err := fc.m.Split(fc.m.Groups[1].ID, (fc.m.Groups[1].Start+fc.m.Groups[1].End)/2)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var all [][]Event
	for w := range 8 {
		evs := batch(fmt.Sprintf("cw%d", w), 30)
		for i := range evs {
			evs[i].Entity += uint64(w * 1000)
		}
		all = append(all, evs)
	}
	for w, evs := range all {
		wg.Go(func() {
			for i := 0; i < len(evs); i += 10 {
				if w == 4 && i == 10 {
					fc.setMap(final)
				}
				if _, err := c.Write(ctx, evs[i:i+10]); err != nil {
					// A part caught between two maps may fail; the batch is
					// retried with the same ids, as a caller would.
					if _, err := c.Write(ctx, evs[i:i+10]); err != nil {
						t.Errorf("writer %d batch %d: %v", w, i/10, err)
					}
				}
			}
		})
	}
	wg.Wait()
	for _, evs := range all {
		for _, e := range evs {
			if in := fc.appliedIn(e.ID); in == 0 {
				t.Errorf("event %s not applied", e.ID)
			}
		}
	}
}

// TestShardedWriteNodeBehindClient: a node whose map is older than the
// client's answers epoch_mismatch with its older map; the client keeps
// its own map and sends the part once more, which the node — caught up
// meanwhile — serves.
func TestShardedWriteNodeBehindClient(t *testing.T) {
	fc := newFakeCluster(t, 3, 2, 2)
	old := fc.m
	g1 := old.Groups[0]
	split, g3, err := old.Split(g1.ID, (g1.Start+g1.End)/2)
	if err != nil {
		t.Fatal(err)
	}
	fc.setMap(split)
	c := fc.client(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.RefreshShards(ctx); err != nil {
		t.Fatal(err)
	}
	grp3, _ := split.Group(g3)
	fc.mu.Lock()
	fc.behind = map[shard.NodeID]shard.Map{grp3.Leader: old}
	fc.mu.Unlock()

	evs := batch("bh", 40)
	fc.resetRequests()
	res, err := c.Write(ctx, evs)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	checkApplied(t, fc, &split, evs, res)
	if got := c.ShardMap(); got.Epoch != split.Epoch {
		t.Errorf("cached map at epoch %d, expected the client's own %d kept", got.Epoch, split.Epoch)
	}
	var toG3 []fakeReq
	for _, r := range fc.requests() {
		if r.group == strconv.FormatUint(uint64(g3), 10) {
			toG3 = append(toG3, r)
		}
	}
	if len(toG3) != 2 || toG3[0].status != misdirected || toG3[1].status != http.StatusNoContent || toG3[1].node != grp3.Leader {
		t.Errorf("group %d's part: %+v, expected a 421 from the node behind, then 204 from the same node", g3, toG3)
	}
}
