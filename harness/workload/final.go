package workload

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/tidaldb/tidal/harness/history"
)

// finalReadOps bounds the ops FinalReads spends on one key (or one
// entity on one node).
const finalReadOps = 5

// FinalReads is to be called after the cluster healed and quiesced. It
// reads:
//
//   - every counter key handed out, once, linearizably: without reads
//     after the last add, an add that ended info constrains nothing, and a
//     lost add goes unnoticed by the counter checkers. Key i is read
//     through node i mod N, so together the reads cover every node; a
//     read that does not come back ok is tried again through the next
//     node.
//   - every embedding entity from every node, with consistency=local, so
//     the embeddings checker judges each node's own state: a node that
//     lost vectors (say, restored from a snapshot without them) cannot
//     hide behind the others. The nodes are read concurrently; a read
//     that does not come back ok is tried again on the same node.
//
// Each read gets up to 5 ops; an info retires the reading process as
// always. A workload without counters or embeddings reads nothing. The
// error names the keys and entities left without an ok read (the history
// still holds what happened), or reports a recorder failure.
func (w *Workload) FinalReads(ctx context.Context) error {
	names := w.targets.Names()
	if len(names) == 0 {
		return fmt.Errorf("workload: final reads: no nodes to read from")
	}
	var missing []string
	if w.cfg.Kind == Counter || w.cfg.Kind == Mixed {
		proc := w.newProcess()
		for i, key := range w.gen.keys.used() {
			c := counterRead(key)
			if !w.readUntilOK(ctx, &proc, c, func(attempt int) string { return names[(i+attempt)%len(names)] }) {
				missing = append(missing, describeRead(c))
			}
		}
	}
	if w.cfg.Kind == Embeddings || w.cfg.Kind == Mixed {
		entities := w.gen.embeddingEntities()
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, node := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				proc := w.newProcess()
				for _, e := range entities {
					c := embeddingGet(e, true)
					if !w.readUntilOK(ctx, &proc, c, func(int) string { return node }) {
						mu.Lock()
						missing = append(missing, describeRead(c)+" on "+node)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
	}
	w.pick.closeIdle()
	if err := w.rec.Err(); err != nil {
		return fmt.Errorf("workload: final reads: recording the history: %w", err)
	}
	if len(missing) > 0 {
		const most = 20
		more := ""
		if len(missing) > most {
			more = fmt.Sprintf(" and %d more", len(missing)-most)
			missing = missing[:most]
		}
		return fmt.Errorf("workload: final reads: expected an ok read of every key, found none after %d tries for %s%s",
			finalReadOps, strings.Join(missing, ", "), more)
	}
	return nil
}

// readUntilOK performs c by *proc through node(attempt) until it comes
// back ok, at most finalReadOps times; an info moves *proc to a fresh
// process.
func (w *Workload) readUntilOK(ctx context.Context, proc *history.Process, c call, node func(attempt int) string) bool {
	for attempt := 0; attempt < finalReadOps && ctx.Err() == nil; attempt++ {
		switch w.perform(ctx, *proc, node(attempt), c) {
		case history.OK:
			return true
		case history.Info:
			*proc = w.newProcess()
		}
	}
	return false
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
