package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
)

// Disk faults: the nodes' data dirs are faultfs mounts, and
// the nemesis cuts power under them or fails their disks. Every spec
// needs FUSE (/dev/fuse, root or fusermount3); CI has it.

func requireFaultFS() {
	if err := nemesis.DiskSupport(); err != nil {
		Skip("disk faults need faultfs: " + err.Error())
	}
}

// expectDiskRunClean checks what every disk run must leave: no faultfs
// mount under its store (every one was unmounted, though the run killed
// nodes holding files on them), and each node's faultfs counters.
func expectDiskRunClean(o *runner.Outcome) {
	mounts, err := faultfs.Mounts(o.Run.Dir())
	Expect(err).NotTo(HaveOccurred())
	Expect(mounts).To(BeEmpty(), "faultfs mounts left behind")
	for _, n := range []string{"n1", "n2", "n3"} {
		_, err := os.Stat(filepath.Join(o.Run.NodesDir(), n, "faultfs.json"))
		Expect(err).NotTo(HaveOccurred(), "%s: expected its faultfs counters in the store", n)
	}
}

// powerCutReports returns, per power cut that took effect, what each
// node's disk lost, from the history.
func powerCutReports(o *runner.Outcome) []map[string]faultfs.PowerCutReport {
	ops, err := o.Run.ReadHistory()
	Expect(err).NotTo(HaveOccurred())
	var out []map[string]faultfs.PowerCutReport
	for _, op := range ops {
		if op.Process != history.Nemesis || op.F != history.FPowerCut || op.Type != history.OK {
			continue
		}
		v, err := history.Decode[history.FaultValue](op)
		Expect(err).NotTo(HaveOccurred())
		var p struct {
			Reports map[string]faultfs.PowerCutReport `json:"reports"`
		}
		Expect(json.Unmarshal(v.Params, &p)).To(Succeed())
		Expect(p.Reports).To(HaveLen(len(v.Targets)), "a report per node cut: %s", v.Params)
		out = append(out, p.Reports)
	}
	return out
}

// diskHealParams returns, per disk fault of kind healed, what the heal
// recorded: the ranges picked and each target's effect.
func diskHealParams(o *runner.Outcome, kind string) []nemesisDiskParams {
	ops, err := o.Run.ReadHistory()
	Expect(err).NotTo(HaveOccurred())
	var out []nemesisDiskParams
	for _, op := range ops {
		if op.Process != history.Nemesis || op.F != history.HealOf(history.FDisk) || op.Type != history.OK {
			continue
		}
		v, err := history.Decode[history.FaultValue](op)
		Expect(err).NotTo(HaveOccurred())
		if v.Kind != kind {
			continue
		}
		var p nemesisDiskParams
		Expect(json.Unmarshal(v.Params, &p)).To(Succeed())
		out = append(out, p)
	}
	return out
}

// nemesisDiskParams is the part of a disk fault's recorded params these
// specs read.
type nemesisDiskParams struct {
	Picked map[string]nemesis.PickedRange `json:"picked"`
	Effect map[string]faultfs.FaultStats  `json:"effect"`
}

// expectDiskFaultBit checks that the disk faults of kind did what they
// are for at least once in the run: disk-full
// returned ENOSPC, slow-disk-stall held operations, corrupt-read flipped
// bytes the node read back (from a range the nemesis picked and
// recorded); the fencing checker judged them (it is in expectValid).
func expectDiskFaultBit(o *runner.Outcome, kind string) {
	var field func(faultfs.FaultStats) uint64
	switch kind {
	case "disk-full":
		field = func(s faultfs.FaultStats) uint64 { return s.ENOSPC }
	case "slow-disk-stall":
		field = func(s faultfs.FaultStats) uint64 { return s.Stalled }
	case "corrupt-read":
		field = func(s faultfs.FaultStats) uint64 { return s.CorruptReads }
	default:
		return
	}
	heals := diskHealParams(o, kind)
	Expect(heals).NotTo(BeEmpty(), "no %s heal recorded its effect", kind)
	var total uint64
	for _, h := range heals {
		for _, e := range h.Effect {
			total += field(e)
		}
		if kind == "corrupt-read" {
			Expect(h.Picked).NotTo(BeEmpty(), "corrupt-read recorded no picked range")
		}
	}
	GinkgoWriter.Printf("%s: %d heals, effect counted %d\n", kind, len(heals), total)
	Expect(total).To(BeNumerically(">", 0), "%s never bit: %+v", kind, heals)
	if kind != "corrupt-read" {
		Expect(resultNamed(o, "fencing").Valid).To(Equal(checker.Valid))
	}
	if kind == "slow-disk-stall" {
		expectQuorumCarriedOn(o, kind)
	}
}

