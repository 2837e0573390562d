package etcd

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/db"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/process"
)

func startTestCluster(t *testing.T) *Cluster {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Skip("etcd is not installed (apt-get install etcd-server)")
	}
	d, err := New(Config{Workload: Append})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	reg, err := process.NewRegistry(filepath.Join(dir, "pids"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := d.Setup(ctx, db.Env{Nodes: 3, RunDir: dir, NodesDir: filepath.Join(dir, "nodes"), Registry: reg,
		Wrap: func(b cluster.Backend) cluster.Backend { return b }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*Cluster)
}

// Regression (found by the campaign): a member add whose answer
// was lost (a timeout under a partition) had committed; the harness kept
// the slot "removed" and retried the add, which etcd refused for as long
// as the added member never started (too few started members for the
// larger quorum), so the heal never finished and a partition could leave
// the cluster without a quorum. AddMember must find the member already
// added and start the slot as it.
func TestAddMemberAdoptsAnAddWhoseAnswerWasLost(t *testing.T) {
	c := startTestCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Right after start-up etcd's strict reconfiguration check may refuse
	// ("unhealthy cluster": peers not yet connected for long): retry.
	for {
		err := c.RemoveMember(ctx, "n2")
		if err == nil {
			break
		}
		if !nemesis.IsNotApplied(err) || ctx.Err() != nil {
			t.Fatalf("remove n2: %v", err)
		}
		time.Sleep(time.Second)
	}
	// The add the harness never heard back from.
	n2, _ := c.node("n2")
	via, err := c.via(ctx, "n2")
	if err != nil {
		t.Fatal(err)
	}
	// Its answer may be lost here too (a timeout under load), or etcd may
	// refuse it for a while (its strict reconfiguration check right after
	// the remove): what matters is that the membership comes to hold it,
	// so the add is repeated, each attempt bounded, until it does. A
	// repeat of an add that did commit is refused (the URL exists) and
	// changes nothing.
	var lost member
	var lastAdd error
	for {
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		_, lastAdd = via.control.addMember(actx, n2.peerURL)
		acancel()
		m, found, err := c.memberByURL(ctx, n2.peerURL)
		if err == nil && found {
			lost = m
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the add behind the harness's back never showed in the membership: %v (last add: %v)", err, lastAdd)
		}
		time.Sleep(time.Second)
	}
	id, err := c.AddMember(ctx, "n2")
	if err != nil {
		t.Fatalf("expected AddMember to adopt member %x, found %v", uint64(lost.ID), err)
	}
	if id != uint64(lost.ID) {
		t.Fatalf("expected the slot to take member %x, found %x", uint64(lost.ID), id)
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatalf("expected n2 to catch up as the adopted member: %v", err)
	}
	if err := c.Serving(ctx, "n2"); err != nil {
		t.Fatalf("n2: %v", err)
	}
}

// The etcd adapter takes disk faults (faultfs under its data dirs) and
// refuses clock faults, saying why.
func TestEtcdCapabilities(t *testing.T) {
	caps := (&DB{}).Capabilities()
	if err := nemesis.CheckMix([]string{"power-cut-one", "power-cut-all", "fsync-error", "disk-full", "slow-disk", "pause-leader-burst"}, caps); err != nil {
		t.Fatal(err)
	}
	err := nemesis.CheckMix([]string{"clock-skew"}, caps)
	if err == nil || !strings.Contains(err.Error(), "vDSO") {
		t.Fatalf("expected clock-skew refused with the reason, found %v", err)
	}
}
