package runbook

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// Scenario is the trouble a runbook is for, injected by the harness before
// the page's first block (a planned operation has none). It acts on one
// follower and returns its slot (Injected); the page must find the node from its
// symptoms, as a person would, not be told.
type Scenario struct {
	Name string
	// Inject makes the trouble happen; leader is the leading slot and
	// members the member slots, sorted.
	Inject func(ctx context.Context, c *LocalCluster, leader string, members []string) (Injected, error)
}

// Injected is what a scenario did: the slot it acted on and, for trouble
// that loses acknowledged writes by its nature (a lost quorum), the loss
// the page may cause, as measured.
type Injected struct {
	Target string
	Loss   *LossBound
}

// followerSlot is the slot of the first member that does not lead.
func followerSlot(c *LocalCluster, leader string, members []string) (Slot, error) {
	for _, m := range members {
		if m != leader {
			return c.Slot(m)
		}
	}
	return Slot{}, fmt.Errorf("runbook: no follower among %v (leader %q)", members, leader)
}

// LoseFollowerDisk kills a follower (SIGKILL, as a machine whose disk died
// goes down) and deletes its data directory.
var LoseFollowerDisk = Scenario{Name: "lose-follower-disk", Inject: func(ctx context.Context, c *LocalCluster, leader string, members []string) (Injected, error) {
	s, err := followerSlot(c, leader, members)
	if err != nil {
		return Injected{}, err
	}
	name := s.Name
	if err := c.Kill(ctx, s); err != nil {
		return Injected{}, err
	}
	return Injected{Target: name}, os.RemoveAll(s.DataDir)
}}

// CorruptFollowerWAL stops a follower cleanly and flips a byte in a record
// in the middle of its newest WAL segment, with good records after it:
// corruption that the node refuses to start on, not a torn tail it would
// truncate. It checks that `wal verify` sees it that way.
var CorruptFollowerWAL = Scenario{Name: "corrupt-follower-wal", Inject: func(ctx context.Context, c *LocalCluster, leader string, members []string) (Injected, error) {
	s, err := followerSlot(c, leader, members)
	if err != nil {
		return Injected{}, err
	}
	name := s.Name
	if err := c.Stop(ctx, s); err != nil {
		return Injected{}, err
	}
	dir := filepath.Join(s.DataDir, "wal")
	if err := corruptMiddleRecord(dir); err != nil {
		return Injected{}, err
	}
	rep, err := wal.Verify(dir)
	if err != nil {
		return Injected{Target: name}, nil // verify reports the damage as an error: as intended
	}
	if rep.Problem == nil || rep.TornTail != nil {
		return Injected{}, fmt.Errorf("runbook: corrupting %s: expected wal verify to report corruption (not a torn tail), found problem %v, torn tail %v", dir, rep.Problem, rep.TornTail)
	}
	return Injected{Target: name}, nil
}}

// corruptMiddleRecord flips one payload byte of the middle record of the
// newest segment in dir (record format: package wal's doc: u32 length,
// u32 crc32c, u8 type, payload).
func corruptMiddleRecord(dir string) error {
	segs, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil {
		return err
	}
	if len(segs) == 0 {
		return fmt.Errorf("runbook: no WAL segment in %s", dir)
	}
	sort.Strings(segs)
	path := segs[len(segs)-1]
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var offsets []int // payload offsets of records after the header
	for off := 0; off+9 <= len(data); {
		n := int(binary.LittleEndian.Uint32(data[off:]))
		if data[off+8] == 0 || off+9+n > len(data) {
			break
		}
		if off > 0 && n > 0 {
			offsets = append(offsets, off+9)
		}
		off += 9 + n
	}
	if len(offsets) < 3 {
		return fmt.Errorf("runbook: %s holds %d records; expected at least 3 to corrupt one in the middle", path, len(offsets))
	}
	at := offsets[len(offsets)/2]
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{data[at] ^ 0xff}, int64(at)); err != nil {
		return err
	}
	return f.Sync()
}

// StallFollower freezes a follower (SIGSTOP: a process stuck in a stall, a
// debugger, a hung disk) and waits until the leader reports it lagging by
// at least 100 entries.
var StallFollower = Scenario{Name: "stall-follower", Inject: func(ctx context.Context, c *LocalCluster, leader string, members []string) (Injected, error) {
	s, err := followerSlot(c, leader, members)
	if err != nil {
		return Injected{}, err
	}
	name := s.Name
	ls, err := c.Slot(leader)
	if err != nil {
		return Injected{}, err
	}
	if err := c.Pause(s); err != nil {
		return Injected{}, err
	}
	lc := c.AdminClient(ls, client.WithRetries(0), client.WithTimeout(2*time.Second))
	defer lc.CloseIdleConnections()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var lag uint64
	for {
		if st, err := lc.Status(wctx); err == nil {
			for _, m := range st.Members {
				if m.PeerAddr == s.PeerAddr {
					lag = m.Lag
				}
			}
			if lag >= 100 {
				return Injected{Target: name}, nil
			}
		}
		select {
		case <-wctx.Done():
			return Injected{}, fmt.Errorf("runbook: stalled %s, but the leader %s reported a lag of %d entries after a minute; expected at least 100 (is the workload writing?)", name, leader, lag)
		case <-time.After(100 * time.Millisecond):
		}
	}
}}
