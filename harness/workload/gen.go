package workload

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// call is one generated operation: what the history records at the
// invoke, and how to perform it.
type call struct {
	f     string
	value any
	// exec performs the op against c. It returns the completion's value
	// (nil repeats the invoke's) and, for writes, the ack.
	exec func(ctx context.Context, c *client.Client) (any, client.Ack, error)
	// counterKey is the key of a counter op (0 otherwise), whose outcome
	// goes back to the key slots.
	counterKey uint64
}

// ids hands out the write ids of one process: prefix, process, then a
// sequence number, e.g. "L12.7" and its events "L12.7.0", "L12.7.1". Unique
// across a Workload because process ids are.
type ids struct {
	prefix string
	proc   history.Process
	n      int
}

func (g *ids) next(kind string) string {
	id := g.prefix + kind + strconv.Itoa(int(g.proc)) + "." + strconv.Itoa(g.n)
	g.n++
	return id
}

// generator is what generating ops shares across the workers of a
// Workload: the configuration, the counter key slots and the write-once
// embedding entities handed out so far.
type generator struct {
	cfg       *Config
	keys      *keySlots
	writeOnce atomic.Uint64
}

func newGenerator(cfg *Config) *generator {
	return &generator{cfg: cfg, keys: newKeySlots(cfg)}
}

// maxEventAge bounds how far in the past a counter add's client-chosen
// ts lies: past the largest default window (24h), so windows and decay
// see events of every age, inside and out.
const maxEventAge = 30 * time.Hour

// generate draws the next op of kind k for worker (an index stable for
// the worker's life, which picks its counter key slot).
func (g *generator) generate(k Kind, rng *rand.Rand, id *ids, worker int) call {
	cfg := g.cfg
	switch k {
	case Ledger:
		return ledgerWrite(cfg, rng, id)
	case Counter:
		key := g.keys.take(worker)
		if rng.Float64() < cfg.ReadRatio {
			return counterRead(key)
		}
		// Half the adds carry a client ts of any age up to maxEventAge,
		// half are stamped by the node that takes them.
		var ts int64
		if rng.IntN(2) == 0 {
			ts = time.Now().UnixMilli() - rng.Int64N(maxEventAge.Milliseconds())
		}
		return counterAdd(key, 1+rng.Int64N(int64(cfg.MaxDelta)), id, ts)
	case Embeddings:
		if rng.Float64() < cfg.GetRatio {
			return embeddingGet(g.embeddingToRead(rng), false)
		}
		entity := EmbeddingBase + rng.Uint64N(uint64(cfg.Vectors))
		if rng.Float64() < cfg.WriteOnceRatio {
			entity = EmbeddingBase + WriteOnceBase + g.writeOnce.Add(1) - 1
		}
		return embeddingPut(entity, randomVector(rng, cfg.Dim), id)
	}
	switch x := rng.Float64(); {
	case x < 0.5:
		return g.generate(Ledger, rng, id, worker)
	case x < 0.8:
		return g.generate(Counter, rng, id, worker)
	default:
		return g.generate(Embeddings, rng, id, worker)
	}
}

// embeddingToRead picks an overwritten entity or, half the time once
// there are any, a write-once one.
func (g *generator) embeddingToRead(rng *rand.Rand) uint64 {
	if n := g.writeOnce.Load(); n > 0 && rng.IntN(2) == 0 {
		return EmbeddingBase + WriteOnceBase + rng.Uint64N(n)
	}
	return EmbeddingBase + rng.Uint64N(uint64(g.cfg.Vectors))
}

// embeddingEntities lists every entity embeddings may have been put on.
func (g *generator) embeddingEntities() []uint64 {
	out := make([]uint64, 0, uint64(g.cfg.Vectors)+g.writeOnce.Load())
	for k := range uint64(g.cfg.Vectors) {
		out = append(out, EmbeddingBase+k)
	}
	for k := range g.writeOnce.Load() {
		out = append(out, EmbeddingBase+WriteOnceBase+k)
	}
	return out
}

func ledgerWrite(cfg *Config, rng *rand.Rand, id *ids) call {
	n := 1 + rng.IntN(cfg.MaxBatch)
	base := id.next("L")
	events := make([]client.Event, n)
	value := history.WriteValue{Events: make([]history.Event, n)}
	for i := range events {
		e := client.Event{
			ID:     base + "." + strconv.Itoa(i),
			Entity: 1 + rng.Uint64N(uint64(cfg.Entities)),
			Signal: ledgerSignals[rng.IntN(len(ledgerSignals))],
		}
		events[i] = e
		value.Events[i] = history.Event{ID: e.ID, Entity: e.Entity, Signal: e.Signal}
	}
	return call{f: history.FWrite, value: value, exec: func(ctx context.Context, c *client.Client) (any, client.Ack, error) {
		ack, err := c.WriteSignals(ctx, events)
		if err != nil {
			return nil, ack, err
		}
		done := value
		done.Duplicates = &ack.Duplicates
		return done, ack, nil
	}}
}

