package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/tidaldb/tidal/tidal-server/shard"
)

// Routing with a shard map (docs/ARCHITECTURE.md "Shards", "The client's
// shard-map cache").
//
// The client starts with no map and sends every request to its own node,
// exactly as against a single group: any node of a sharded cluster
// accepts any batch, splits it and forwards each part one hop. A node
// whose map has more than one group says so on every write and
// entity-read answer (X-Tidal-Map-Epoch); the client then fetches the map once (GET
// /v1/shards) and from the next call on sends each group's part straight
// to the group's leader, naming the group and the epoch it routed with.
// A single-group cluster never sends the header, so the client never
// asks it for a map: zero requests beyond today's.
//
// A routed part is answered by its group (204 and the write headers) or
// by a 421 that says how to fix the route:
//   - not_leader: the node is not the group's leader; the answer's leader
//     hint is remembered and the part is retried once at the hinted node.
//   - epoch_mismatch: the group no longer owns every entity of the part;
//     the carried map replaces the cache if it is newer, and the part is
//     split again by it and resent once.
//
// Every resend carries the same event ids, so the group's id memory makes
// it safe whatever became of the first copy. A part that still cannot be
// placed fails its events, each reported in WriteResult.

// Headers of the sharded contract. The request carries X-Tidal-Shard and
// X-Tidal-Map-Epoch when it is routed (the group and the map epoch it was
// routed with); the answer of a cluster with more than one group carries
// them too (the group that applied it, the node's map epoch).
const (
	headerShard    = "X-Tidal-Shard"
	headerMapEpoch = "X-Tidal-Map-Epoch"
	// headerTimeout is the caller's remaining deadline in milliseconds:
	// the node bounds the hop it forwards a part over by it.
	headerTimeout = "X-Tidal-Timeout-Ms"

	misdirected = shard.StatusMisdirected
	// maxReroutes is how many times one part is split again after an
	// epoch_mismatch within one call: one, because the carried map is the
	// answering node's newest, and a second miss means the map is moving
	// under the call, which the caller's retry with the same ids handles.
	maxReroutes = 1
)

// routes is the client's shard-map cache, TiKV's region cache and
// CockroachDB's range cache in one: the newest map the client has seen,
// the client address of every node, and a leader hint per group learnt
// from not_leader answers. It only ever moves to a higher epoch.
type routes struct {
	fetchMu sync.Mutex // one GET /v1/shards at a time

	mu    sync.Mutex
	m     *shard.Map // nil: never fetched
	addrs map[shard.NodeID]string
	// hints are leader hints for m's groups; cleared when m is replaced.
	hints map[shard.GroupID]shard.NodeID
	// announced is the highest map epoch a node has told the client of
	// (X-Tidal-Map-Epoch, an epoch_mismatch); fetched the highest it has
	// fetched for. A fetch is due while announced > max(epoch, fetched).
	announced, fetched uint64
	// missing: a node of m has no known client address (m came with an
	// epoch_mismatch, which carries no addresses); a fetch is due.
	missing bool
}

func (rt *routes) epochLocked() uint64 {
	if rt.m == nil {
		return 0
	}
	return rt.m.Epoch
}

// announce records that a node knows a map at epoch e.
func (rt *routes) announce(e uint64) {
	rt.mu.Lock()
	rt.announced = max(rt.announced, e)
	rt.mu.Unlock()
}

// stale reports whether a node announced a map newer than the cache and
// the client has not yet asked for it.
func (rt *routes) stale() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	e := rt.epochLocked()
	return rt.announced > max(e, rt.fetched) || (rt.missing && rt.fetched < e)
}

// multi returns the cached map when it has more than one group: only
// then does a request need routing.
func (rt *routes) multi() *shard.Map {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.m == nil || len(rt.m.Groups) < 2 {
		return nil
	}
	return rt.m
}

func (rt *routes) current() *shard.Map {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.m
}

