package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.yaml.in/yaml/v3"

	"github.com/tidaldb/tidal/deploy"
	"github.com/tidaldb/tidal/harness/container"
	"github.com/tidaldb/tidal/harness/workload"
)

// progressed waits until the workload has had n more ok ops than when it
// was called: the cluster is taking writes again.
func (r *recording) progressed(ctx context.Context, n int64, what string) {
	GinkgoHelper()
	from := r.w.Progress().Total().OK
	Eventually(ctx, func() int64 { return r.w.Progress().Total().OK - from }).
		WithTimeout(2*time.Minute).WithPolling(100*time.Millisecond).
		Should(BeNumerically(">=", n), "%s: ok ops did not grow by %d (progress %s)", what, n, r.w.Progress())
}

// others lists the services but not.
func (d *deployment) others(not string) []string {
	var out []string
	for _, n := range d.names {
		if n != not {
			out = append(out, n)
		}
	}
	return out
}

var _ = Describe("a node's data lives in its volume", func() {
	It("a node whose process dies is restarted by its restart policy with its volume and keeps every acknowledged write; one whose volume is deleted is replaced by the runbook path under a new member id", func(ctx SpecContext) {
		d := deployCompose(ctx, "compose-volumes")
		r := d.record(workload.Config{Kind: workload.Ledger, Concurrency: 6, Seed: 31})
		r.progressed(ctx, 100, "before any fault")

		By("a crash of the leader's process: the restart policy brings the container back with its volume")
		leader, _ := d.waitLeader(ctx, d.names)
		restarts := d.crash(ctx, leader)
		Eventually(ctx, func() int { return d.inspect(ctx, leader).RestartCount }).WithTimeout(time.Minute).
			Should(BeNumerically(">", restarts), "%s was not restarted by its restart policy (unless-stopped)", leader)
		d.waitHealthy(ctx, d.names...)
		r.progressed(ctx, 100, "after the crash")

		By("docker-compose restart of a follower (SIGTERM, drained, same volume)")
		leader, _ = d.waitLeader(ctx, d.names)
		follower := d.others(leader)[0]
		d.mustCompose(ctx, "restart", "-t", "15", follower)
		d.waitHealthy(ctx, d.names...)
		r.progressed(ctx, 100, "after the restart")

		By("a deleted volume: the node is replaced as runbooks/replace-lost-disk.md says")
		leader, _ = d.waitLeader(ctx, d.names)
		victim := d.others(leader)[1]
		d.replaceLostVolume(ctx, victim, leader)
		r.progressed(ctx, 100, "after the replacement")

		r.Stop()
		r.check(ctx)
	}, SpecTimeout(10*time.Minute))
})

