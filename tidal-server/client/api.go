package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
)

// Event is one signal as written: Weight 0 means the server's default (1),
// TS 0 means "stamp it when the write is logged".
type Event struct {
	ID     string  `json:"id"`
	Entity uint64  `json:"entity"`
	Signal string  `json:"signal"`
	Weight float64 `json:"weight,omitempty"`
	TS     int64   `json:"ts,omitempty"`
}

// Ack is a successful write: where it landed and how it got there.
type Ack struct {
	Seq  uint64 // raft log index of the entry (X-Tidal-Seq)
	Term uint64 // its term (X-Tidal-Term)
	Node uint64 // the node that answered (X-Tidal-Node)
	// Duplicates counts events the server recognised as retries of
	// already-applied ones (X-Tidal-Duplicates).
	Duplicates int
	// Attempts is how many requests the call took (also set on failure).
	Attempts int
}

// WriteSignals writes a batch of events; they are applied all or none. A
// retried batch carries the same ids, so events that landed on an earlier
// attempt are counted in Ack.Duplicates rather than applied twice.
//
// Against a cluster with more than one group a batch spanning groups is
// one part per group, and parts fare independently: the Ack describes the
// part holding the batch's first event (Duplicates counts every part), and
// an error is a *WriteError naming how many events failed. Write reports
// each event's outcome. Against a single group this is one request, as
// it always was, and a failure is that request's *RequestError.
func (c *Client) WriteSignals(ctx context.Context, events []Event) (Ack, error) {
	c.refreshIfStale(ctx)
	if c.routes.multi() == nil {
		return c.writeSignalsUnrouted(ctx, events)
	}
	res, err := c.Write(ctx, events)
	return res.ack(), err
}

// writeSignalsUnrouted is WriteSignals without a map: today's one
// request, answered by a 204 whose headers are the Ack — or, from a
// sharded cluster that split the batch, by the per-group body, folded
// into an Ack as Write's result is.
func (c *Client) writeSignalsUnrouted(ctx context.Context, events []Event) (Ack, error) {
	r, err := signalsBody(events, nil)
	if err != nil {
		return Ack{}, err
	}
	var ack Ack
	var split *collector // the node answered a split batch
	n, err := c.do(ctx, r, func(resp *http.Response) error {
		if isSplitAnswer(resp) {
			split = newCollector(len(events))
			return c.takeAnswer(resp, identity(len(events)), split)
		}
		c.announced(resp)
		var perr error
		ack, perr = parseAck(resp.Header)
		return perr
	})
	if split == nil || err != nil {
		ack.Attempts = n
		return ack, err
	}
	split.count(n)
	res, err := split.result()
	return res.ack(), err
}

// PutEmbedding sets entity's embedding; id identifies the write so that a
// retry is recognised.
func (c *Client) PutEmbedding(ctx context.Context, entity uint64, id string, vec []float32) (Ack, error) {
	if c.binaryVec {
		return c.write(ctx, &request{method: http.MethodPut, path: "/v1/entities/" + strconv.FormatUint(entity, 10) + "/embedding",
			query: url.Values{"id": {id}}, body: vectorBytes(vec), ctype: "application/octet-stream"})
	}
	r, err := jsonRequest(http.MethodPut, "/v1/entities/"+strconv.FormatUint(entity, 10)+"/embedding", struct {
		ID     string    `json:"id"`
		Vector []float32 `json:"vector"`
	}{id, vec})
	if err != nil {
		return Ack{}, err
	}
	return c.write(ctx, r)
}

func (c *Client) write(ctx context.Context, r *request) (Ack, error) {
	var ack Ack
	n, err := c.do(ctx, r, func(resp *http.Response) error {
		var perr error
		ack, perr = parseAck(resp.Header)
		return perr
	})
	ack.Attempts = n
	return ack, err
}

