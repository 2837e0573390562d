package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	dcontainer "github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/container"
	"github.com/tidaldb/tidal/harness/faultfs"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/harness/workload"
	"github.com/tidaldb/tidal/suites/fixture"
)

var _ = Describe("the chaos harness on the container backend", func() {
	It("runs the chaos workload for 60s under partitions, kills and pauses on containers: VALID, every fault took effect, and nothing labelled by the run is left", func(ctx SpecContext) {
		requireDocker()
		dockerChaosRun(ctx, runner.Config{
			Test: "docker-backend", Nodes: 3, Seed: 1313,
			Duration: runner.Duration(60 * time.Second), Nemesis: []string{"partition", "kill", "pause"},
			Interval: runner.Duration(8 * time.Second), FaultDuration: runner.Duration(4 * time.Second),
			Workload: workload.Config{Kind: workload.Ledger, Concurrency: 8},
		})
	}, SpecTimeout(10*time.Minute))

	// Disk and clock faults must run on docker too: faultfs is mounted on
	// the host under each container's bind-mounted node directory, and the
	// clock offset file sits in that directory, so the disk and clock
	// kinds run on containers as on processes. A power cut freezes the
	// container, rolls its disk back to what was fsynced and kills it; the
	// node restarts as a new container on the surviving data.
	It("runs the chaos workload under power-cut-one and clock-skew on containers: VALID, every fault took effect, and nothing labelled by the run is left", func(ctx SpecContext) {
		requireDocker()
		requireFUSE()
		dockerChaosRun(ctx, runner.Config{
			Test: "docker-disk-clock", Nodes: 3, Seed: 1314,
			Duration: runner.Duration(40 * time.Second), Nemesis: []string{"power-cut-one", "clock-skew"},
			Interval: runner.Duration(6 * time.Second), FaultDuration: runner.Duration(3 * time.Second),
			Workload: workload.Config{Kind: workload.Counter, Concurrency: 8},
		})
	}, SpecTimeout(10*time.Minute))
})

// requireFUSE skips the spec, loudly, when faultfs cannot mount here.
func requireFUSE() {
	if err := faultfs.Available(); err != nil {
		fmt.Fprintf(os.Stderr, "*** %s: SKIPPED, disk faults need faultfs: %v\n", CurrentSpecReport().FullText(), err)
		Skip("disk faults need faultfs: " + err.Error())
	}
}

// dockerChaosRun runs cfg on the docker backend and expects it VALID,
// every scheduled fault kind taking effect and healing, and nothing
// labelled by the run left behind.
func dockerChaosRun(ctx SpecContext, cfg runner.Config) {
	root, err := fixture.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	cfg.Backend, cfg.ServerBin, cfg.RelayBinary = runner.BackendDocker, bins.TidalServer, bins.TCPRelay
	cfg.Store = filepath.Join(root, "store", "e2e-chaos")
	cfg.ServerFlags = fixture.FastFlags
	// Whatever happens to the run, nothing of this process's container
	// runs stays (the backend's Close removes them; this catches a
	// run cut short before it could).
	DeferCleanup(func(ctx context.Context) {
		cli, err := container.Connect(ctx)
		if err != nil {
			return
		}
		defer cli.Close()
		for _, run := range ownedRuns(ctx, cli) {
			container.RemoveRun(ctx, cli, run)
		}
	})
	o, err := runner.Run(ctx, cfg, runner.Options{Progress: GinkgoWriter})
	Expect(err).NotTo(HaveOccurred())
	var summary bytes.Buffer
	report.Summary(&summary, o.Results, o.Run)
	GinkgoWriter.Println(summary.String())
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			GinkgoWriter.Printf("run store (history, results, report.html, node logs): %s\n", o.Run.Dir())
			fmt.Fprintf(os.Stderr, "*** %s: FAILED; its run store: %s\n", CurrentSpecReport().FullText(), o.Run.Dir())
		} else {
			os.RemoveAll(filepath.Join(o.Run.Dir(), "nodes"))
		}
	})

	// The nodes ran in containers of this run.
	log, err := os.ReadFile(filepath.Join(o.Run.NodesDir(), "n1", "stdout.log"))
	Expect(err).NotTo(HaveOccurred())
	m := regexp.MustCompile(`start container tidal-([A-Za-z0-9]+)-n1 \(tidal-server:`).FindSubmatch(log)
	Expect(m).NotTo(BeNil(), "n1 did not run in a container of the tidal-server image:\n%s", firstLines(log, 5))
	run := string(m[1])

	for _, r := range o.Results.Results {
		Expect(r.Valid).To(Equal(checker.Valid), "checker %s: %s\n%s", r.Name, r.Summary, summary.String())
	}
	Expect(o.Results.Results).NotTo(BeEmpty())

	// Every kind of fault the schedule asked for happened and healed:
	// a run whose faults never took effect proves nothing.
	var schedule nemesis.Schedule
	Expect(o.Run.ReadSchedule(&schedule)).To(Succeed())
	Expect(schedule.Steps).NotTo(BeEmpty())
	var faults checker.FaultsDetails
	for _, r := range o.Results.Results {
		if r.Name == "faults" {
			faults, _ = r.Details.(checker.FaultsDetails)
		}
	}
	happened := map[string]checker.FaultKindOutcome{}
	for _, k := range faults.Kinds {
		happened[k.Name] = k
	}
	for _, kind := range schedule.Kinds() {
		Expect(happened).To(HaveKey(kind))
		Expect(happened[kind].TookEffect).To(BeNumerically(">=", 1), "%s never took effect: %+v", kind, happened[kind])
		Expect(happened[kind].Healed).To(BeNumerically(">=", 1), "%s never healed: %+v", kind, happened[kind])
	}

	// Nothing of the run is left: no container, network or volume
	// labelled with its id, nor with this process as its owner.
	cli, err := container.Connect(ctx)
	Expect(err).NotTo(HaveOccurred())
	defer cli.Close()
	Expect(labelled(ctx, cli, container.LabelRun+"="+run)).To(BeEmpty(), "left behind by run %s", run)
	Expect(ownedByThisProcess(ctx, cli)).To(BeEmpty(), "left behind by this process's runs")
}