// replaceLostVolume deletes victim's container and volume and brings it
// back the way runbooks/replace-lost-disk.md does, in compose terms: keep
// the old process down, remove its member, add a new member id, and start
// the service empty with --join under that id, a node certificate naming
// it, and the same published address (an override file, as an operator
// would write one).
func (d *deployment) replaceLostVolume(ctx context.Context, victim, via string) {
	GinkgoHelper()
	oldID := d.ids[victim]
	var newID uint64
	for _, id := range d.ids {
		newID = max(newID, id)
	}
	newID++

	d.mustCompose(ctx, "stop", "-t", "15", victim)
	d.mustCompose(ctx, "rm", "-f", victim)
	vol := d.project + "_" + victim + "-data"
	Expect(d.docker.VolumeRemove(ctx, vol, false)).To(Succeed(), "docker volume rm %s", vol)

	_, err := d.cli(ctx, "members", "remove", strconv.FormatUint(oldID, 10), "--addr", d.addrs[via])
	Expect(err).NotTo(HaveOccurred())
	Eventually(ctx, func() ([]uint64, error) { return d.memberIDs(ctx, via) }).WithTimeout(time.Minute).
		ShouldNot(ContainElement(oldID))

	// A node certificate for the new member (the peer plane binds the id).
	certs := filepath.Join(d.certs, fmt.Sprintf("%s-member-%d", victim, newID))
	Expect(os.MkdirAll(certs, 0o755)).To(Succeed())
	ca, err := os.ReadFile(filepath.Join(d.certs, "ca", "ca.crt"))
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(certs, "ca.crt"), ca, 0o644)).To(Succeed())
	out, err := exec.CommandContext(ctx, bins.TidalServer, "certs", "create-node", "--certs-dir", certs,
		"--ca-key", filepath.Join(d.certs, "ca.key"), "--id", strconv.FormatUint(newID, 10),
		"--host", victim+","+victim+".tidal-peers,tidal,localhost,127.0.0.1").CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s", out)
	Expect(chownTree(certs, container.UID, container.GID)).To(Succeed())

	_, err = d.cli(ctx, "members", "add", "--id", strconv.FormatUint(newID, 10), "--peer-addr", victim+":7100",
		"--client-addr", d.addrs[victim], "--addr", d.addrs[via])
	Expect(err).NotTo(HaveOccurred())

	// The service's command with the new id, --join, and the new member in
	// --peers; its certificates from the new directory.
	data, err := os.ReadFile(d.file)
	Expect(err).NotTo(HaveOccurred())
	spec, err := deploy.LoadCompose(data)
	Expect(err).NotTo(HaveOccurred())
	var cmd []string
	for _, a := range spec.Services[victim].Command {
		switch {
		case a == "--id="+strconv.FormatUint(oldID, 10):
			cmd = append(cmd, "--id="+strconv.FormatUint(newID, 10), "--join")
		case strings.HasPrefix(a, "--peers="):
			peers := strings.Replace(a, fmt.Sprintf("%d=%s:", oldID, victim), fmt.Sprintf("%d=%s:", newID, victim), 1)
			Expect(peers).NotTo(Equal(a), "--peers of %s does not name member %d at %s", victim, oldID, victim)
			cmd = append(cmd, peers)
		default:
			cmd = append(cmd, a)
		}
	}
	Expect(cmd).To(ContainElement("--join"))
	override := map[string]any{"services": map[string]any{victim: map[string]any{
		"command": cmd,
		"volumes": []string{"./certs/" + filepath.Base(certs) + ":/certs:ro"},
	}}}
	b, err := yaml.Marshal(override)
	Expect(err).NotTo(HaveOccurred())
	file := filepath.Join(d.dir, fmt.Sprintf("replace-%s.yaml", victim))
	Expect(os.WriteFile(file, b, 0o644)).To(Succeed())
	d.extra = append(d.extra, file)
	d.mustCompose(ctx, "up", "-d", "--no-deps", victim)
	d.ids[victim] = newID

	// Caught up and promoted: a voter every node lists, the old id gone.
	Eventually(ctx, func() error {
		out, err := d.cli(ctx, "status", "--addr", d.addrs[via])
		if err != nil {
			return err
		}
		row := fmt.Sprintf(`(?m)^%d\s+(leader|follower)\s+%s:7100\s+%s\s+\d+\s+\d+\s+true\s*$`, newID, victim, regexp.QuoteMeta(d.addrs[victim]))
		if !regexp.MustCompile(row).MatchString(out) {
			return fmt.Errorf("member %d not yet a reachable voter:\n%s", newID, out)
		}
		if regexp.MustCompile(fmt.Sprintf(`(?m)^%d\s`, oldID)).MatchString(out) {
			return fmt.Errorf("member %d still listed:\n%s", oldID, out)
		}
		return nil
	}).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
	d.waitHealthy(ctx, d.names...)
}

func (d *deployment) memberIDs(ctx context.Context, name string) ([]uint64, error) {
	st, err := d.status(ctx, name)
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for _, m := range st.Members {
		ids = append(ids, m.ID)
	}
	return ids, nil
}

