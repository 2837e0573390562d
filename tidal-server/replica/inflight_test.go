package replica_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// Regression: a rejoining follower's whole replication window in one pass.
// A follower that comes back far behind was sent, as soon as it first
// acknowledged, every append the window allowed — MaxInflightMsgs (256) of
// MaxSizePerMsg each — all marshalled and queued on the leader's Ready loop
// at once (hundreds of MB in a chaos run, while the leader's other follower
// went without heartbeats until it called an election). The entry bytes in
// flight to one follower must stay within MaxInflightBytes (by default 32
// MaxSizePerMsg), give or take the probes: until the follower's first
// answer, raft resends one append per heartbeat answer, outside the
// window; heartbeats every 50 ms leave room for 16 of them (800 ms). The
// follower falls behind by 240 appends of MaxSizePerMsg (64 KiB here) while
// it keeps hearing heartbeats; then appends reach it again, each 50 ms
// late, and the network counts the append bytes it holds for that link at
// any moment.
func TestLeaderBoundsAppendBytesInFlightToARejoiningFollower(t *testing.T) {
	const msgSize = 64 << 10
	c := newCluster(t, 3, func(cfg *replica.Config) {
		cfg.MaxSizePerMsg = msgSize
		cfg.HeartbeatTicks, cfg.ElectionTicks = 5, 30
	})
	leader := c.waitLeader()
	follower := uint64(1)
	for follower == leader {
		follower++
	}
	c.net.setFaults(leader, follower, linkFaults{dropAppends: true})
	body := strings.Repeat("x", msgSize-16)
	const appends = 240
	for i := range appends {
		c.mustPropose(leader, fmt.Sprintf("%04d%s", i, body))
	}
	c.net.watchAppends(leader, follower)
	c.net.setFaults(leader, follower, linkFaults{delay: 50 * time.Millisecond})
	c.waitConverged()

	// 32 MaxSizePerMsg of window, 16 probes, and the few bytes per entry
	// that marshalling adds.
	limit := int64(48 * msgSize)
	if got := c.net.appendBytesInFlightMax(); got > limit {
		t.Fatalf("the network held %d bytes of appends to rejoining follower %d at once (%d appends of ~%d behind); expected at most %d (MaxInflightBytes, 32 × MaxSizePerMsg, and 16 probes)",
			got, follower, appends, msgSize, limit)
	}
	t.Logf("at most %d bytes of appends in flight to follower %d (limit %d)", c.net.appendBytesInFlightMax(), follower, limit)
	if got := c.net.appendBytesInFlightMax(); got == 0 {
		t.Fatalf("no append to follower %d counted in flight; expected the catch-up", follower)
	}
}