// adopt replaces the cache with m if m is newer, merging addrs into the
// address book. A node of the cached map without a known address (a map
// carried by an epoch_mismatch names a node added since the last fetch)
// makes the cache stale, so the next call fetches the addresses, once per
// epoch; until then, parts for that node go unrouted. It reports whether
// m was adopted.
func (rt *routes) adopt(m *shard.Map, addrs map[shard.NodeID]string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.addrs == nil {
		rt.addrs = make(map[shard.NodeID]string)
	}
	for n, a := range addrs {
		rt.addrs[n] = a
	}
	adopted := m.Epoch > rt.epochLocked()
	if adopted {
		rt.m = m
		rt.hints = nil
	}
	rt.missing = false
	if rt.m != nil {
		for _, n := range rt.m.Nodes {
			if rt.addrs[n] == "" {
				rt.missing = true
				break
			}
		}
	}
	return adopted
}

// leader returns the node to send group g's requests to under map m: the
// hint learnt for it, else the map's preferred leader.
func (rt *routes) leader(m *shard.Map, g shard.GroupID) shard.NodeID {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.m != nil && rt.m.Epoch == m.Epoch {
		if n, ok := rt.hints[g]; ok {
			return n
		}
	}
	grp, _ := m.Group(g)
	return grp.Leader
}

// hint records n as group g's leader for map epoch epoch; a hint for an
// older map than the cache's is dropped.
func (rt *routes) hint(epoch uint64, g shard.GroupID, n shard.NodeID) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.m == nil || rt.m.Epoch != epoch {
		return
	}
	if rt.hints == nil {
		rt.hints = make(map[shard.GroupID]shard.NodeID)
	}
	rt.hints[g] = n
}

func (rt *routes) addr(n shard.NodeID) (string, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	a, ok := rt.addrs[n]
	return a, ok && a != ""
}

// shardsAnswer is GET /v1/shards: the node's map (shard's JSON form) and
// the client address of each node, which the map names only by id.
type shardsAnswer struct {
	Map   *shard.Map `json:"map"`
	Nodes []struct {
		ID         shard.NodeID `json:"id"`
		ClientAddr string       `json:"client_addr"`
	} `json:"nodes"`
}

// RefreshShards fetches the shard map from the client's node now and
// caches it if it is newer than the cached one. It returns the cached map
// afterwards; nil (and no error) when the node predates the shard map
// (404): a single group, which the client then addresses as it always
// has. Routing does not need this call — the client fetches the map
// itself once a node announces more than one group — but a tool that
// wants to know the layout up front (a load generator spreading its
// connections) may make it.
func (c *Client) RefreshShards(ctx context.Context) (*shard.Map, error) {
	c.routes.fetchMu.Lock()
	defer c.routes.fetchMu.Unlock()
	return c.fetchShards(ctx)
}

// ShardMap returns the cached shard map, nil when the client has none
// (it has never been told of one, or the cluster is a single group of a
// release before the shard map).
func (c *Client) ShardMap() *shard.Map { return c.routes.current() }

// fetchShards runs GET /v1/shards; the caller holds fetchMu.
func (c *Client) fetchShards(ctx context.Context) (*shard.Map, error) {
	c.routes.mu.Lock()
	want := max(c.routes.announced, c.routes.epochLocked())
	c.routes.mu.Unlock()
	var ans shardsAnswer
	_, err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/shards"}, func(resp *http.Response) error {
		if err := decodeJSON(resp, &ans); err != nil {
			return err
		}
		if ans.Map == nil {
			return errors.New(`shard map answer: no "map" member`)
		}
		return nil
	})
	c.routes.mu.Lock()
	c.routes.fetched = max(c.routes.fetched, want)
	c.routes.mu.Unlock()
	if err != nil {
		if ae := apiError(err); ae != nil && ae.Status == http.StatusNotFound {
			// A release before the shard map: a single group. Nothing
			// is cached, and nothing asks again unless a node announces
			// a map.
			return c.routes.current(), nil
		}
		return nil, err
	}
	addrs := make(map[shard.NodeID]string, len(ans.Nodes))
	for _, n := range ans.Nodes {
		if n.ClientAddr != "" {
			addrs[n.ID] = c.nodeBase(n.ClientAddr)
		}
	}
	c.routes.adopt(ans.Map, addrs)
	return c.routes.current(), nil
}