// parseAck reads the write headers. A missing header reads as zero; a
// malformed one is an error, because a harness that records a wrong seq
// would blame the wrong write.
func parseAck(h http.Header) (Ack, error) {
	var ack Ack
	var errs []error
	num := func(name string) uint64 {
		v := h.Get(name)
		if v == "" {
			return 0
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("header %s: expected an unsigned integer, found %q", name, v))
		}
		return n
	}
	ack.Seq = num("X-Tidal-Seq")
	ack.Term = num("X-Tidal-Term")
	ack.Node = num("X-Tidal-Node")
	ack.Duplicates = int(num("X-Tidal-Duplicates"))
	return ack, errors.Join(errs...)
}

// Entity is what a node knows about one entity.
type Entity struct {
	Entity       uint64                 `json:"entity"`
	AppliedIndex uint64                 `json:"applied_index"` // the state the answer reflects
	At           int64                  `json:"at"`            // unix ms the scores were evaluated at
	Signals      map[string]SignalStats `json:"signals"`
	Embedding    []float32              `json:"embedding,omitempty"`
}

// SignalStats are the aggregates of one signal on one entity.
type SignalStats struct {
	Count     uint64            `json:"count"`
	WeightSum float64           `json:"weight_sum"`
	Score     float64           `json:"score"`   // decayed score at Entity.At
	Windows   map[string]uint64 `json:"windows"` // event counts per window, e.g. "1h", "24h", "all"
}

// ReadOption adjusts a read.
type ReadOption func(url.Values)

// Local reads the answering node's applied state without confirming
// leadership first: fast, possibly stale.
func Local() ReadOption { return func(q url.Values) { q.Set("consistency", "local") } }

// At evaluates decayed scores and windows at unix time ms instead of the
// node's clock.
func At(ms int64) ReadOption {
	return func(q url.Values) { q.Set("at", strconv.FormatInt(ms, 10)) }
}

