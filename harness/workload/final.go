package workload

import (
	"context"
	"fmt"
	"strings"

	"github.com/tidaldb/tidal/harness/history"
)

// finalReadOps bounds the ops FinalReads spends on one key.
const finalReadOps = 5

// FinalReads reads every counter key, and every embedding entity, once
// with a linearizable read, to be called after the cluster healed and
// quiesced: without reads after the last add, an add that ended info
// constrains nothing, and a lost add goes unnoticed by the counter
// checkers.
//
// Key i is read through node i mod N, so together the reads cover every
// node. A read that does not come back ok is tried again, through the next
// node, up to 5 ops per key; an info retires the reading process as
// always. A workload without counters or embeddings reads nothing. The
// error names the keys left without an ok read (the history still holds
// what happened), or reports a recorder failure.
func (w *Workload) FinalReads(ctx context.Context) error {
	var reads []call
	if w.cfg.Kind == Counter || w.cfg.Kind == Mixed {
		for k := range uint64(w.cfg.Keys) {
			reads = append(reads, counterRead(CounterBase+k))
		}
	}
	if w.cfg.Kind == Embeddings || w.cfg.Kind == Mixed {
		for k := range uint64(w.cfg.Vectors) {
			reads = append(reads, embeddingGet(EmbeddingBase+k))
		}
	}
	proc := w.newProcess()
	var missing []string
	for i, c := range reads {
		ok := false
		for attempt := 0; attempt < finalReadOps && !ok && ctx.Err() == nil; attempt++ {
			names := w.targets.Names()
			if len(names) == 0 {
				return fmt.Errorf("workload: final reads: no nodes to read from")
			}
			switch w.perform(ctx, proc, names[(i+attempt)%len(names)], c) {
			case history.OK:
				ok = true
			case history.Info:
				proc = w.newProcess()
			}
		}
		if !ok {
			missing = append(missing, describeRead(c))
		}
	}
	w.pick.closeIdle()
	if err := w.rec.Err(); err != nil {
		return fmt.Errorf("workload: final reads: recording the history: %w", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("workload: final reads: expected an ok read of every key, found none after %d tries for %s",
			finalReadOps, strings.Join(missing, ", "))
	}
	return nil
}

func describeRead(c call) string {
	switch v := c.value.(type) {
	case history.ReadValue:
		return fmt.Sprintf("counter key %d", v.Key)
	case history.GetEmbeddingValue:
		return fmt.Sprintf("embedding entity %d", v.Entity)
	}
	return c.f
}