// nodeBase turns a node's client address into a base URL with the
// client's scheme, as New does for the client's own node.
func (c *Client) nodeBase(addr string) string {
	addr = strings.TrimRight(addr, "/")
	if strings.Contains(addr, "://") {
		return addr
	}
	if c.tls != nil {
		return "https://" + addr
	}
	return "http://" + addr
}

// refreshIfStale fetches the map when a node announced a newer one than
// the cache holds. A failed fetch is not the call's failure: the call
// goes unrouted, which any node accepts.
func (c *Client) refreshIfStale(ctx context.Context) {
	if !c.routes.stale() {
		return
	}
	c.routes.fetchMu.Lock()
	defer c.routes.fetchMu.Unlock()
	if !c.routes.stale() {
		return // another call fetched it meanwhile
	}
	_, _ = c.fetchShards(ctx)
}

// WriteResult is the outcome of a batch write, per event and per group.
type WriteResult struct {
	// Events has one entry per event of the batch, in batch order.
	Events []EventResult
	// Groups has one entry per group that applied a part of the batch,
	// by group id.
	Groups []GroupAck
	// Attempts is how many requests the write took in all.
	Attempts int
}

// GroupAck is where one group's part of a batch landed.
type GroupAck struct {
	Group      uint64 // the group (1 for a single-group cluster)
	Seq        uint64 // raft log index of the part's entry in the group
	Term       uint64
	Node       uint64 // the node that answered
	Duplicates int    // events of the part that were retries of applied ones
	Events     []int  // the part's positions in the batch, ascending
}

// EventResult is one event's outcome: applied (Err nil) with where its
// group's part landed, or failed with why.
type EventResult struct {
	Group uint64 // the group that took or refused it; 0 when not known
	Seq   uint64
	Term  uint64
	Node  uint64
	// Err is nil when the event is applied; otherwise a *RequestError
	// (IsIndefinite says whether it may have been applied all the same).
	Err error
}

// WriteError is a batch write in which some events failed. It unwraps to
// the first failed event's error, so IsUnavailable, IsTimeout and the
// like answer for it.
type WriteError struct {
	Failed, Total int
	// First is the batch position of the first failed event.
	First int
	// Indefinite: some failed event may have been applied.
	Indefinite bool
	Err        error
}

func (e *WriteError) Error() string {
	outcome := "not applied"
	if e.Indefinite {
		outcome = "some may have been applied"
	}
	return fmt.Sprintf("tidal: %d of %d events of the batch failed (%s); the first, event %d: %v", e.Failed, e.Total, outcome, e.First, e.Err)
}

func (e *WriteError) Unwrap() error { return e.Err }

// collector gathers the outcome of a batch's parts, which run
// concurrently; each position is written by the part that owns it.
type collector struct {
	mu       sync.Mutex
	res      WriteResult
	attempts int
}

func newCollector(n int) *collector {
	return &collector{res: WriteResult{Events: make([]EventResult, n)}}
}

func (col *collector) ok(idx []int, ga GroupAck) {
	col.mu.Lock()
	defer col.mu.Unlock()
	ga.Events = slices.Clone(idx)
	slices.Sort(ga.Events)
	col.res.Groups = append(col.res.Groups, ga)
	for _, i := range idx {
		col.res.Events[i] = EventResult{Group: ga.Group, Seq: ga.Seq, Term: ga.Term, Node: ga.Node}
	}
}

func (col *collector) fail(idx []int, g uint64, err error) {
	col.mu.Lock()
	defer col.mu.Unlock()
	for _, i := range idx {
		col.res.Events[i] = EventResult{Group: g, Err: err}
	}
}

func (col *collector) count(n int) {
	col.mu.Lock()
	col.attempts += n
	col.mu.Unlock()
}

// result returns the merged outcome and, if any event failed, a
// *WriteError.
func (col *collector) result() (*WriteResult, error) {
	col.mu.Lock()
	defer col.mu.Unlock()
	res := col.res
	res.Attempts = col.attempts
	slices.SortFunc(res.Groups, func(a, b GroupAck) int {
		if c := cmp.Compare(a.Group, b.Group); c != 0 {
			return c
		}
		return cmp.Compare(a.Events[0], b.Events[0])
	})
	var we *WriteError
	for i, ev := range res.Events {
		if ev.Err == nil {
			continue
		}
		if we == nil {
			we = &WriteError{First: i, Err: ev.Err, Total: len(res.Events)}
		}
		we.Failed++
		we.Indefinite = we.Indefinite || IsIndefinite(ev.Err)
	}
	if we != nil {
		return &res, we
	}
	return &res, nil
}

