package e2e

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	dcontainer "github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	dockerclient "github.com/docker/docker/client"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tidaldb/tidal/deploy"
	"github.com/tidaldb/tidal/harness/container"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// composeProjectLabel is the label docker-compose puts on every container,
// network and volume of a project.
const composeProjectLabel = "com.docker.compose.project"

// deployment is deploy/compose.yaml brought up as its README says, in a
// project of its own: certificates from deploy/certs.sh, `compose up -d`.
// Two things differ from a user's copy, both so that specs cannot collide
// with anything else on the host: the image is the one built from this
// tree's binary (by content tag, not tidal-server:dev), and each published
// port (and every 127.0.0.1:PORT naming it) is a free port instead of
// 707N. The rewritten file is dir/compose.yaml.
type deployment struct {
	project string
	dir     string // the spec's store directory: compose.yaml, certs/, logs
	file    string
	extra   []string // more -f files (overrides), in order
	certs   string   // certs.sh output; certs/ca holds the admin's client certificate
	names   []string // services, sorted: tidal-1, tidal-2, tidal-3
	ids     map[string]uint64
	addrs   map[string]string // service -> 127.0.0.1:published port
	ports   map[string]int
	tls     *tls.Config // trusts ca.crt, presents client.admin
	docker  *dockerclient.Client
}

// deployCompose brings up deploy/compose.yaml for one spec and returns it
// once every node is ready and one leads. Everything is torn down in the
// spec's cleanup (`compose down -v`, then a sweep by the project label
// that fails the spec if down left anything).
func deployCompose(ctx context.Context, spec string) *deployment {
	requireDocker()
	Expect(env.NoCompose).To(BeEmpty())
	Expect(os.Geteuid()).To(Equal(0), "the compose specs give the node certificates to the image's uid 65532 as deploy/certs.sh does, which needs root")
	dir := specDir(spec)
	var b [4]byte
	rand.Read(b[:])
	d := &deployment{
		project: "tidal-e2e-" + hex.EncodeToString(b[:]),
		dir:     dir,
		file:    filepath.Join(dir, "compose.yaml"),
		certs:   filepath.Join(dir, "certs"),
		ids:     map[string]uint64{},
		addrs:   map[string]string{},
		ports:   map[string]int{},
	}
	var err error
	d.docker, err = container.Connect(ctx)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(d.docker.Close)

	root, err := fixture.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	certsSh := exec.CommandContext(ctx, filepath.Join(root, "deploy", "certs.sh"), d.certs)
	certsSh.Dir = root
	certsSh.Env = append(os.Environ(), "TIDAL_SERVER="+bins.TidalServer)
	out, err := certsSh.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "deploy/certs.sh %s:\n%s", d.certs, out)
	d.tls, err = certs.ClientTLS(filepath.Join(d.certs, "ca"), "admin")
	Expect(err).NotTo(HaveOccurred())

	orig, err := os.ReadFile(filepath.Join(root, "deploy", "compose.yaml"))
	Expect(err).NotTo(HaveOccurred())
	spec0, err := deploy.LoadCompose(orig)
	Expect(err).NotTo(HaveOccurred())
	for name, s := range spec0.Services {
		d.names = append(d.names, name)
		id, ok := flagValue(s.Command, "id")
		Expect(ok).To(BeTrue(), "service %s: no --id in its command", name)
		n, err := strconv.ParseUint(id, 10, 64)
		Expect(err).NotTo(HaveOccurred())
		d.ids[name] = n
	}
	sort.Strings(d.names)

	// `compose down` runs whatever happens next, also after a failed up.
	DeferCleanup(d.down)
	for attempt := 1; ; attempt++ {
		d.writeComposeFile(orig, spec0)
		out, err := d.compose(ctx, "up", "-d")
		if err == nil {
			break
		}
		// Another process took a port between our probe and the daemon's
		// bind: take new ones.
		taken := strings.Contains(out, "port is already allocated") || strings.Contains(out, "address already in use")
		if !taken || attempt == 3 {
			Fail(fmt.Sprintf("compose up (project %s, attempt %d): %v\n%s", d.project, attempt, err, out))
		}
		d.compose(ctx, "down", "-v", "-t", "1")
	}
	d.waitHealthy(ctx, d.names...)
	return d
}

