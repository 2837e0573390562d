package container

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/suites/fixture"
	tclient "github.com/tidaldb/tidal/tidal-server/client"
)

// newFaultCluster starts three nodes of a docker backend behind the relay
// container, with cfg's fault controls on.
func newFaultCluster(t *testing.T, cfg cluster.Config) *cluster.Cluster {
	t.Helper()
	b := newBackend(t, true)
	dir := t.TempDir()
	cfg.Nodes, cfg.Backend, cfg.Dir = 3, b, dir
	cfg.NewNetwork = b.RelayMesh(filepath.Join(dir, "tcp-relay"))
	cfg.Flags = fixture.FastFlags
	c, err := cluster.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// Clock faults on the docker backend ("no clock faults on
// docker"): the harness moves a container node's clock by rewriting the
// offset file in the node's bind-mounted directory on the host, exactly
// as for a process. Shifted beyond --max-clock-skew, the node reports the
// offset in /metrics and refuses writes (503, its clock out of bounds);
// moved back, it takes writes again.
func TestClockSkewOnContainer(t *testing.T) {
	c := newFaultCluster(t, cluster.Config{ClockControl: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	victim := "n2"
	write := func(id string) error {
		_, err := c.Client(victim, tclient.WithRetries(0)).WriteSignals(ctx, []tclient.Event{{ID: id, Entity: 1, Signal: "view"}})
		return err
	}
	waitFor(t, "a write through "+victim+" before the skew", func() error { return write("before") })

	skew := 3 * c.ClockBound()
	if _, err := c.SetClockOffset(ctx, victim, skew); err != nil {
		t.Fatal(err)
	}
	if got, err := c.ClockOffset(ctx, victim); err != nil || got != skew {
		t.Fatalf("/metrics of %s: expected the offset %v in effect, found %v (%v)", victim, skew, got, err)
	}
	i := 0
	waitFor(t, victim+" refusing writes while its clock is "+skew.String()+" off", func() error {
		i++
		err := write(fmt.Sprintf("skewed-%d", i))
		var ae *tclient.APIError
		if errors.As(err, &ae) && ae.Status == 503 && strings.Contains(ae.Message, "clock is out of bounds") {
			return nil
		}
		return fmt.Errorf("expected 503 naming the clock, found %v", err)
	})

	if _, err := c.SetClockOffset(ctx, victim, 0); err != nil {
		t.Fatal(err)
	}
	waitFor(t, victim+" taking writes again after its clock is healed", func() error { return write("after") })
	if got, err := c.ClockOffset(ctx, victim); err != nil || got != 0 {
		t.Errorf("/metrics of %s after the heal: expected offset 0, found %v (%v)", victim, got, err)
	}
}

// Disk faults on the docker backend ("no disk faults on
// docker"): faultfs is mounted on the host over each node's data dir
// before its container exists, and the container writes through it (the
// bind mount of the node directory carries the FUSE mount; the mount
// allows the container's other uid). A power cut of one node freezes its
// container, rolls its disk back to what was fsynced and kills it; started
// again on the surviving data, as a new container that sees the fresh
// mount, it catches up, and every acknowledged write is on every node.
func TestPowerCutOnContainer(t *testing.T) {
	c := newFaultCluster(t, cluster.Config{DiskFaults: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var acked []string
	write := func(via, id string) {
		t.Helper()
		if _, err := c.Client(via, tclient.WithRetries(5)).WriteSignals(ctx, []tclient.Event{{ID: id, Entity: 1, Signal: "view"}}); err != nil {
			t.Fatalf("write %s via %s: %v", id, via, err)
		}
		acked = append(acked, id)
	}
	for i, n := range c.Names() {
		write(n, fmt.Sprintf("before-%d", i))
	}
	victim := "n2"
	disk, err := c.Disk(victim)
	if err != nil {
		t.Fatal(err)
	}
	if st := disk.Stats(); st.Ops["fsync"]+st.Ops["fdatasync"] == 0 || st.BytesWritten == 0 {
		t.Fatalf("%s: expected the container's writes and syncs to go through faultfs, found %+v", victim, st)
	}
	reps, err := c.PowerCut([]string{victim}, faultfs.PowerCutOptions{TornWrites: true, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("power cut of %s: %+v", victim, reps[victim])
	if c.State(victim) != cluster.Killed {
		t.Fatalf("%s after the power cut: expected Killed, found %s", victim, c.State(victim))
	}
	write("n1", "during")
	if err := c.Start(victim); err != nil {
		t.Fatal(err)
	}
	write(victim, "after")
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Names() {
		for _, id := range acked {
			if _, err := c.AdminClient(n).EventLocation(ctx, id); err != nil {
				t.Errorf("%s: expected acked write %s after the power cut: %v", n, id, err)
			}
		}
	}
}
