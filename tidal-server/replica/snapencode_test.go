package replica_test

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// slowEncodeSM is a listSM whose snapshot encoding blocks until the test
// releases it, both through Snapshot and through the encoder that
// CaptureSnapshot returns (the capture itself is quick): a state large
// enough that encoding it takes as long as the test says.
type slowEncodeSM struct {
	*listSM
	encoding chan struct{} // gets a value each time an encoding starts
	release  chan struct{} // closed by the test
}

func (s *slowEncodeSM) block() {
	select {
	case s.encoding <- struct{}{}:
	default:
	}
	<-s.release
}

func (s *slowEncodeSM) Snapshot(w io.Writer) error {
	s.block()
	return s.listSM.Snapshot(w)
}

func (s *slowEncodeSM) CaptureSnapshot() (func(io.Writer) error, error) {
	var state bytes.Buffer
	if err := s.listSM.Snapshot(&state); err != nil {
		return nil, err
	}
	return func(w io.Writer) error {
		s.block()
		_, err := w.Write(state.Bytes())
		return err
	}, nil
}

// Regression: the apply goroutine encoded every periodic
// snapshot itself, so while the state was being encoded — hundreds of
// milliseconds for a few hundred thousand remembered event ids — no entry
// was applied and no write acknowledged: the p99.9 of single-event writes
// at 256 clients was one such stall per run (346–573 ms, max ≈ p99.9).
// Now the apply goroutine only captures the state (SnapshotCapturer) and
// the snapshot goroutine encodes it, so writes go on being acknowledged
// while an encoding is stuck; the snapshot is written once it finishes
// and a restart rebuilds the same state from it.
func TestWritesAcknowledgedWhileSnapshotIsEncoded(t *testing.T) {
	c := newCluster(t, 1, func(cfg *replica.Config) {
		cfg.SnapshotEvery = 10
		cfg.SnapshotCatchUp = 5
	})
	c.waitLeader()
	c.stop(1)
	encoding := make(chan struct{}, 1)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unblock) // before the cluster's cleanup stops the node
	nd := c.startWith(1, false, func(cfg *replica.Config) {
		cfg.StateMachine = &slowEncodeSM{listSM: cfg.StateMachine.(*listSM), encoding: encoding, release: release}
	})
	c.waitLeader()

	started := false
	for i := range 40 { // a snapshot is due after 10 entries
		if _, err := c.propose(1, fmt.Sprintf("w%02d", i), 10*time.Second); err != nil {
			t.Fatalf("write %d (snapshot encoding started: %v) not acknowledged: %v: the apply goroutine waits for the snapshot's encoding", i, started || len(encoding) > 0, err)
		}
		started = started || len(encoding) > 0
	}
	if !started && len(encoding) == 0 {
		t.Fatal("40 writes with SnapshotEvery=10 and no snapshot encoding started")
	}
	if n := len(snapFiles(t, nd.dir)); n != 0 {
		t.Fatalf("%d snapshot files while the only encoding is still blocked", n)
	}
	unblock()
	waitFor(t, 30*time.Second, "the snapshot to be written once its encoding finishes", func() (bool, string) {
		n := len(snapFiles(t, nd.dir))
		return n > 0, fmt.Sprintf("%d snapshot files", n)
	})
	c.mustPropose(1, "after")
	before := nd.sm.state()
	c.stop(1)
	nd = c.start(1, false)
	waitFor(t, 30*time.Second, "node 1 to rebuild its state after a restart", func() (bool, string) {
		s := nd.sm.state()
		return s.Applied >= before.Applied, fmt.Sprintf("applied %d of %d", s.Applied, before.Applied)
	})
	if got := nd.sm.state(); got.Digest != before.Digest || !equalEntries(got.Entries, before.Entries) {
		t.Fatalf("restarted from the snapshot: digest %.8s (%d entries), before the stop %.8s (%d entries)", got.Digest, len(got.Entries), before.Digest, len(before.Entries))
	}
	if restores, _ := nd.sm.counts(); restores != 1 {
		t.Errorf("state machine restored %d times on restart, expected 1 (from the snapshot)", restores)
	}
}

