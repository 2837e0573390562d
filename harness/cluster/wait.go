package cluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/tidaldb/tidal/tidal-server/client"
)

// Status asks name for /cluster/status directly.
func (c *Cluster) Status(ctx context.Context, name string) (*client.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.AdminClient(name).Status(ctx)
}

// WaitLeader waits until a majority of running nodes name the same leader
// and returns its slot name.
func (c *Cluster) WaitLeader(ctx context.Context) (string, error) {
	var last string
	for {
		votes := map[uint64]int{}
		run := c.running()
		for _, name := range run {
			st, err := c.Status(ctx, name)
			if err != nil {
				last = fmt.Sprintf("%s: %v", name, err)
				continue
			}
			if st.Leader != 0 {
				votes[st.Leader]++
			}
		}
		for id, v := range votes {
			// The majority must be of the cluster's voters, and the leader
			// must be running: after a kill, survivors keep naming the dead
			// leader until their election timeout.
			if v > len(run)/2 && 2*v > c.voters() {
				if name := c.NameOf(id); name != "" && c.State(name) == Running {
					return name, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no leader agreed by a majority of %v (votes %v; last error %s): %w", run, votes, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitConverged waits until every running node has applied the same index
// and that index is at least the leader's commit when the wait began.
func (c *Cluster) WaitConverged(ctx context.Context) error {
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		return err
	}
	st, err := c.Status(ctx, leader)
	if err != nil {
		return err
	}
	target := st.Commit
	var lastSeen map[string]uint64
	for {
		lastSeen = map[string]uint64{}
		ok := true
		var first uint64
		for i, name := range c.running() {
			s, err := c.Status(ctx, name)
			if err != nil {
				ok = false
				continue
			}
			lastSeen[name] = s.Applied
			if s.Applied < target || (i > 0 && s.Applied != first) {
				ok = false
			}
			if i == 0 {
				first = s.Applied
			}
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nodes did not converge on index >= %d: applied %v: %w", target, lastSeen, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// WaitReady waits until /readyz answers 200 on every running node.
func (c *Cluster) WaitReady(ctx context.Context) error {
	for {
		var notReady []string
		for _, name := range c.running() {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			if err := c.AdminClient(name).Ready(cctx); err != nil {
				notReady = append(notReady, fmt.Sprintf("%s (%v)", name, err))
			}
			cancel()
		}
		if len(notReady) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %s: %w", strings.Join(notReady, "; "), ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