// expectQuorumCarriedOn checks that while a node's disk was stalled the
// other nodes went on acknowledging writes: the stall took one node out,
// not the cluster (its own silence is the fencing checker's rule, its
// catch-up convergence's).
func expectQuorumCarriedOn(o *runner.Outcome, kind string) {
	ops, err := o.Run.ReadHistory()
	Expect(err).NotTo(HaveOccurred())
	windows, err := checker.FaultWindows(ops)
	Expect(err).NotTo(HaveOccurred())
	pairs, err := history.Pairs(ops)
	Expect(err).NotTo(HaveOccurred())
	judged := 0
	for _, w := range windows {
		if w.F != history.FDisk || w.Kind != kind || !w.Healed || w.Effective < 0 {
			continue
		}
		judged++
		acked := 0
		for _, p := range pairs {
			op := p.Invoke
			if !op.Process.IsClient() || op.F != history.FWrite || slices.Contains(w.Targets, op.Node) {
				continue
			}
			if op.Time > w.Effective && !p.Pending && p.Type() == history.OK && p.Completion.Time < w.End {
				acked++
			}
		}
		GinkgoWriter.Printf("%s: %d writes acked by the other nodes while %v stalled\n", w, acked, w.Targets)
		Expect(acked).To(BeNumerically(">", 0), "%s: no write acknowledged by the other nodes while %v stalled", w, w.Targets)
	}
	Expect(judged).To(BeNumerically(">", 0), "no healed %s window", kind)
}

type diskScenario struct {
	kind  string
	nodes int
	seed  int64
	mix   []string
}

var diskScenarios = []diskScenario{
	{"power-cut-one", 3, 1101, []string{"power-cut-one"}},
	{"power-cut-minority", 3, 1102, []string{"power-cut-minority"}},
	{"power-cut-all", 3, 1103, []string{"power-cut-all"}},
	{"fsync-error", 3, 1104, []string{"fsync-error"}},
	{"disk-full", 3, 1105, []string{"disk-full"}},
	{"slow-disk", 3, 1106, []string{"slow-disk"}},
	{"corrupt-read", 3, 1107, []string{"corrupt-read"}},
	{"slow-disk-stall", 3, 1108, []string{"slow-disk-stall"}},
	{"power-cut-all-and-partitions", 5, 1130, []string{"power-cut-all", "partition"}},
}

