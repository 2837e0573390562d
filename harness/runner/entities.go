package runner

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// collectEntityCounts reads, from every running node, the applied event
// counts of the ledger's entities (1..entities) and of every entity any
// node's audit names (counter keys), with consistency=local, and stores
// them as entities/<node>.json (checker.EntityCounts). The ledger checker
// audits the applied state with them apart from the id memory the audit
// endpoint reads. A read that fails leaves its entity out: the checker
// then does not vouch for that entity's writes from the counts.
func collectEntityCounts(ctx context.Context, c *cluster.Cluster, alive func(string) bool, run *report.Run, out io.Writer, entities int) {
	audits, err := run.ReadAudits()
	if err != nil {
		fmt.Fprintf(out, "  warning: entity counts: %v\n", err)
		return
	}
	seen := map[uint64]bool{}
	for e := uint64(1); e <= uint64(entities); e++ {
		seen[e] = true
	}
	for _, entries := range audits {
		for _, e := range entries {
			seen[e.Entity] = true
		}
	}
	ids := make([]uint64, 0, len(seen))
	for e := range seen {
		ids = append(ids, e)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })

	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, n := range c.Nodes() {
		if c.State(n.Name) != cluster.Running || !alive(n.Name) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := c.AdminClient(n.Name)
			counts := checker.EntityCounts{}
			failed := 0
			var firstErr error
			for _, e := range ids {
				if ctx.Err() != nil {
					break
				}
				ent, err := cl.Entity(ctx, e, client.Local())
				if err != nil {
					if failed++; firstErr == nil {
						firstErr = err
					}
					continue
				}
				sigs := make(map[string]uint64, len(ent.Signals))
				for s, st := range ent.Signals {
					sigs[s] = st.Count
				}
				counts[e] = sigs
			}
			err := run.WriteEntityCounts(n.Name, counts)
			mu.Lock()
			defer mu.Unlock()
			if failed > 0 {
				fmt.Fprintf(out, "  warning: entity counts of %s: %d of %d reads failed; first: %v\n", n.Name, failed, len(ids), firstErr)
			}
			if err != nil {
				fmt.Fprintf(out, "  warning: entity counts of %s: %v\n", n.Name, err)
			}
		}()
	}
	wg.Wait()
}
