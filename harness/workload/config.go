// Package workload runs the clients of a chaos run and records every
// operation they perform in a history (package history), for the checkers
// to judge afterwards.
//
// Clients are Jepsen processes. The invariants every history written here
// keeps, and the checkers rely on:
//
//   - A process has at most one operation in flight.
//   - An operation whose outcome is unknown — a timeout, a 504, a connection
//     lost after the request went out (client.IsIndefinite) — completes
//     info, never fail, and its process never invokes again: the worker
//     carries on under a fresh process id. Process ids are unique across a
//     Workload (every Run and FinalReads).
//   - fail is recorded only for a definite error, which the client reports
//     only when no attempt can have been applied (a 4xx, a 503 answered
//     before proposing, a refused connection).
//   - Every event id and embedding write id is unique across a Workload; the
//     client's retries resend the same ids, so a retried write that lands
//     twice is deduplicated by the server and an ok after a retry is an ok.
//   - ok writes carry the raft position of the ack (seq, term); every op
//     carries the name of the node the client sent it to.
//
// Workloads use disjoint entity ranges, so mixing them never lets one
// disturb what another checks: ledger writes go to entities 1..Entities on
// signals view, share and skip; counter keys are entities CounterBase+k
// and count on signal like; embeddings live on entities EmbeddingBase+k
// (overwritten) and EmbeddingBase+WriteOnceBase+k (each put once).
//
// Counter keys are handed out in slots (see keySlots): a key takes a
// bounded number of ops, and of info adds, before its slot moves on to a
// fresh key, so every key's linearizability search stays small however
// long and faulty the run.
package workload

import (
	"fmt"
	"strings"
	"time"
)

// Kind names a workload.
type Kind string

const (
	// Ledger writes batches of signal events with unique ids over many
	// entities; checked by the ledger checker against every node's audit.
	Ledger Kind = "ledger"
	// Counter adds to per-key counters and reads them linearizably;
	// checked by the counter and linearizable checkers (and ledger: adds
	// carry event ids).
	Counter Kind = "counter"
	// Embeddings puts vectors and reads them back.
	Embeddings Kind = "embeddings"
	// Mixed interleaves the three, half ledger writes, three tenths
	// counter ops, a fifth embedding ops.
	Mixed Kind = "mixed"
)

// Kinds lists every workload, for flag help.
var Kinds = []Kind{Ledger, Counter, Embeddings, Mixed}

// ParseKind reads a workload name.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("workload: expected one of %s, found %q", joinNames(Kinds), s)
}

// Selection is how a client op chooses the node it is sent to.
type Selection string

const (
	// RoundRobin cycles through the nodes, op by op, across all workers.
	RoundRobin Selection = "round-robin"
	// Random picks a node uniformly for every op.
	Random Selection = "random"
	// LeaderOnly sends every op to the node last known to lead. The hint
	// is refreshed every second and soon after any op sent to it fails;
	// while no leader is known, ops go round-robin.
	LeaderOnly Selection = "leader"
)

// Selections lists every node selection, for flag help.
var Selections = []Selection{RoundRobin, Random, LeaderOnly}

// ParseSelection reads a node selection name.
func ParseSelection(s string) (Selection, error) {
	for _, k := range Selections {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("workload: node selection: expected one of %s, found %q", joinNames(Selections), s)
}

func joinNames[T ~string](names []T) string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	return strings.Join(s, ", ")
}

// Entity ranges of the workloads (see the package comment).
const (
	CounterBase   uint64 = 1 << 32
	EmbeddingBase uint64 = 2 << 32
	// WriteOnceBase offsets the write-once embedding entities from the
	// overwritten ones (Vectors is at most 2^31).
	WriteOnceBase uint64 = 1 << 31
	// CounterSignal is the signal whose weight_sum is a counter key's
	// value: an add of delta d is one event of weight d.
	CounterSignal = "like"
)

// ledgerSignals are the signals ledger writes use; never CounterSignal.
var ledgerSignals = [...]string{"view", "share", "skip"}