// Entity reads one entity's aggregates and embedding; linearizable unless
// Local() is given. On a sharded cluster a linearizable read goes to the
// owning group's leader, a local one to one of the group's replicas.
func (c *Client) Entity(ctx context.Context, entity uint64, opts ...ReadOption) (*Entity, error) {
	q := url.Values{"consistency": {"linearizable"}}
	for _, o := range opts {
		o(q)
	}
	c.refreshIfStale(ctx)
	if m := c.routes.multi(); m != nil {
		return c.routedEntity(ctx, m, entity, q)
	}
	r := &request{method: http.MethodGet, path: "/v1/entities/" + strconv.FormatUint(entity, 10), query: q}
	var out Entity
	if _, err := c.do(ctx, r, func(resp *http.Response) error {
		c.announced(resp)
		return decodeJSON(resp, &out)
	}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Match is one nearest-neighbour result.
type Match struct {
	Entity uint64  `json:"entity"`
	Score  float32 `json:"score"`
}

// Nearest returns the k entities whose embeddings are most similar to vec
// by cosine similarity, best first.
func (c *Client) Nearest(ctx context.Context, vec []float32, k int) ([]Match, error) {
	var r *request
	if c.binaryVec {
		r = &request{method: http.MethodPost, path: "/v1/query/nearest", query: url.Values{"k": {strconv.Itoa(k)}},
			body: vectorBytes(vec), ctype: "application/octet-stream"}
	} else {
		var err error
		r, err = jsonRequest(http.MethodPost, "/v1/query/nearest", struct {
			Vector []float32 `json:"vector"`
			K      int       `json:"k"`
		}{vec, k})
		if err != nil {
			return nil, err
		}
	}
	var out struct {
		Results []Match `json:"results"`
	}
	if _, err := c.do(ctx, r, func(resp *http.Response) error { return decodeJSON(resp, &out) }); err != nil {
		return nil, err
	}
	return out.Results, nil
}

// Ranked is one entry of a top-k list.
type Ranked struct {
	Entity uint64  `json:"entity"`
	Value  float64 `json:"value"` // window count, or decayed score when no window is given
}

// Top returns the k entities ranking highest on signal: by count in window,
// or by decayed score when window is "".
func (c *Client) Top(ctx context.Context, signal, window string, k int) ([]Ranked, error) {
	q := url.Values{"signal": {signal}, "k": {strconv.Itoa(k)}}
	if window != "" {
		q.Set("window", window)
	}
	var out struct {
		Results []Ranked `json:"results"`
	}
	r := &request{method: http.MethodGet, path: "/v1/top", query: q}
	if _, err := c.do(ctx, r, func(resp *http.Response) error { return decodeJSON(resp, &out) }); err != nil {
		return nil, err
	}
	return out.Results, nil
}

// Location is where an event landed in the log.
type Location struct {
	ID     string `json:"id"`
	Index  uint64 `json:"index"`
	Term   uint64 `json:"term"`
	Entity uint64 `json:"entity"`
	Signal string `json:"signal"`
}

// EventLocation looks an event up by id; an unknown id is an error for
// which IsNotFound holds.
func (c *Client) EventLocation(ctx context.Context, id string) (*Location, error) {
	r := &request{method: http.MethodGet, path: "/v1/events/" + url.PathEscape(id)}
	var out Location
	if _, err := c.do(ctx, r, func(resp *http.Response) error { return decodeJSON(resp, &out) }); err != nil {
		return nil, err
	}
	return &out, nil
}

// AuditEvents streams every applied event id with its position, calling fn
// for each in the order the server sends them. An error from fn stops the
// stream and is returned as is. A stream that breaks off is an error, never
// a silently short list; it is not retried once fn has been called.
func (c *Client) AuditEvents(ctx context.Context, fn func(Location) error) error {
	r := &request{method: http.MethodGet, path: "/v1/audit/events", stream: true}
	var fnErr error
	_, err := c.do(ctx, r, func(resp *http.Response) error {
		br := bufio.NewReaderSize(resp.Body, 64<<10)
		for line := 1; ; line++ {
			raw, rerr := br.ReadBytes('\n')
			if raw = bytes.TrimSpace(raw); len(raw) > 0 {
				var loc Location
				if err := json.Unmarshal(raw, &loc); err != nil {
					return fmt.Errorf("line %d: %w", line, err)
				}
				if err := fn(loc); err != nil {
					fnErr = err
					return err
				}
			}
			if rerr == io.EOF {
				return nil
			}
			if rerr != nil {
				return fmt.Errorf("reading line %d: %w", line, rerr)
			}
		}
	})
	if fnErr != nil {
		return fnErr
	}
	return err
}

// Digest is a hash of a node's whole state at an applied index; equal
// indexes must give equal digests on every node.
type Digest struct {
	AppliedIndex uint64 `json:"applied_index"`
	Digest       string `json:"digest"`
}

// Digest returns the node's state digest.
func (c *Client) Digest(ctx context.Context) (Digest, error) {
	var out Digest
	r := &request{method: http.MethodGet, path: "/v1/audit/digest"}
	_, err := c.do(ctx, r, func(resp *http.Response) error { return decodeJSON(resp, &out) })
	return out, err
}

// Status is a node's view of the cluster.
type Status struct {
	Node    uint64 `json:"node"`
	Leader  uint64 `json:"leader"` // 0: no known leader
	Term    uint64 `json:"term"`
	Commit  uint64 `json:"commit"`
	Applied uint64 `json:"applied"`
	// Role is the answering node's: leader, follower, candidate or
	// stopped. Only a leader knows the members' Match, Lag and Reachable.
	Role    string         `json:"role"`
	Members []MemberStatus `json:"members"`
	Error   string         `json:"error,omitempty"` // why a stopped node stopped
}

// KnowsProgress reports whether Members' Match, Lag and Reachable are
// real: only the leader tracks its followers' replication.
func (s *Status) KnowsProgress() bool { return s.Role == "leader" }

// MemberStatus is one member as the answering node sees it; Match and Lag
// are only known on the leader.
type MemberStatus struct {
	ID         uint64 `json:"id"`
	PeerAddr   string `json:"peer_addr"`
	ClientAddr string `json:"client_addr"`
	Role       string `json:"role"` // leader, follower or learner
	Match      uint64 `json:"match"`
	Lag        uint64 `json:"lag"`
	Reachable  bool   `json:"reachable"`
}

// Status returns the node's cluster status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var out Status
	r := &request{method: http.MethodGet, path: "/cluster/status"}
	if _, err := c.do(ctx, r, func(resp *http.Response) error { return decodeJSON(resp, &out) }); err != nil {
		return nil, err
	}
	return &out, nil
}

// Healthy returns nil when the node's process answers /healthz. It makes
// one attempt: a probe reports the present, not the best of three.
func (c *Client) Healthy(ctx context.Context) error {
	r := &request{method: http.MethodGet, path: "/healthz", probe: true}
	_, err := c.do(ctx, r, func(*http.Response) error { return nil })
	return err
}

// Ready returns nil when the node has a leader and has caught up
// (/readyz); otherwise the 503 says why. One attempt, like Healthy.
func (c *Client) Ready(ctx context.Context) error {
	r := &request{method: http.MethodGet, path: "/readyz", probe: true}
	_, err := c.do(ctx, r, func(*http.Response) error { return nil })
	return err
}

// Metrics returns the node's Prometheus exposition text.
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	var out []byte
	r := &request{method: http.MethodGet, path: "/metrics"}
	_, err := c.do(ctx, r, func(resp *http.Response) error {
		var rerr error
		out, rerr = io.ReadAll(io.LimitReader(resp.Body, maxResponse))
		return rerr
	})
	return out, err
}