// snapshotIndexes reads each node's periodic snapshot indexes from the
// replicas' logs ("snapshot taken" lines carry node and index).
func snapshotIndexes(t *testing.T, logs string) map[uint64][]uint64 {
	t.Helper()
	out := map[uint64][]uint64{}
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `msg="snapshot taken"`) {
			continue
		}
		var node, index uint64
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "node="); ok {
				node, _ = strconv.ParseUint(v, 10, 64)
			}
			if v, ok := strings.CutPrefix(f, "index="); ok {
				index, _ = strconv.ParseUint(v, 10, 64)
			}
		}
		if node == 0 || index == 0 {
			t.Fatalf("a snapshot log line without node or index: %s", line)
		}
		out[node] = append(out[node], index)
	}
	return out
}

// Members that apply the same log all snapshotted at the same index, so
// all three encoded at once (it showed in p99.9 at 64 clients). Staggered,
// no two members snapshot at the same index. (Unstaggered, the replica's
// default, this fails: every member snapshots at 40, 80 and 120.)
func TestStaggeredMembersSnapshotAtDifferentIndexes(t *testing.T) {
	c := newCluster(t, 3, func(cfg *replica.Config) {
		cfg.SnapshotEvery = 40
		cfg.StaggerSnapshots = true
	})
	c.waitLeader()
	for i := range 130 {
		c.mustPropose(uint64(i%3)+1, fmt.Sprintf("w%03d", i))
	}
	c.waitConverged()
	taken := snapshotIndexes(t, c.logs.String())
	owner := map[uint64]uint64{}
	for node := uint64(1); node <= 3; node++ {
		if len(taken[node]) < 2 {
			t.Fatalf("node %d took snapshots at %v after 130 writes with SnapshotEvery 40; expected at least 2", node, taken[node])
		}
		for _, idx := range taken[node] {
			if other, ok := owner[idx]; ok && other != node {
				t.Fatalf("nodes %d and %d both snapshotted at index %d: %v", other, node, idx, taken)
			}
			owner[idx] = node
		}
	}
}

// A MsgSnap is marshalled (a copy of the whole snapshot: 131 MB
// for 20,000 vectors of 1536) and handed to the transport off the Ready
// loop, so however long that takes, the leader keeps ticking,
// heartbeating and committing. Here the transport holds every MsgSnap
// Send until the test releases it; a sender that did that work on the
// Ready loop would commit nothing meanwhile.
func TestSnapshotSendDoesNotHoldTheReadyLoop(t *testing.T) {
	c := newCluster(t, 3, func(cfg *replica.Config) {
		cfg.SnapshotEvery = 20
		cfg.SnapshotCatchUp = 5
	})
	lead := c.waitLeader()
	down := uint64(1)
	if lead == down {
		down = 2
	}
	c.mustPropose(lead, "first")
	c.waitConverged()
	c.stop(down)
	for i := range 60 {
		c.mustPropose(lead, fmt.Sprintf("missed-%03d", i))
	}
	lead = c.waitLeader(c.running()...)

	release := c.net.holdSnapshotSends()
	t.Cleanup(release)
	nd := c.start(down, false)
	waitFor(t, 30*time.Second, "the leader to send the restarted node a snapshot", func() (bool, string) {
		n := c.net.snapHeld.Load()
		return n > 0, fmt.Sprintf("%d snapshot sends held", n)
	})
	for i := range 10 {
		if _, err := c.proposeRetrying(lead, fmt.Sprintf("during-%d", i), 30*time.Second); err != nil {
			t.Fatalf("write %d on leader %d while its snapshot send is held: %v; expected it committed by the other follower", i, lead, err)
		}
	}
	release()
	c.waitConverged()
	if _, ok := nd.sm.has("during-9"); !ok {
		t.Fatalf("node %d converged without the writes made while its snapshot was held", down)
	}
}