// writeComposeFile writes deploy/compose.yaml with the image built from
// this tree and fresh published ports (see deployment).
func (d *deployment) writeComposeFile(orig []byte, spec *deploy.Compose) {
	text := string(orig)
	images := map[string]bool{}
	for _, s := range spec.Services {
		images[s.Image] = true
	}
	for im := range images {
		Expect(text).To(ContainSubstring("image: "+im), "the image line of compose.yaml")
		text = strings.ReplaceAll(text, "image: "+im, "image: "+env.Image)
	}
	for _, name := range d.names {
		s := spec.Services[name]
		Expect(s.Ports).To(HaveLen(1), "service %s: expected one published port", name)
		parts := strings.Split(s.Ports[0], ":")
		Expect(parts).To(HaveLen(3), "service %s: expected 127.0.0.1:HOST:CONTAINER, found %q", name, s.Ports[0])
		port := freePort()
		// Every 127.0.0.1:HOST in the file names the node's published
		// client port (ports: and --advertise-client-addr).
		re := regexp.MustCompile(regexp.QuoteMeta(parts[0]+":"+parts[1]) + `\b`)
		Expect(re.MatchString(text)).To(BeTrue())
		text = re.ReplaceAllString(text, parts[0]+":"+strconv.Itoa(port))
		d.ports[name] = port
		d.addrs[name] = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	Expect(os.WriteFile(d.file, []byte(text), 0o644)).To(Succeed())
}

// freePort is a port nothing listens on now on 127.0.0.1.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// flagValue finds --name=value among a compose command's words.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// compose runs one compose command on the project and returns its output.
func (d *deployment) compose(ctx context.Context, args ...string) (string, error) {
	words := append([]string{}, env.Compose[1:]...)
	words = append(words, "-p", d.project, "-f", d.file)
	for _, f := range d.extra {
		words = append(words, "-f", f)
	}
	words = append(words, args...)
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, env.Compose[0], words...)
	cmd.Dir = d.dir
	out, err := cmd.CombinedOutput()
	if len(args) > 0 && args[0] == "logs" {
		// The nodes' logs go to the spec's compose.log, not the report.
		fmt.Fprintf(GinkgoWriter, "$ %s %s (%d bytes)\n", env.Compose[0], strings.Join(words, " "), len(out))
	} else {
		fmt.Fprintf(GinkgoWriter, "$ %s %s\n%s", env.Compose[0], strings.Join(words, " "), out)
	}
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", env.Compose[0], strings.Join(words, " "), err)
	}
	return string(out), nil
}

func (d *deployment) mustCompose(ctx context.Context, args ...string) string {
	out, err := d.compose(ctx, args...)
	Expect(err).NotTo(HaveOccurred(), "%s", out)
	return out
}

// down keeps the nodes' logs in the spec directory, runs `compose down -v`
// and then removes whatever still carries the project's label, failing
// the spec if there was anything: a user's `down -v` must leave nothing.
func (d *deployment) down(ctx context.Context) {
	if out, err := d.compose(context.WithoutCancel(ctx), "logs", "--no-color", "--timestamps"); err == nil {
		os.WriteFile(filepath.Join(d.dir, "compose.log"), []byte(out), 0o644)
	}
	out, err := d.compose(context.WithoutCancel(ctx), "down", "-v", "--remove-orphans", "-t", "10")
	left := sweepLabel(context.WithoutCancel(ctx), d.docker, composeProjectLabel+"="+d.project)
	Expect(err).NotTo(HaveOccurred(), "compose down -v: %s", out)
	Expect(left).To(BeEmpty(), "compose down -v left these behind (removed now)")
}