// Member is a cluster member as the admin API takes it.
type Member struct {
	ID         uint64 `json:"id"`
	PeerAddr   string `json:"peer_addr"`
	ClientAddr string `json:"client_addr"`
}

// AddMember adds a node to the cluster and returns it as the server
// recorded it.
func (c *Client) AddMember(ctx context.Context, m Member) (*Member, error) {
	r, err := jsonRequest(http.MethodPost, "/admin/members", m)
	if err != nil {
		return nil, err
	}
	var out Member
	if _, err := c.do(ctx, r, func(resp *http.Response) error { return decodeJSON(resp, &out) }); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveMember removes node id from the cluster.
func (c *Client) RemoveMember(ctx context.Context, id uint64) error {
	r := &request{method: http.MethodDelete, path: "/admin/members/" + strconv.FormatUint(id, 10)}
	_, err := c.do(ctx, r, func(*http.Response) error { return nil })
	return err
}

// TransferLeader asks the leader to hand leadership to node to.
func (c *Client) TransferLeader(ctx context.Context, to uint64) error {
	r, err := jsonRequest(http.MethodPost, "/admin/transfer-leader", struct {
		To uint64 `json:"to"`
	}{to})
	if err != nil {
		return err
	}
	_, err = c.do(ctx, r, func(*http.Response) error { return nil })
	return err
}

// Snapshot makes the node snapshot its state now and returns the log
// position the snapshot covers.
func (c *Client) Snapshot(ctx context.Context) (index, term uint64, err error) {
	var out struct {
		Index uint64 `json:"index"`
		Term  uint64 `json:"term"`
	}
	r := &request{method: http.MethodPost, path: "/admin/snapshot"}
	if _, err := c.do(ctx, r, func(resp *http.Response) error { return decodeJSON(resp, &out) }); err != nil {
		return 0, 0, err
	}
	return out.Index, out.Term, nil
}

// Backup streams a snapshot of the node's state into w and returns the
// number of bytes written. It is retried only before the first byte
// reaches w; a stream that breaks off afterwards is an error.
func (c *Client) Backup(ctx context.Context, w io.Writer) (int64, error) {
	var n int64
	r := &request{method: http.MethodGet, path: "/admin/backup", stream: true}
	_, err := c.do(ctx, r, func(resp *http.Response) error {
		var cerr error
		n, cerr = io.Copy(w, resp.Body)
		return cerr
	})
	return n, err
}

// vectorBytes is a vector's application/octet-stream body.
func vectorBytes(vec []float32) []byte {
	b := make([]byte, 0, 4*len(vec))
	for _, f := range vec {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}