// Config describes a workload. Zero fields take the defaults noted.
type Config struct {
	Kind Kind // required
	// Concurrency is the number of workers: in a closed loop each issues
	// its next op when the last completes; in an open loop it bounds the
	// ops in flight. Default 8.
	Concurrency int
	// Rate > 0 runs an open loop: ops come due at Rate per second, op i at
	// i/Rate after the start, and an op that comes due while every worker
	// is busy is shed (counted, not queued). 0 runs a closed loop.
	Rate float64
	// Duration bounds how long new ops are issued (0: until the context
	// ends). Ops in flight when it ends run to completion.
	Duration time.Duration
	// Seed drives every random choice (worker i draws from Seed and i).
	Seed uint64
	// Select is how ops choose nodes. Default RoundRobin.
	Select Selection
	// Timeout bounds each attempt of an op. Default 2s.
	Timeout time.Duration
	// Attempts is how many times an op is tried, with the same ids, before
	// its outcome is recorded. Default 2 (one retry).
	Attempts int
	// IDPrefix starts every event and write id, so that workloads sharing
	// a cluster cannot collide. Default empty.
	IDPrefix string

	// Entities is the ledger's entity range, 1..Entities. Default 1000.
	Entities int
	// MaxBatch bounds a ledger write: 1..MaxBatch events. Default 8.
	MaxBatch int

	// Keys is the number of counter keys in use at once. Worker i works on
	// key slot i mod Keys, so at most ⌈Concurrency/Keys⌉ workers share a
	// key: few keys mean contention, which is what finds linearizability
	// violations. Default 4.
	Keys int
	// OpsPerKey and InfosPerKey retire a counter key: once a slot's key
	// has been given OpsPerKey ops, or InfosPerKey of its adds ended info,
	// the slot moves on to a fresh key. An info add stays concurrent with
	// everything after it, and porcupine's search grows exponentially in
	// the number of them on one key; these bounds keep every key
	// decidable in milliseconds under any fault mix. Defaults 100 and 4.
	OpsPerKey   int
	InfosPerKey int
	// CounterHalfLife and CounterWindows are the servers' schema for
	// CounterSignal as the aggregates checker expects it (window name ->
	// duration, 0 for "all"); like Dim, they must equal the servers'
	// schema. Defaults: the server's default schema, 72h and 1h, 24h, all.
	CounterHalfLife time.Duration
	CounterWindows  map[string]time.Duration
	// MaxDelta bounds counter adds: 1..MaxDelta. Default 5.
	MaxDelta int
	// ReadRatio is the share of counter ops that are reads, in (0, 1).
	// Default 0.5.
	ReadRatio float64

	// Dim is the embedding width; it must equal the servers' schema.
	// Default 1536, the server's default.
	Dim int
	// Vectors is the number of entities embeddings are overwritten on.
	// Default 16.
	Vectors int
	// WriteOnceRatio is the share of embedding puts that go to a fresh
	// entity, put once and never again: a vector lost there cannot be
	// refilled by a later put, so the embeddings checker sees the loss
	// however the run goes on. In (0, 1). Default 0.5.
	WriteOnceRatio float64
	// GetRatio is the share of embedding ops that are gets, in (0, 1).
	// Default 0.5.
	GetRatio float64
}

// WithDefaults returns c with every zero field set to its default, or an
// error naming the first invalid field.
func (c Config) WithDefaults() (Config, error) {
	if _, err := ParseKind(string(c.Kind)); err != nil {
		return c, err
	}
	if c.Select == "" {
		c.Select = RoundRobin
	}
	if _, err := ParseSelection(string(c.Select)); err != nil {
		return c, err
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Concurrency, 8)
	def(&c.Attempts, 2)
	def(&c.Entities, 1000)
	def(&c.MaxBatch, 8)
	def(&c.Keys, 4)
	def(&c.OpsPerKey, 100)
	def(&c.InfosPerKey, 4)
	def(&c.MaxDelta, 5)
	def(&c.Dim, 1536)
	def(&c.Vectors, 16)
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second
	}
	if c.ReadRatio == 0 {
		c.ReadRatio = 0.5
	}
	if c.GetRatio == 0 {
		c.GetRatio = 0.5
	}
	if c.WriteOnceRatio == 0 {
		c.WriteOnceRatio = 0.5
	}
	if c.CounterHalfLife == 0 {
		c.CounterHalfLife = 72 * time.Hour
	}
	if c.CounterWindows == nil {
		c.CounterWindows = map[string]time.Duration{"1h": time.Hour, "24h": 24 * time.Hour, "all": 0}
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"concurrency", c.Concurrency}, {"attempts", c.Attempts}, {"entities", c.Entities}, {"max batch", c.MaxBatch},
		{"keys", c.Keys}, {"ops per key", c.OpsPerKey}, {"infos per key", c.InfosPerKey},
		{"max delta", c.MaxDelta}, {"dim", c.Dim}, {"vectors", c.Vectors}} {
		if f.v < 1 {
			return c, fmt.Errorf("workload: %s: expected at least 1, found %d", f.name, f.v)
		}
	}
	switch {
	case c.Rate < 0:
		return c, fmt.Errorf("workload: rate: expected 0 (closed loop) or ops/s > 0, found %g", c.Rate)
	case c.Duration < 0:
		return c, fmt.Errorf("workload: duration: expected >= 0, found %s", c.Duration)
	case c.Timeout < 0:
		return c, fmt.Errorf("workload: timeout: expected > 0, found %s", c.Timeout)
	case c.ReadRatio <= 0 || c.ReadRatio >= 1:
		return c, fmt.Errorf("workload: read ratio: expected a share in (0, 1), found %g", c.ReadRatio)
	case c.GetRatio <= 0 || c.GetRatio >= 1:
		return c, fmt.Errorf("workload: get ratio: expected a share in (0, 1), found %g", c.GetRatio)
	case c.WriteOnceRatio <= 0 || c.WriteOnceRatio >= 1:
		return c, fmt.Errorf("workload: write-once ratio: expected a share in (0, 1), found %g", c.WriteOnceRatio)
	case c.CounterHalfLife < time.Millisecond:
		return c, fmt.Errorf("workload: counter half-life: expected at least 1ms, found %s", c.CounterHalfLife)
	case c.Keys > 1<<31 || c.Vectors > 1<<31:
		return c, fmt.Errorf("workload: keys %d, vectors %d: expected at most 2^31 each (the entity ranges are 2^32 wide)", c.Keys, c.Vectors)
	}
	for name, d := range c.CounterWindows {
		if d < 0 || d%time.Minute != 0 {
			return c, fmt.Errorf("workload: counter window %q: expected a whole number of minutes (0 for all), found %s", name, d)
		}
	}
	return c, nil
}

// opTimeout bounds one op, all its attempts and the backoff between them.
// The client gives up rather than start an attempt it cannot finish in
// time, and a give-up after a sent attempt is indefinite, so this bound
// never turns an unknown outcome into a fail.
func (c Config) opTimeout() time.Duration {
	return time.Duration(c.Attempts)*c.Timeout + time.Duration(c.Attempts-1)*maxBackoff
}

const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 500 * time.Millisecond
)