// ack folds a result into the single Ack WriteSignals returns: the part
// of the group holding the batch's first event, with the duplicates of
// every part.
func (r *WriteResult) ack() Ack {
	ack := Ack{Attempts: r.Attempts}
	if len(r.Events) > 0 {
		first := r.Events[0]
		ack.Seq, ack.Term, ack.Node = first.Seq, first.Term, first.Node
	}
	for _, g := range r.Groups {
		ack.Duplicates += g.Duplicates
	}
	return ack
}

// Write writes a batch of events and reports each event's outcome. Within
// one group a part is applied all or none; a batch spanning groups is one
// part per group, and parts fare independently. err is nil when every
// event was applied, else a *WriteError (the result says which events
// failed and why). Retrying the whole batch is always safe: events that
// landed carry the same ids and are counted as duplicates.
func (c *Client) Write(ctx context.Context, events []Event) (*WriteResult, error) {
	col := newCollector(len(events))
	idx := identity(len(events))
	c.refreshIfStale(ctx)
	if m := c.routes.multi(); m != nil && len(events) > 0 {
		c.route(ctx, m, events, idx, col, maxReroutes)
	} else {
		c.sendUnrouted(ctx, events, idx, col)
	}
	return col.result()
}

// route splits the events at positions idx by m and sends each part to
// its group's leader, concurrently.
func (c *Client) route(ctx context.Context, m *shard.Map, events []Event, idx []int, col *collector, reroutes int) {
	ents := make([]uint64, len(idx))
	for i, p := range idx {
		ents[i] = events[p].Entity
	}
	parts := m.SplitBatch(ents)
	if len(parts) == 1 {
		c.sendPart(ctx, m, parts[0].Group, events, idx, col, reroutes)
		return
	}
	var wg sync.WaitGroup
	for _, p := range parts {
		pidx := make([]int, len(p.Indexes))
		for i, j := range p.Indexes {
			pidx[i] = idx[j]
		}
		wg.Go(func() { c.sendPart(ctx, m, p.Group, events, pidx, col, reroutes) })
	}
	wg.Wait()
}

// sendPart sends group g's part (positions idx) to g's leader under m,
// following one not_leader hint and, reroutes permitting, one
// epoch_mismatch.
func (c *Client) sendPart(ctx context.Context, m *shard.Map, g shard.GroupID, events []Event, idx []int, col *collector, reroutes int) {
	target := c.routes.leader(m, g)
	for followed := false; ; followed = true {
		base, ok := c.routes.addr(target)
		if !ok {
			// No address for the node: any node accepts any batch.
			c.sendUnrouted(ctx, events, idx, col)
			return
		}
		err := c.sendRouted(ctx, base, m, g, events, idx, col)
		if err == nil {
			return
		}
		var nl *shard.NotLeader
		var em *shard.EpochMismatch
		route := routeOf(err)
		switch {
		case errors.As(route, &nl) && !followed:
			// A node with a newer map than the one routed with: fetch it
			// at the next call.
			c.routes.announce(nl.Epoch)
			next := nextReplica(nl, target)
			if next == 0 {
				break
			}
			c.routes.hint(m.Epoch, g, next)
			target = next
			continue
		case errors.As(route, &em) && reroutes > 0:
			cur := em.Current
			c.routes.adopt(&cur, nil)
			nm := c.routes.current()
			if nm == nil || nm.Epoch < m.Epoch {
				nm = m
			}
			// The same map when the node was behind the client: the
			// node fetches the newer one meanwhile; try once more.
			c.route(ctx, nm, events, idx, col, reroutes-1)
			return
		}
		col.fail(idx, uint64(g), err)
		return
	}
}