var _ = Describe("disk faults through faultfs: no acknowledged write is lost, a failing disk fences its node", Label("faultfs"), func() {
	BeforeEach(requireFaultFS)

	for _, sc := range diskScenarios {
		It(fmt.Sprintf("%s: %v on %d nodes", sc.kind, sc.mix, sc.nodes), func(ctx SpecContext) {
			o, s := chaosRun(ctx, runner.Config{Test: "disk-" + sc.kind, Nodes: sc.nodes, Seed: sc.seed, Nemesis: sc.mix,
				Interval: runner.Duration(6 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
				Duration: runner.Duration(25 * time.Second), Workload: workload.Config{Kind: workload.Ledger, Concurrency: 12}})
			expectValid(o, s)
			expectFaultsHappened(o)
			expectDiskRunClean(o)
			// The seed must schedule the disk kind at all (a mix with
			// groups draws among many kinds).
			var schedule nemesis.Schedule
			Expect(o.Run.ReadSchedule(&schedule)).To(Succeed())
			Expect(schedule.Kinds()).To(ContainElement(sc.mix[0]), "seed %d scheduled no %s", sc.seed, sc.mix[0])
			if sc.mix[0] == "power-cut-all" {
				Expect(powerCutReports(o)).NotTo(BeEmpty())
			}
			expectDiskFaultBit(o, sc.kind)
		}, SpecTimeout(5*time.Minute))
	}

	It("smoke: power-cut-all on 3 nodes: every acknowledged write survives, every node comes back, no mount is left", Label("smoke"), func(ctx SpecContext) {
		o, s := chaosRun(ctx, runner.Config{Test: "smoke-power-cut", Nodes: 3, Seed: 1109, Nemesis: []string{"power-cut-all"},
			Interval: runner.Duration(4 * time.Second), FaultDuration: runner.Duration(2 * time.Second),
			Duration: runner.Duration(10 * time.Second), Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8}})
		expectValid(o, s)
		expectFaultsHappened(o)
		expectDiskRunClean(o)
		cuts := powerCutReports(o)
		Expect(cuts).NotTo(BeEmpty())
		Expect(cuts[0]).To(HaveKey("n1"))
		// The nodes checker saw the cut's kills as the harness's, and the
		// ledger checker every acknowledged id on every node.
		d, ok := resultNamed(o, "nodes").Details.(checker.NodesDetails)
		Expect(ok).To(BeTrue())
		Expect(d.Expected).To(BeNumerically(">=", 3))
		Expect(resultNamed(o, "ledger").Valid).To(Equal(checker.Valid))
	}, SpecTimeout(3*time.Minute))
})

// corrupt-read inside snapshot payloads: the same
// corrupt-read run with snapshots every 1000 entries and every fault's
// pick forced to the newest snapshot (a WAL record when there is none
// yet): the node restarted on it refuses it, naming the file and offset,
// and the run stays valid.
var _ = Describe("corrupt-read of snapshot payloads", Label("faultfs"), func() {
	BeforeEach(requireFaultFS)

	It("corrupt-read: snapshot picks on 3 nodes: the node refuses the snapshot, never serves it", func(ctx SpecContext) {
		const seed = 1117
		cfg := runner.Config{Test: "disk-corrupt-read-snapshot", Nodes: 3, Seed: seed, Nemesis: []string{"corrupt-read"},
			Interval: runner.Duration(6 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
			Duration: runner.Duration(25 * time.Second), Workload: workload.Config{Kind: workload.Ledger, Concurrency: 12},
			ServerFlags: []string{"--snapshot-every=1000", "--snapshot-catch-up=500"}}
		schedule, err := nemesis.Generate(seed, nemesis.ScheduleConfig{Duration: time.Duration(cfg.Duration), Interval: time.Duration(cfg.Interval),
			FaultDuration: time.Duration(cfg.FaultDuration), Mix: cfg.Nemesis, Nodes: []string{"n1", "n2", "n3"}})
		Expect(err).NotTo(HaveOccurred())
		Expect(schedule.Steps).NotTo(BeEmpty())
		for i := range schedule.Steps {
			schedule.Steps[i].Disk.Corrupt = &nemesis.CorruptPick{Where: nemesis.CorruptSnapshot, Seed: int64(i + 1)}
		}
		o, s := chaosRun(ctx, cfg, func(opts *runner.Options) { opts.Schedule = &schedule })
		expectValid(o, s)
		expectFaultsHappened(o)
		expectDiskRunClean(o)
		expectDiskFaultBit(o, "corrupt-read")
		snapshots := 0
		for _, h := range diskHealParams(o, "corrupt-read") {
			for node, p := range h.Picked {
				GinkgoWriter.Printf("%s: %s\n", node, p.What)
				if strings.HasPrefix(p.Path, "snap/") {
					snapshots++
				}
			}
		}
		Expect(snapshots).To(BeNumerically(">", 0), "no fault found a snapshot to corrupt")
		Expect(resultNamed(o, "fencing").Summary).To(ContainSubstring("refused a corrupt log, naming file and offset"))
	}, SpecTimeout(5*time.Minute))
})