// counterAdd adds delta to key as one event of weight delta, so that the
// key's weight_sum on CounterSignal is the counter. ts is the event's
// timestamp, 0 to have the node stamp it; the value records what the
// aggregates checker needs to know when it was stamped.
func counterAdd(key uint64, delta int64, id *ids, ts int64) call {
	e := client.Event{ID: id.next("C"), Entity: key, Signal: CounterSignal, Weight: float64(delta), TS: ts}
	value := history.AddValue{Key: key, Delta: delta, IDs: []string{e.ID}, TS: ts}
	if ts == 0 {
		// Taken before the request is sent: the node stamps no earlier.
		value.SentMS = time.Now().UnixMilli()
	}
	return call{f: history.FAdd, value: value, counterKey: key, exec: func(ctx context.Context, c *client.Client) (any, client.Ack, error) {
		ack, err := c.WriteSignals(ctx, []client.Event{e})
		if err != nil {
			return nil, ack, err
		}
		done := value
		done.Duplicates = &ack.Duplicates
		if ts == 0 {
			done.AckedMS = time.Now().UnixMilli()
		}
		return done, ack, nil
	}}
}

// counterRead reads key linearizably, recording the counter (weight_sum)
// and everything else the node says about CounterSignal on key.
func counterRead(key uint64) call {
	return call{f: history.FRead, value: history.ReadValue{Key: key}, counterKey: key, exec: func(ctx context.Context, c *client.Client) (any, client.Ack, error) {
		e, err := c.Entity(ctx, key)
		if err != nil {
			return nil, client.Ack{}, err
		}
		returned := time.Now().UnixMilli()
		s := e.Signals[CounterSignal] // zero when the key has no events yet
		// Adds are integers far below 2^53, so the sum is exact; anything
		// else is a server bug, filed info (not a value the checkers
		// would misread) with the evidence in the error.
		if s.WeightSum != math.Trunc(s.WeightSum) || math.Abs(s.WeightSum) > 1<<53 {
			return nil, client.Ack{}, fmt.Errorf("read of counter key %d: expected an integral weight_sum on %q, found %v (applied index %d)",
				key, CounterSignal, s.WeightSum, e.AppliedIndex)
		}
		v := int64(s.WeightSum)
		stats := &history.SignalStats{At: e.At, Count: s.Count, WeightSum: s.WeightSum, Score: s.Score, Windows: s.Windows, ReturnedMS: returned}
		return history.ReadValue{Key: key, Value: &v, Stats: stats}, client.Ack{}, nil
	}}
}

func embeddingPut(entity uint64, vec []float32, id *ids) call {
	value := history.PutEmbeddingValue{Entity: entity, ID: id.next("E"), Dim: len(vec), Hash: VectorHash(vec)}
	return call{f: history.FPutEmbedding, value: value, exec: func(ctx context.Context, c *client.Client) (any, client.Ack, error) {
		ack, err := c.PutEmbedding(ctx, entity, value.ID, vec)
		if err != nil {
			return nil, ack, err
		}
		done := value
		dup := ack.Duplicates > 0
		done.Duplicate = &dup
		return done, ack, nil
	}}
}

// embeddingGet reads entity, linearizably or (local) from the answering
// node's own state; the completion holds the hash of its embedding (""
// when it has none) and the applied index the answer reflects.
func embeddingGet(entity uint64, local bool) call {
	var opts []client.ReadOption
	if local {
		opts = append(opts, client.Local())
	}
	return call{f: history.FGetEmbedding, value: history.GetEmbeddingValue{Entity: entity, Local: local}, exec: func(ctx context.Context, c *client.Client) (any, client.Ack, error) {
		e, err := c.Entity(ctx, entity, opts...)
		if err != nil {
			return nil, client.Ack{}, err
		}
		v := history.GetEmbeddingValue{Entity: entity, Local: local, AppliedIndex: e.AppliedIndex}
		if len(e.Embedding) > 0 {
			v.Hash = VectorHash(e.Embedding)
		}
		return v, client.Ack{}, nil
	}}
}

// randomVector draws components uniformly from [-1, 1); its norm is far
// from zero for any width.
func randomVector(rng *rand.Rand, dim int) []float32 {
	v := make([]float32, dim)
	for i := range v {
		v[i] = rng.Float32()*2 - 1
	}
	v[0] += 2 // never the zero vector, which the server refuses
	return v
}

// VectorHash is the digest the history records for a vector: the first 8
// bytes of SHA-256 over its float32 bits, little-endian, in hex. A vector
// survives the JSON round trip bit for bit (float32 prints exactly), so a
// get returns the hash of the put it observed.
func VectorHash(v []float32) string {
	h := sha256.New()
	var b [4]byte
	for _, x := range v {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(x))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