// nextReplica is where a not_leader answer from node from sends the
// request: its leader hint, else (no hint, or a hint naming from itself)
// the first other voter it lists; 0 when there is none.
func nextReplica(nl *shard.NotLeader, from shard.NodeID) shard.NodeID {
	if nl.Leader != 0 && nl.Leader != from {
		return nl.Leader
	}
	for _, r := range nl.Replicas {
		if r.Node != from && r.Role == shard.Voter {
			return r.Node
		}
	}
	return 0
}

// routeOf returns the routing answer err carries, nil if none.
func routeOf(err error) error {
	if ae := apiError(err); ae != nil {
		return ae.route
	}
	return nil
}

// signalsBody encodes the events at positions idx (nil: all) as a write
// body.
func signalsBody(events []Event, idx []int) (*request, error) {
	part := events
	if idx != nil && len(idx) != len(events) {
		part = make([]Event, len(idx))
		for i, p := range idx {
			part[i] = events[p]
		}
	}
	return jsonRequest(http.MethodPost, "/v1/signals", struct {
		Events []Event `json:"events"`
	}{part})
}

// sendRouted sends one part to base, routed to group g with m's epoch,
// and records its success; the error is the caller's to interpret.
func (c *Client) sendRouted(ctx context.Context, base string, m *shard.Map, g shard.GroupID, events []Event, idx []int, col *collector) error {
	r, err := signalsBody(events, idx)
	if err != nil {
		return err
	}
	r.base = base
	r.header = http.Header{
		headerShard:    {strconv.FormatUint(uint64(g), 10)},
		headerMapEpoch: {strconv.FormatUint(m.Epoch, 10)},
	}
	n, err := c.do(ctx, r, func(resp *http.Response) error { return c.takeAnswer(resp, idx, col) })
	col.count(n)
	return err
}

// sendUnrouted sends the events at idx to the client's own node, which
// splits them itself if the cluster is sharded; failures are recorded
// for every event.
func (c *Client) sendUnrouted(ctx context.Context, events []Event, idx []int, col *collector) {
	r, err := signalsBody(events, idx)
	if err != nil {
		col.fail(idx, 0, err)
		return
	}
	n, err := c.do(ctx, r, func(resp *http.Response) error { return c.takeAnswer(resp, idx, col) })
	col.count(n)
	if err != nil {
		col.fail(idx, 0, err)
	}
}

// takeAnswer records a 2xx write answer for the events at idx: a 204
// (one group applied them all; its headers say where) or a 200/207 with
// the per-group, per-event body of a batch the node split.
func (c *Client) takeAnswer(resp *http.Response, idx []int, col *collector) error {
	c.announced(resp)
	if !isSplitAnswer(resp) {
		ack, err := parseAck(resp.Header)
		if err != nil {
			return err
		}
		g := uint64(1) // a single-group cluster's group
		if v := resp.Header.Get(headerShard); v != "" {
			if g, err = strconv.ParseUint(v, 10, 64); err != nil {
				return fmt.Errorf("header %s: expected an unsigned integer, found %q", headerShard, v)
			}
		}
		col.ok(idx, GroupAck{Group: g, Seq: ack.Seq, Term: ack.Term, Node: ack.Node, Duplicates: ack.Duplicates})
		return nil
	}
	var ans batchAnswer
	if err := decodeJSON(resp, &ans); err != nil {
		return err
	}
	c.routes.announce(ans.Epoch)
	return ans.record(resp.Request.Method+" "+resp.Request.URL.Path, idx, col)
}

// announced notes the map epoch an answer announces, if any.
func (c *Client) announced(resp *http.Response) {
	if e := resp.Header.Get(headerMapEpoch); e != "" {
		if epoch, err := strconv.ParseUint(e, 10, 64); err == nil {
			c.routes.announce(epoch)
		}
	}
}

// isSplitAnswer reports whether a 2xx write answer is the per-group body
// of a batch the node split (200 or 207 with JSON), not a 204.
func isSplitAnswer(resp *http.Response) bool {
	return resp.StatusCode != http.StatusNoContent && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json")
}

