package replica_test

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// proposalIDs reads node origin's request ids out of the proposals in the
// WAL of a stopped node, in log order. The framing is the one
// docs/ARCHITECTURE.md documents: u8 version(1) | u64 origin | u64 request
// id | command.
func proposalIDs(t *testing.T, dir string, origin uint64) (ids []uint64, payloads []string) {
	t.Helper()
	w, rec, err := wal.Open(filepath.Join(dir, "wal"), wal.Options{})
	if err != nil {
		t.Fatalf("open WAL of %s: %v", dir, err)
	}
	defer w.Close()
	for _, e := range rec.Entries {
		d := e.Data
		if e.Type != 0 || len(d) < 17 || d[0] != 1 || binary.BigEndian.Uint64(d[1:9]) != origin {
			continue
		}
		ids = append(ids, binary.BigEndian.Uint64(d[9:17]))
		payloads = append(payloads, string(d[17:]))
	}
	return ids, payloads
}

// Regression: request ids were a counter seeded from the
// wall clock at start. A clock stepped back across a restart let a new
// proposal take the id of an old one still in the log, and applying the old
// entry would then wake the new waiter: a false ack. Ids must grow across
// restarts whatever the clock says.
func TestRequestIDsGrowAcrossRestartsWhenClockStepsBack(t *testing.T) {
	at := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	replica.SetWallClock(t, func() time.Time { return at })
	c := newCluster(t, 1, nil)
	c.waitLeader(1)
	for i := 0; i < 5; i++ {
		c.mustPropose(1, fmt.Sprintf("first-%d", i))
	}
	c.stop(1)
	firstIDs, _ := proposalIDs(t, c.nodes[1].dir, 1)
	if len(firstIDs) != 5 {
		t.Fatalf("found %d proposals of node 1 in its WAL after 5 writes", len(firstIDs))
	}

	// The clock steps back to the instant the first incarnation started
	// (an NTP correction, a VM restored from an image).
	replica.SetWallClock(t, func() time.Time { return at.Add(-time.Second) })
	c.start(1, false)
	c.waitLeader(1)
	for i := 0; i < 5; i++ {
		c.mustPropose(1, fmt.Sprintf("second-%d", i))
	}
	c.stop(1)
	ids, payloads := proposalIDs(t, c.nodes[1].dir, 1)
	if len(ids) != 10 {
		t.Fatalf("found %d proposals of node 1 in its WAL after 10 writes: %v", len(ids), payloads)
	}
	seen := map[uint64]string{}
	for i, id := range ids {
		if prev, ok := seen[id]; ok {
			t.Errorf("request id %d used by %q and again by %q: an apply of the first would wake the waiter of the second", id, prev, payloads[i])
		}
		seen[id] = payloads[i]
		if i > 0 && id <= ids[i-1] {
			t.Errorf("request id of %q is %d, not above the %d of %q before it in the log", payloads[i], id, ids[i-1], payloads[i-1])
		}
	}
}
