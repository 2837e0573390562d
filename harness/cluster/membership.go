package cluster

import (
	"context"
	"fmt"
	"time"

	"github.com/tidaldb/tidal/tidal-server/client"
)

// RemoveMember removes the member in slot name through another node,
// then stops the node and wipes it: its id is gone for good.
func (c *Cluster) RemoveMember(ctx context.Context, name string) error {
	c.mu.Lock()
	n, err := c.node(name)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	via, err := c.otherRunning(name)
	if err != nil {
		return err
	}
	// A generous timeout: under load the change can take seconds to
	// commit. "Not a member" means an earlier attempt that timed out on
	// our side did commit: the removal is done.
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	admin := client.New(n.ClientAddr, append(c.clientOptions(RoleAdmin), client.WithRetries(0))...)
	for _, o := range c.Nodes() {
		if o.Name == via {
			admin = client.New(o.ClientAddr, append(c.clientOptions(RoleAdmin), client.WithRetries(2), client.WithTimeout(10*time.Second))...)
		}
	}
	if err := admin.RemoveMember(rctx, n.ID); err != nil && !client.IsNotFound(err) {
		return fmt.Errorf("remove member %d (%s) via %s: %w", n.ID, name, via, err)
	}
	if st := c.State(name); st == Running || st == Paused {
		c.Kill(name)
	}
	c.setState(n, Removed)
	return c.Wipe(name)
}

// AddMember adds slot name back as a brand-new member (new id, empty
// data, --join) and starts it.
func (c *Cluster) AddMember(ctx context.Context, name string) (uint64, error) {
	c.mu.Lock()
	n, err := c.node(name)
	if err == nil && n.state != Removed {
		err = fmt.Errorf("cluster: add %s: slot holds member %d (%s); remove it first", name, n.ID, n.state)
	}
	if err != nil {
		c.mu.Unlock()
		return 0, err
	}
	id := c.nextID
	c.nextID++
	c.mu.Unlock()
	via, err := c.otherRunning(name)
	if err != nil {
		return 0, err
	}
	if _, err := c.AdminClient(via).AddMember(ctx, client.Member{ID: id, PeerAddr: n.PeerAddr, ClientAddr: n.ClientAddr}); err != nil {
		return 0, fmt.Errorf("add member %d (%s) via %s: %w", id, name, via, err)
	}
	c.mu.Lock()
	n.ID = id
	n.joined = true
	n.state = Stopped
	c.mu.Unlock()
	return id, c.Start(name)
}

// otherRunning picks the node to send an admin change through: the
// leader when it is running and not `not` (a learner that has not caught up
// knows no leader and cannot take the change), else any running node.
func (c *Cluster) otherRunning(not string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	leader := c.LeaderName(ctx)
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.Name == leader && n.Name != not && n.state == Running {
			return n.Name, nil
		}
	}
	for _, n := range c.nodes {
		if n.Name != not && n.state == Running {
			return n.Name, nil
		}
	}
	return "", fmt.Errorf("cluster: no running node other than %s", not)
}