// identity returns the positions 0..n-1.
func identity(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// batchAnswer is the 200/207 body of a write the node split over groups
// (docs/ARCHITECTURE.md "API details"): where each group's part landed,
// and why each failed event failed. Positions are in the request's batch.
type batchAnswer struct {
	Epoch  uint64 `json:"epoch"`
	Groups []struct {
		Group      uint64 `json:"group"`
		Seq        uint64 `json:"seq"`
		Term       uint64 `json:"term"`
		Node       uint64 `json:"node"`
		Duplicates int    `json:"duplicates"`
		Events     []int  `json:"events"`
	} `json:"groups"`
	Failed []struct {
		Position   int    `json:"position"`
		ID         string `json:"id"`
		Group      uint64 `json:"group"`
		Status     int    `json:"status"`
		Indefinite bool   `json:"indefinite"`
		Error      struct {
			Code    string `json:"code"`
			Message string `json:"message"`
			Field   string `json:"field"`
		} `json:"error"`
	} `json:"failed"`
}

// record maps the answer back through idx. Every position must be
// reported exactly once; one that is not is an error (the write was
// answered 2xx, so its events' outcome is unknown, not failed).
func (a *batchAnswer) record(op string, idx []int, col *collector) error {
	seen := make([]bool, len(idx))
	take := func(p int) error {
		if p < 0 || p >= len(idx) {
			return fmt.Errorf("batch answer: position %d, expected 0..%d", p, len(idx)-1)
		}
		if seen[p] {
			return fmt.Errorf("batch answer: position %d reported twice", p)
		}
		seen[p] = true
		return nil
	}
	for _, g := range a.Groups {
		pos := make([]int, len(g.Events))
		for i, p := range g.Events {
			if err := take(p); err != nil {
				return err
			}
			pos[i] = idx[p]
		}
		col.ok(pos, GroupAck{Group: g.Group, Seq: g.Seq, Term: g.Term, Node: g.Node, Duplicates: g.Duplicates})
	}
	for _, f := range a.Failed {
		if err := take(f.Position); err != nil {
			return err
		}
		ae := &APIError{Op: op, Status: f.Status, Code: f.Error.Code, Message: f.Error.Message, Field: f.Error.Field}
		col.fail([]int{idx[f.Position]}, f.Group, &RequestError{Op: op, Attempts: 1, Indefinite: f.Indefinite, Err: ae})
	}
	if i := slices.Index(seen, false); i >= 0 {
		return fmt.Errorf("batch answer: position %d not reported, expected every event in groups or failed", i)
	}
	return nil
}

// routedEntity reads an entity from its group under m: a linearizable
// read at the group's leader, a local one at one of its replicas (spread
// by entity id). One not_leader or epoch_mismatch answer is followed.
func (c *Client) routedEntity(ctx context.Context, m *shard.Map, entity uint64, q url.Values) (*Entity, error) {
	local := q.Get("consistency") == "local"
	var target shard.NodeID // set by a not_leader answer
	var last error
	for try := 0; try < 2; try++ {
		g := m.GroupOf(entity)
		if target == 0 {
			target = c.routes.leader(m, g)
			if local {
				grp, _ := m.Group(g)
				target = grp.Replicas[entity%uint64(len(grp.Replicas))].Node
			}
		}
		r := &request{method: http.MethodGet, path: "/v1/entities/" + strconv.FormatUint(entity, 10), query: q}
		if base, ok := c.routes.addr(target); ok {
			r.base = base
			r.header = http.Header{
				headerShard:    {strconv.FormatUint(uint64(g), 10)},
				headerMapEpoch: {strconv.FormatUint(m.Epoch, 10)},
			}
		}
		var out Entity
		_, err := c.do(ctx, r, func(resp *http.Response) error { return decodeJSON(resp, &out) })
		if err == nil {
			return &out, nil
		}
		last = err
		var nl *shard.NotLeader
		var em *shard.EpochMismatch
		switch route := routeOf(err); {
		case errors.As(route, &nl):
			c.routes.announce(nl.Epoch)
			next := nextReplica(nl, target)
			if next == 0 {
				return nil, err
			}
			c.routes.hint(m.Epoch, g, next)
			target = next
		case errors.As(route, &em):
			cur := em.Current
			c.routes.adopt(&cur, nil)
			if nm := c.routes.current(); nm != nil && nm.Epoch > m.Epoch {
				m = nm
			}
			target = 0
		default:
			return nil, err
		}
	}
	return nil, last
}
