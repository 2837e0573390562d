package bugs

import (
	"errors"
	"fmt"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/nemesis"
)

// instantPowerCut makes the nemesis' power cuts instantaneous: it freezes
// every target (SIGSTOP), cuts all their disks at once, and only then has
// the cluster kill them (and cut again, finding nothing unsynced).
//
// Why: the cluster's own power cut kills the nodes one by one first, and
// a process killed while its fsync is inside the FUSE server does not die
// until that fsync is answered (the kernel waits out a request already in
// userspace), so every fsync issued before the cut completes and becomes
// durable. A real power cut stops the CPU and the disk at the same
// instant. ack-before-fsync acknowledges a group before its fdatasync is
// issued; the fsync then runs while the client already has its ack, and
// only a cut inside that fsync can lose it.
type instantPowerCut struct {
	nemesis.DiskCluster
}

// diskCutter is what *faultfs.FS, behind nemesis.Disk, offers.
type diskCutter interface {
	PowerCut(faultfs.PowerCutOptions) (faultfs.PowerCutReport, error)
}

func (c instantPowerCut) PowerCut(names []string, o faultfs.PowerCutOptions) (map[string]faultfs.PowerCutReport, error) {
	cutters := make([]diskCutter, len(names))
	for i, name := range names {
		d, err := c.Disk(name)
		if err != nil {
			return nil, err
		}
		dc, ok := d.(diskCutter)
		if !ok {
			return nil, fmt.Errorf("instant power cut: %s's disk is a %T, expected a faultfs mount", name, d)
		}
		cutters[i] = dc
	}
	var errs []error
	for _, name := range names {
		if err := c.Pause(name); err != nil {
			errs = append(errs, fmt.Errorf("freeze %s: %w", name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("instant power cut: %w", err)
	}
	reports := make([]faultfs.PowerCutReport, len(names))
	cutErrs := make([]error, len(names))
	var wg sync.WaitGroup
	for i := range names {
		wg.Go(func() {
			oi := o
			if oi.TornWrites && oi.Seed != 0 {
				oi.Seed += int64(i)
			}
			reports[i], cutErrs[i] = cutters[i].PowerCut(oi)
		})
	}
	wg.Wait()
	if err := errors.Join(cutErrs...); err != nil {
		return nil, fmt.Errorf("instant power cut: %w", err)
	}
	// The cluster kills the frozen nodes and cuts again: nothing was
	// written since, so that cut undoes nothing.
	if _, err := c.DiskCluster.PowerCut(names, faultfs.PowerCutOptions{}); err != nil {
		return nil, err
	}
	out := map[string]faultfs.PowerCutReport{}
	for i, name := range names {
		out[name] = reports[i]
	}
	return out, nil
}

// instantPowerCuts wraps the nemesis' cluster so that its power cuts are
// instantaneous (instantPowerCut), after applying the other wrappers.
func instantPowerCuts(also ...func(nemesis.Cluster) nemesis.Cluster) func(nemesis.Cluster) nemesis.Cluster {
	return func(c nemesis.Cluster) nemesis.Cluster {
		for _, w := range also {
			c = w(c)
		}
		dc, ok := c.(nemesis.DiskCluster)
		Expect(ok && dc.HasDisks()).To(BeTrue(), "expected the nodes' data dirs on faultfs")
		GinkgoWriter.Println("power cuts freeze every target and cut all their disks at once before the kill")
		return instantPowerCut{dc}
	}
}
