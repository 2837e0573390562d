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

// generate draws the next op of kind k.
func generate(k Kind, cfg *Config, rng *rand.Rand, id *ids) call {
	switch k {
	case Ledger:
		return ledgerWrite(cfg, rng, id)
	case Counter:
		key := CounterBase + rng.Uint64N(uint64(cfg.Keys))
		if rng.Float64() < cfg.ReadRatio {
			return counterRead(key)
		}
		return counterAdd(key, 1+rng.Int64N(int64(cfg.MaxDelta)), id)
	case Embeddings:
		entity := EmbeddingBase + rng.Uint64N(uint64(cfg.Vectors))
		if rng.Float64() < cfg.GetRatio {
			return embeddingGet(entity)
		}
		return embeddingPut(entity, randomVector(rng, cfg.Dim), id)
	}
	switch x := rng.Float64(); {
	case x < 0.5:
		return generate(Ledger, cfg, rng, id)
	case x < 0.8:
		return generate(Counter, cfg, rng, id)
	default:
		return generate(Embeddings, cfg, rng, id)
	}
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
		return nil, ack, err
	}}
}

// counterAdd adds delta to key as one event of weight delta, so that the
// key's weight_sum on CounterSignal is the counter.
func counterAdd(key uint64, delta int64, id *ids) call {
	e := client.Event{ID: id.next("C"), Entity: key, Signal: CounterSignal, Weight: float64(delta)}
	value := history.AddValue{Key: key, Delta: delta, IDs: []string{e.ID}}
	return call{f: history.FAdd, value: value, exec: func(ctx context.Context, c *client.Client) (any, client.Ack, error) {
		ack, err := c.WriteSignals(ctx, []client.Event{e})
		return nil, ack, err
	}}
}

// counterRead reads key linearizably.
func counterRead(key uint64) call {
	return call{f: history.FRead, value: history.ReadValue{Key: key}, exec: func(ctx context.Context, c *client.Client) (any, client.Ack, error) {
		e, err := c.Entity(ctx, key)
		if err != nil {
			return nil, client.Ack{}, err
		}
		sum := e.Signals[CounterSignal].WeightSum
		// Adds are integers far below 2^53, so the sum is exact; anything
		// else is a server bug, filed info (not a value the checkers
		// would misread) with the evidence in the error.
		if sum != math.Trunc(sum) || math.Abs(sum) > 1<<53 {
			return nil, client.Ack{}, fmt.Errorf("read of counter key %d: expected an integral weight_sum on %q, found %v (applied index %d)",
				key, CounterSignal, sum, e.AppliedIndex)
		}
		v := int64(sum)
		return history.ReadValue{Key: key, Value: &v}, client.Ack{}, nil
	}}
}

func embeddingPut(entity uint64, vec []float32, id *ids) call {
	value := history.PutEmbeddingValue{Entity: entity, ID: id.next("E"), Dim: len(vec), Hash: VectorHash(vec)}
	return call{f: history.FPutEmbedding, value: value, exec: func(ctx context.Context, c *client.Client) (any, client.Ack, error) {
		ack, err := c.PutEmbedding(ctx, entity, value.ID, vec)
		return nil, ack, err
	}}
}

// embeddingGet reads entity linearizably; the completion holds the hash of
// its embedding ("" when it has none).
func embeddingGet(entity uint64) call {
	return call{f: history.FGetEmbedding, value: history.GetEmbeddingValue{Entity: entity}, exec: func(ctx context.Context, c *client.Client) (any, client.Ack, error) {
		e, err := c.Entity(ctx, entity)
		if err != nil {
			return nil, client.Ack{}, err
		}
		v := history.GetEmbeddingValue{Entity: entity}
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