// labelled lists (without removing) what carries label key=value.
func labelled(ctx context.Context, cli interface {
	ContainerList(context.Context, dcontainer.ListOptions) ([]dcontainer.Summary, error)
	NetworkList(context.Context, network.ListOptions) ([]network.Summary, error)
	VolumeList(context.Context, volume.ListOptions) (volume.ListResponse, error)
}, label string) []string {
	f := filters.NewArgs(filters.Arg("label", label))
	var out []string
	cs, err := cli.ContainerList(ctx, dcontainer.ListOptions{All: true, Filters: f})
	Expect(err).NotTo(HaveOccurred())
	for _, c := range cs {
		out = append(out, "container "+strings.Join(c.Names, ","))
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	Expect(err).NotTo(HaveOccurred())
	for _, n := range ns {
		out = append(out, "network "+n.Name)
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	Expect(err).NotTo(HaveOccurred())
	for _, v := range vs.Volumes {
		out = append(out, "volume "+v.Name)
	}
	return out
}

// ownedByThisProcess lists the harness resources whose owner label
// (host/pid/start) names this process.
func ownedByThisProcess(ctx context.Context, cli interface {
	ContainerList(context.Context, dcontainer.ListOptions) ([]dcontainer.Summary, error)
	NetworkList(context.Context, network.ListOptions) ([]network.Summary, error)
	VolumeList(context.Context, volume.ListOptions) (volume.ListResponse, error)
}) []string {
	host, err := os.Hostname()
	Expect(err).NotTo(HaveOccurred())
	prefix := host + "/" + strconv.Itoa(os.Getpid()) + "/"
	f := filters.NewArgs(filters.Arg("label", container.LabelOwner))
	var out []string
	cs, err := cli.ContainerList(ctx, dcontainer.ListOptions{All: true, Filters: f})
	Expect(err).NotTo(HaveOccurred())
	for _, c := range cs {
		if strings.HasPrefix(c.Labels[container.LabelOwner], prefix) {
			out = append(out, "container "+strings.Join(c.Names, ","))
		}
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	Expect(err).NotTo(HaveOccurred())
	for _, n := range ns {
		if strings.HasPrefix(n.Labels[container.LabelOwner], prefix) {
			out = append(out, "network "+n.Name)
		}
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	Expect(err).NotTo(HaveOccurred())
	for _, v := range vs.Volumes {
		if strings.HasPrefix(v.Labels[container.LabelOwner], prefix) {
			out = append(out, "volume "+v.Name)
		}
	}
	return out
}

// ownedRuns lists the run ids of the containers and networks this
// process owns.
func ownedRuns(ctx context.Context, cli interface {
	ContainerList(context.Context, dcontainer.ListOptions) ([]dcontainer.Summary, error)
	NetworkList(context.Context, network.ListOptions) ([]network.Summary, error)
}) []string {
	host, _ := os.Hostname()
	prefix := host + "/" + strconv.Itoa(os.Getpid()) + "/"
	f := filters.NewArgs(filters.Arg("label", container.LabelOwner))
	var labels []map[string]string
	if cs, err := cli.ContainerList(ctx, dcontainer.ListOptions{All: true, Filters: f}); err == nil {
		for _, c := range cs {
			labels = append(labels, c.Labels)
		}
	}
	if ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f}); err == nil {
		for _, n := range ns {
			labels = append(labels, n.Labels)
		}
	}
	seen := map[string]bool{}
	var runs []string
	for _, l := range labels {
		if run := l[container.LabelRun]; strings.HasPrefix(l[container.LabelOwner], prefix) && run != "" && !seen[run] {
			seen[run] = true
			runs = append(runs, run)
		}
	}
	return runs
}

func firstLines(b []byte, n int) string {
	lines := strings.SplitN(string(b), "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