// sweepLabel removes every container, network and volume carrying label
// (key=value) and returns what it found.
func sweepLabel(ctx context.Context, cli *dockerclient.Client, label string) []string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	f := filters.NewArgs(filters.Arg("label", label))
	var found []string
	cs, err := cli.ContainerList(ctx, dcontainer.ListOptions{All: true, Filters: f})
	Expect(err).NotTo(HaveOccurred())
	for _, c := range cs {
		found = append(found, "container "+strings.Join(c.Names, ","))
		cli.ContainerRemove(ctx, c.ID, dcontainer.RemoveOptions{Force: true, RemoveVolumes: true})
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	Expect(err).NotTo(HaveOccurred())
	for _, n := range ns {
		found = append(found, "network "+n.Name)
		cli.NetworkRemove(ctx, n.ID)
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	Expect(err).NotTo(HaveOccurred())
	for _, v := range vs.Volumes {
		found = append(found, "volume "+v.Name)
		cli.VolumeRemove(ctx, v.Name, true)
	}
	return found
}

// specDir is the spec's store directory: kept and printed when the spec
// fails, removed when it passes.
func specDir(spec string) string {
	dir, err := fixture.SpecDir("e2e", spec)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			GinkgoWriter.Printf("spec store (compose.yaml, compose.log, history.jsonl, results): %s\n", dir)
			fmt.Fprintf(os.Stderr, "*** %s: FAILED; its store: %s\n", CurrentSpecReport().FullText(), dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

// client talks to a node at its published port over TLS (HTTP/2) as the
// admin.
func (d *deployment) client(name string, opts ...client.Option) *client.Client {
	return client.New(d.addrs[name], append([]client.Option{client.WithTLS(d.tls)}, opts...)...)
}

// status asks name for /cluster/status with a short deadline.
func (d *deployment) status(ctx context.Context, name string) (*client.Status, error) {
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	c := d.client(name, client.WithRetries(0))
	defer c.CloseIdleConnections()
	return c.Status(sctx)
}

// serviceOf maps a member id to its service.
func (d *deployment) serviceOf(id uint64) string {
	for n, i := range d.ids {
		if i == id {
			return n
		}
	}
	return ""
}

// leader returns the service whose member leads, as the node with the
// highest term among those asked says, and that term ("" if none knows).
func (d *deployment) leader(ctx context.Context, among ...string) (string, uint64) {
	if len(among) == 0 {
		among = d.names
	}
	var best *client.Status
	for _, n := range among {
		st, err := d.status(ctx, n)
		if err != nil || st.Leader == 0 {
			continue
		}
		if best == nil || st.Term > best.Term {
			best = st
		}
	}
	if best == nil {
		return "", 0
	}
	return d.serviceOf(best.Leader), best.Term
}

// waitLeader waits until the nodes among agree on a leader that is not
// one of not, and returns it and its term.
func (d *deployment) waitLeader(ctx context.Context, among []string, not ...string) (string, uint64) {
	var leader string
	var term uint64
	Eventually(ctx, func() error {
		var seen []string
		leader, term = "", 0
		for _, n := range among {
			st, err := d.status(ctx, n)
			if err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
			l := d.serviceOf(st.Leader)
			seen = append(seen, fmt.Sprintf("%s: leader %q term %d", n, l, st.Term))
			if l == "" || (leader != "" && (l != leader || st.Term != term)) {
				return fmt.Errorf("no agreed leader: %s", strings.Join(seen, "; "))
			}
			leader, term = l, st.Term
		}
		for _, x := range not {
			if leader == x {
				return fmt.Errorf("still led by %s: %s", x, strings.Join(seen, "; "))
			}
		}
		return nil
	}).WithTimeout(90 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	return leader, term
}

// waitHealthy waits until every one of names answers /readyz (it has a
// leader and is caught up) and they agree on a leader.
func (d *deployment) waitHealthy(ctx context.Context, names ...string) {
	Eventually(ctx, func() error {
		for _, n := range names {
			rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			c := d.client(n, client.WithRetries(0))
			err := c.Ready(rctx)
			c.CloseIdleConnections()
			cancel()
			if err != nil {
				return fmt.Errorf("%s /readyz: %w", n, err)
			}
		}
		return nil
	}).WithTimeout(2*time.Minute).WithPolling(250*time.Millisecond).Should(Succeed(), "nodes %v never ready (logs: compose logs, kept in %s)", names, d.dir)
	d.waitLeader(ctx, names)
}

// containerOf returns the container of a service (the one compose runs).
func (d *deployment) containerOf(ctx context.Context, name string) dcontainer.Summary {
	f := filters.NewArgs(filters.Arg("label", composeProjectLabel+"="+d.project), filters.Arg("label", "com.docker.compose.service="+name))
	cs, err := d.docker.ContainerList(ctx, dcontainer.ListOptions{All: true, Filters: f})
	Expect(err).NotTo(HaveOccurred())
	Expect(cs).To(HaveLen(1), "containers of service %s in project %s", name, d.project)
	return cs[0]
}

func (d *deployment) inspect(ctx context.Context, name string) dcontainer.InspectResponse {
	in, err := d.docker.ContainerInspect(ctx, d.containerOf(ctx, name).ID)
	Expect(err).NotTo(HaveOccurred())
	return in
}

// crash kills the node's process from the host with SIGKILL, as the
// kernel's OOM killer or a segfault would end it: unlike `docker kill`
// (a stop the daemon was asked for), the daemon then applies the
// container's restart policy. It returns the container's restart count
// before the crash.
func (d *deployment) crash(ctx context.Context, name string) int {
	in := d.inspect(ctx, name)
	Expect(in.State.Running).To(BeTrue(), "%s is not running", name)
	Expect(in.State.Pid).To(BeNumerically(">", 0))
	Expect(syscall.Kill(in.State.Pid, syscall.SIGKILL)).To(Succeed(), "SIGKILL to %s's pid %d", name, in.State.Pid)
	return in.RestartCount
}

// network is the project's default network (compose's <project>_default).
func (d *deployment) network() string { return d.project + "_default" }

// disconnect takes the node's container off the project's network: a
// partition made by the runtime (no relay is involved).
func (d *deployment) disconnect(ctx context.Context, name string) {
	Expect(d.docker.NetworkDisconnect(ctx, d.network(), d.containerOf(ctx, name).ID, false)).To(Succeed())
}

// connect puts it back under its service name, the alias its peers dial.
func (d *deployment) connect(ctx context.Context, name string) {
	Expect(d.docker.NetworkConnect(ctx, d.network(), d.containerOf(ctx, name).ID,
		&network.EndpointSettings{Aliases: []string{name}})).To(Succeed())
}

// cli runs the tidal-server binary (status, members ...) as an operator
// would, with the admin's certificate.
func (d *deployment) cli(ctx context.Context, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args = append(args, "--certs-dir", filepath.Join(d.certs, "ca"))
	out, err := exec.CommandContext(cctx, bins.TidalServer, args...).CombinedOutput()
	fmt.Fprintf(GinkgoWriter, "$ tidal-server %s\n%s", strings.Join(args, " "), out)
	if err != nil {
		return string(out), fmt.Errorf("tidal-server %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// waitConverged waits until every node of names reports the same digest
// at the same applied index (writes have stopped), and returns them.
func (d *deployment) waitConverged(ctx context.Context, names ...string) map[string]client.Digest {
	var last map[string]client.Digest
	Eventually(ctx, func() error {
		last = map[string]client.Digest{}
		for _, n := range names {
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			dg, err := d.client(n, client.WithRetries(0)).Digest(dctx)
			cancel()
			if err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
			last[n] = dg
		}
		for _, n := range names {
			if last[n] != last[names[0]] {
				return fmt.Errorf("not converged: %v", last)
			}
		}
		return nil
	}).WithTimeout(2 * time.Minute).WithPolling(250 * time.Millisecond).Should(Succeed())
	return last
}
