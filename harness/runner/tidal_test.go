package runner

import (
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/nemesis"
)

// The nemesis finds what a cluster can do by asserting on the value it is
// given. tidalCluster used to embed the nemesis.Cluster interface, which
// hid every other method of the cluster: the disk and clock methods were
// forwarded by hand, and ClockBound was not, so a clock fault recorded
// tidal-server's default bound whatever --max-clock-skew the nodes ran
// with. Embedding the concrete nemesis.LiveCluster exposes them all.
func TestTidalClusterExposesTheClusterToTheNemesis(t *testing.T) {
	var c nemesis.Cluster = &tidalCluster{LiveCluster: nemesis.Live(&cluster.Cluster{})}
	if _, ok := c.(nemesis.DiskCluster); !ok {
		t.Error("tidalCluster is not a nemesis.DiskCluster")
	}
	if _, ok := c.(nemesis.ClockSetter); !ok {
		t.Error("tidalCluster is not a nemesis.ClockSetter")
	}
	b, ok := c.(interface{ ClockBound() time.Duration })
	if !ok {
		t.Fatal("tidalCluster hides the cluster's ClockBound from the clock nemesis")
	}
	if got := b.ClockBound(); got != nemesis.DefaultClockBound {
		t.Errorf("ClockBound of a cluster without --max-clock-skew = %v, expected %v", got, nemesis.DefaultClockBound)
	}
}