func chownTree(dir string, uid, gid int) error {
	return filepath.Walk(dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

var _ = Describe("faults only the container runtime makes", func() {
	It("docker network disconnect of the leader: the others elect a new leader and keep taking writes, nothing acknowledged is lost, and the old leader rejoins after network connect", func(ctx SpecContext) {
		d := deployCompose(ctx, "compose-network-disconnect")
		r := d.record(workload.Config{Kind: workload.Ledger, Concurrency: 6, Seed: 41})
		r.progressed(ctx, 100, "before the partition")

		old, term := d.waitLeader(ctx, d.names)
		majority := d.others(old)
		cut := r.Now()
		d.disconnect(ctx, old)
		connected := false
		DeferCleanup(func(ctx context.Context) {
			if !connected {
				d.connect(ctx, old)
			}
		})
		leader, newTerm := d.waitLeader(ctx, majority, old)
		Expect(newTerm).To(BeNumerically(">", term))
		GinkgoWriter.Printf("%s cut off at term %d; %s leads at term %d\n", old, term, leader, newTerm)
		r.progressed(ctx, 100, "during the partition")

		healed := r.Now()
		d.connect(ctx, old)
		connected = true
		// It rejoins: ready (it follows a leader and has caught up), and
		// agreeing with the others on who leads.
		d.waitHealthy(ctx, d.names...)
		st, err := d.status(ctx, old)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Term).To(BeNumerically(">=", newTerm), "%s rejoined at term %d, behind the term %d the majority moved to", old, st.Term, newTerm)
		r.progressed(ctx, 100, "after the partition")

		r.Stop()
		v := r.check(ctx)
		during := okWrites(v.Ops, cut, healed)
		total := 0
		for _, n := range majority {
			total += during[n]
		}
		Expect(total).To(BeNumerically(">", 0), "no write was acknowledged through the majority while %s was cut off: %v", old, during)
	}, SpecTimeout(8*time.Minute))

	It("docker pause of a follower for longer than the election timeout: the leader keeps its term and takes writes throughout, and the follower catches up after unpause", func(ctx SpecContext) {
		d := deployCompose(ctx, "compose-pause-follower")
		r := d.record(workload.Config{Kind: workload.Ledger, Concurrency: 6, Seed: 51})
		r.progressed(ctx, 100, "before the pause")

		leader, term := d.waitLeader(ctx, d.names)
		follower := d.others(leader)[0]
		paused := r.Now()
		d.mustCompose(ctx, "pause", follower)
		unpaused := false
		DeferCleanup(func(ctx context.Context) {
			if !unpaused {
				d.compose(ctx, "unpause", follower)
			}
		})
		Expect(d.inspect(ctx, follower).State.Paused).To(BeTrue())

		// The election timeout is 10 ticks of 100ms, randomized up to
		// twice that: 5s frozen is well past it. The leader's term and
		// leadership hold the whole time (CheckQuorum: the other follower
		// is a quorum; PreVote: nothing to disrupt when it comes back).
		// A status call that does not answer in time on a loaded machine
		// says nothing either way; enough of them must answer.
		answered := 0
		Consistently(ctx, func() error {
			st, err := d.status(ctx, leader)
			if err != nil {
				return nil
			}
			answered++
			if st.Leader != d.ids[leader] || st.Term != term {
				return fmt.Errorf("leader %d term %d; expected %s (%d) at term %d", st.Leader, st.Term, leader, d.ids[leader], term)
			}
			return nil
		}).WithTimeout(5 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
		Expect(answered).To(BeNumerically(">=", 5), "the leader answered /cluster/status %d times in the 5s pause", answered)
		// Writes went on meanwhile.
		r.progressed(ctx, 50, "while the follower is paused")

		resumed := r.Now()
		d.mustCompose(ctx, "unpause", follower)
		unpaused = true
		lst, err := d.status(ctx, leader)
		Expect(err).NotTo(HaveOccurred())
		Eventually(ctx, func() (uint64, error) {
			st, err := d.status(ctx, follower)
			if err != nil {
				return 0, err
			}
			return st.Applied, nil
		}).WithTimeout(time.Minute).Should(BeNumerically(">=", lst.Commit), "%s never applied the leader's commit index %d of when it was unpaused", follower, lst.Commit)

		r.Stop()
		v := r.check(ctx)
		st, err := d.status(ctx, leader)
		Expect(err).NotTo(HaveOccurred())
		Expect(st.Leader).To(Equal(d.ids[leader]), "leadership moved after the pause")
		Expect(st.Term).To(Equal(term), "the term changed after the pause")
		during := okWrites(v.Ops, paused, resumed)
		Expect(during[leader]+during[d.others(leader)[1]]).To(BeNumerically(">", 0), "writes acknowledged while %s was paused: %v", follower, during)
	}, SpecTimeout(8*time.Minute))
})
