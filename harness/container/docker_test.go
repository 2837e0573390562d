package container

import (
	"context"
	"errors"
	"fmt"
	"github.com/tidaldb/tidal/usage"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/api/types/volume"
	"github.com/docker/docker/client"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/suites/fixture"
	tclient "github.com/tidaldb/tidal/tidal-server/client"
)

// These tests start real containers. Without a daemon they skip, and say
// so on stderr even without -v: a skipped backend must not pass quietly.

var (
	noDaemon error             // why the daemon tests skip
	bins     *fixture.Binaries // static binaries, built once
)

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	cli, err := Connect(ctx)
	cancel()
	var dir string
	if err != nil {
		noDaemon = err
		fmt.Fprintf(os.Stderr, "\n*** harness/container: Docker tests SKIPPED: %v\n*** start dockerd (CI's .ci/run does) to run them\n\n", err)
	} else {
		cli.Close()
		if dir, err = os.MkdirTemp("", "tidal-container-bin-"); err == nil {
			bins, err = fixture.Build(dir)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "harness/container: building the static binaries: %v\n", err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	if dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

func needDocker(t *testing.T) {
	t.Helper()
	if noDaemon != nil {
		t.Skipf("SKIPPED, no Docker daemon: %v", noDaemon)
	}
}

// newBackend starts a backend for one test; cleanup closes it and then
// checks that nothing labelled with its run is left.
func newBackend(t *testing.T, relay bool) *Backend {
	t.Helper()
	needDocker(t)
	opts := Options{ServerBinary: bins.TidalServer, RunID: "t" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))}
	if len(opts.RunID) > 40 {
		opts.RunID = opts.RunID[:40]
	}
	if relay {
		opts.RelayBinary = bins.TCPRelay
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		assertNothingLabelled(t, LabelRun+"="+opts.RunID)
	})
	return b
}

// assertNothingLabelled is `docker ps -a --filter label=...`, `docker
// network ls --filter ...` and `docker volume ls --filter ...`, all empty.
func assertNothingLabelled(t *testing.T, label string) {
	t.Helper()
	cli, err := Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	left := labelled(t, cli, label)
	if len(left) > 0 {
		t.Errorf("expected nothing labelled %s, found %v", label, left)
	}
}

func labelled(t *testing.T, cli client.APIClient, label string) []string {
	t.Helper()
	ctx := context.Background()
	f := filters.NewArgs(filters.Arg("label", label))
	var out []string
	cs, err := cli.ContainerList(ctx, container.ListOptions{All: true, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		out = append(out, "container "+strings.Join(c.Names, ","))
	}
	ns, err := cli.NetworkList(ctx, network.ListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		out = append(out, "network "+n.Name)
	}
	vs, err := cli.VolumeList(ctx, volume.ListOptions{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs.Volumes {
		out = append(out, "volume "+v.Name)
	}
	return out
}

// freePorts returns n distinct free loopback ports: every listener stays
// open until all are chosen, so the kernel cannot hand one out twice.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after 90s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitNode is waitFor for a condition on one node's container: it gives up
// at once if the container exited, and a failure says what the container
// was doing (its state and published ports) and ends with what it printed,
// so a failure on a machine nobody can log in to can still be read.
func waitNode(t *testing.T, b *Backend, h *Handle, spec cluster.NodeSpec, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		exited := false
		select {
		case <-h.Exited():
			exited = true
		default:
		}
		if exited || time.Now().After(deadline) {
			st, _ := h.ExitStatus()
			t.Fatalf("%s: %v (container exited: %v, status %+v)\n%s", what, err, exited, st, nodeDiagnosis(b, h, spec))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nodeDiagnosis is docker inspect's state and ports for h and the tails of
// the node's stdout log and its own log file.
func nodeDiagnosis(b *Backend, h *Handle, spec cluster.NodeSpec) string {
	var sb strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if info, err := b.Client().ContainerInspect(ctx, h.Container()); err != nil {
		fmt.Fprintf(&sb, "docker inspect %s: %v\n", h.Container(), err)
	} else {
		if info.State != nil {
			fmt.Fprintf(&sb, "state: %s (running %v, exit %d, oom %v, error %q, started %s, finished %s)\n",
				info.State.Status, info.State.Running, info.State.ExitCode, info.State.OOMKilled, info.State.Error, info.State.StartedAt, info.State.FinishedAt)
		}
		if info.NetworkSettings != nil {
			fmt.Fprintf(&sb, "published ports: %v\n", info.NetworkSettings.Ports)
		}
		if info.Config != nil {
			fmt.Fprintf(&sb, "command: %v as user %q\n", info.Config.Cmd, info.Config.User)
		}
	}
	for _, f := range []string{spec.LogPath, filepath.Join(spec.Dir, "node.log")} {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(&sb, "%s: %v\n", f, err)
			continue
		}
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&sb, "--- tail of %s:\n%s\n", f, data)
	}
	return sb.String()
}

// One node through every operation the cluster asks of a handle: the
// container starts from the image, answers on its published port, keeps
// its data in the bind-mounted directory across a restart, freezes and
// thaws, drains on SIGTERM (exit 0), dies on SIGKILL (signal: killed), and
// its output and stats land where the process backend puts them.
func TestNodeLifecycle(t *testing.T) {
	b := newBackend(t, false)
	dir := t.TempDir()
	ports := freePorts(t, 2)
	port, peer := ports[0], ports[1]
	addr := "127.0.0.1:" + strconv.Itoa(port)
	spec := cluster.NodeSpec{Name: "n1", Dir: dir, LogPath: filepath.Join(dir, "stdout.log"), Args: []string{"run", "--id", "1",
		"--client-addr", addr, "--peer-addr=127.0.0.1:" + strconv.Itoa(peer),
		"--data-dir", filepath.Join(dir, "data"), "--log-file", filepath.Join(dir, "node.log")}}
	launch := func() *Handle {
		t.Helper()
		h, err := b.Launch(spec)
		if err != nil {
			t.Fatal(err)
		}
		return h.(*Handle)
	}
	c := tclient.New(addr, tclient.WithRetries(0), tclient.WithTimeout(2*time.Second))
	ready := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return c.Ready(ctx)
	}

	h := launch()
	waitNode(t, b, h, spec, "n1 ready on its published port", ready)
	ctx := context.Background()
	if _, err := c.WriteSignals(ctx, []tclient.Event{{ID: "before-restart", Entity: 7, Signal: "view"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node.log")); err != nil {
		t.Errorf("expected the node's own log in its bind-mounted directory: %v", err)
	}
	if h.PID() <= 0 {
		t.Errorf("expected the container's pid, found %d", h.PID())
	}
	st, err := h.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if s := st.(Stats); s.MemoryBytes == 0 || s.Tasks == 0 || s.CPUSeconds <= 0 || s.PID != h.PID() {
		t.Errorf("expected memory, tasks, CPU time and the pid in the stats, found %+v", s)
	}

	// Frozen: the published port still accepts (docker-proxy), but
	// nothing answers; thawed, it answers again.
	if err := h.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := ready(); err == nil {
		t.Error("expected a paused node not to answer /readyz")
	}
	if err := h.Resume(); err != nil {
		t.Fatal(err)
	}
	waitNode(t, b, h, spec, "n1 answers after resume", ready)
	// Regression: an unpause the daemon refused. Resuming a running
	// container succeeds (the daemon had acknowledged a pause it then
	// showed as running, and Terminate's resume failed the test).
	if err := h.Resume(); err != nil {
		t.Fatalf("resume of a running container: %v", err)
	}

	// Paused, then terminated: resumed first, drains, exits 0.
	if err := h.Pause(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = h.Terminate(tctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := h.ExitStatus(); !ok || st.Code != 0 {
		t.Errorf("SIGTERM: expected exit status 0, found %+v (exited %v)", st, ok)
	}

	// Restart on the same data: the acknowledged write is still there.
	h = launch()
	waitNode(t, b, h, spec, "n1 ready after restart", ready)
	waitFor(t, "the write from before the restart", func() error {
		_, err := c.EventLocation(ctx, "before-restart")
		return err
	})
	// Killed while paused: the freezer lets SIGKILL through.
	if err := h.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := h.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Exited():
	default:
		t.Fatal("Kill returned before Exited closed")
	}
	if st, _ := h.ExitStatus(); st.Signal != "killed" || st.Code != -1 {
		t.Errorf("SIGKILL: expected signal killed, found %+v", st)
	}
	if err := h.Kill(); err != nil {
		t.Errorf("a second Kill of an exited container: expected no error, found %v", err)
	}
	logs, err := os.ReadFile(spec.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"start container " + b.ContainerName("n1"), "exit: exit status 0", "exit: signal: killed"} {
		if !strings.Contains(string(logs), want) {
			t.Errorf("stdout.log: expected %q in\n%s", want, logs)
		}
	}
}

// A node that exits by itself is seen: Exited closes with its status and
// its complaint is in the log file.
func TestExitedOnItsOwn(t *testing.T) {
	b := newBackend(t, false)
	dir := t.TempDir()
	spec := cluster.NodeSpec{Name: "bad", Dir: dir, LogPath: filepath.Join(dir, "stdout.log"), Args: []string{"run", "--no-such-flag"}}
	h, err := b.Launch(spec)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Exited():
	case <-time.After(90 * time.Second):
		t.Fatal("expected the container to exit on a bad flag")
	}
	st, _ := h.(*Handle).ExitStatus()
	if st.Code != usage.Code {
		t.Errorf("expected exit status %d (a usage error), found %+v", usage.Code, st)
	}
	logs, _ := os.ReadFile(spec.LogPath)
	if !strings.Contains(string(logs), "no-such-flag") {
		t.Errorf("expected the server's complaint in the log, found\n%s", logs)
	}
}

// Launch refuses what it cannot run in a container, naming why.
func TestLaunchRefuses(t *testing.T) {
	b := newBackend(t, false)
	dir := t.TempDir()
	for _, tc := range []struct {
		spec cluster.NodeSpec
		want string
	}{
		{cluster.NodeSpec{Name: "tcp-relay", Binary: "/usr/bin/tcp-relay", Dir: dir, LogPath: filepath.Join(dir, "x.log")}, "RelayMesh"},
		{cluster.NodeSpec{Name: "n1", Dir: dir, LogPath: filepath.Join(dir, "x.log"), Args: []string{"--client-addr", "127.0.0.1:0"}}, "fixed port"},
	} {
		if _, err := b.Launch(tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: expected an error naming %q, found %v", tc.spec, tc.want, err)
		}
	}
}

// Three nodes behind the relay container, driven by package cluster as a
// chaos run drives them: a leader is elected over the mesh, writes go
// through the client relays, isolating the leader elects another, a
// killed node restarts on its data, and every node converges.
func TestClusterOverRelayContainer(t *testing.T) {
	b := newBackend(t, true)
	dir := t.TempDir()
	c, err := cluster.New(cluster.Config{Nodes: 3, Backend: b, Dir: dir, NewNetwork: b.RelayMesh(filepath.Join(dir, "tcp-relay")),
		Flags: fixture.FastFlags, StatsInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		if !strings.HasPrefix(n.ClientRelay, "127.0.0.1:") {
			t.Errorf("%s: expected its client relay published on 127.0.0.1, found %s", n.Name, n.ClientRelay)
		}
	}
	write := func(id, via string) {
		t.Helper()
		w := c.Client(via, tclient.WithRetries(5))
		if _, err := w.WriteSignals(ctx, []tclient.Event{{ID: id, Entity: 1, Signal: "view"}}); err != nil {
			t.Fatalf("write %s via %s (client relay): %v", id, via, err)
		}
	}
	for _, n := range c.Names() {
		write("w-"+n, n)
	}

	if _, err := c.Mesh().Isolate(leader); err != nil {
		t.Fatal(err)
	}
	var next string
	waitFor(t, "a new leader while "+leader+" is isolated", func() error {
		for _, n := range c.Names() {
			if n == leader {
				continue
			}
			st, err := c.Status(ctx, n)
			if err != nil {
				return err
			}
			if name := c.NameOf(st.Leader); name != "" && name != leader {
				next = name
				return nil
			}
		}
		return errors.New("the majority still follows " + leader)
	})
	write("during-partition", next)
	if _, err := c.Mesh().Heal(); err != nil {
		t.Fatal(err)
	}

	victim := next
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.Start(victim); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Names() {
		for _, id := range []string{"w-n1", "w-n2", "w-n3", "during-partition"} {
			if _, err := c.AdminClient(n).EventLocation(ctx, id); err != nil {
				t.Errorf("%s: expected acked write %s after heal and restart: %v", n, id, err)
			}
		}
	}
	// Every peer link crossed the relay container: n1 dials its peers
	// only through "tcp-relay:<port>", and listens on all its interfaces.
	if data, err := os.ReadFile(filepath.Join(dir, "n1", "stdout.log")); err != nil ||
		!strings.Contains(string(data), "--peer-dial "+c.Nodes()[1].PeerAddr+"="+RelayAlias+":") ||
		!strings.Contains(string(data), "--client-addr 0.0.0.0:") {
		t.Errorf("expected n1 started with peer links through %s and listeners on 0.0.0.0, found %q (%v)", RelayAlias, data, err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "n1", "stats.jsonl")); err != nil || !strings.Contains(string(data), `"memory_bytes"`) {
		t.Errorf("expected container stats in n1/stats.jsonl, found %q (%v)", data, err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "tcp-relay", "tcp-relay.log")); err != nil || !strings.Contains(string(data), "mesh created") {
		t.Errorf("expected the relay container's log in tcp-relay/tcp-relay.log, found %q (%v)", data, err)
	}
}

// The reaper removes what a run whose harness died left behind —
// containers, network, volume — and leaves a live run alone.
func TestReapGoneRun(t *testing.T) {
	needDocker(t)
	ctx := context.Background()
	cli, err := Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	host, _ := os.Hostname()
	// A harness that has exited: a process started and reaped here.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadOwner := owner{Host: host, PID: dead.Process.Pid, Start: 1}.String()
	live, err := currentOwner()
	if err != nil {
		t.Fatal(err)
	}
	img, err := ServerImage.Build(ctx, cli, bins.TidalServer)
	if err != nil {
		t.Fatal(err)
	}
	stamp := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	runs := map[string]string{"treap-dead-" + stamp: deadOwner, "treap-live-" + stamp: live}
	for run, own := range runs {
		labels := map[string]string{LabelRun: run, LabelOwner: own}
		if _, err := cli.NetworkCreate(ctx, "tidal-"+run, network.CreateOptions{Driver: "bridge", Labels: labels}); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.VolumeCreate(ctx, volume.CreateOptions{Name: "tidal-" + run, Labels: labels}); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.ContainerCreate(ctx, &container.Config{Image: img, Labels: labels}, &container.HostConfig{NetworkMode: container.NetworkMode("tidal-" + run)}, nil, nil, "tidal-"+run+"-n1"); err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for run := range runs {
			RemoveRun(ctx, cli, run)
		}
	}()
	removed, err := Reap(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	deadRun := "treap-dead-" + stamp
	for _, want := range []string{"container tidal-" + deadRun + "-n1", "network tidal-" + deadRun, "volume tidal-" + deadRun} {
		if !strings.Contains(strings.Join(removed, "\n"), want) {
			t.Errorf("expected the reaper to remove %s, removed %v", want, removed)
		}
	}
	if left := labelled(t, cli, LabelRun+"="+deadRun); len(left) > 0 {
		t.Errorf("expected nothing of the dead run left, found %v", left)
	}
	liveRun := "treap-live-" + stamp
	if left := labelled(t, cli, LabelRun+"="+liveRun); len(left) != 3 {
		t.Errorf("expected the live run's container, network and volume untouched, found %v", left)
	}
	if r, err := RemoveRun(ctx, cli, liveRun); err != nil || len(r) != 3 {
		t.Errorf("RemoveRun of the live run: expected 3 removals, found %v, %v", r, err)
	}
}

// An unchanged binary is found by its content tag, not rebuilt; extra
// tags land on the same image.
func TestBuildFindsExisting(t *testing.T) {
	needDocker(t)
	ctx := context.Background()
	cli, err := Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	first, err := RelayImage.Build(ctx, cli, bins.TCPRelay)
	if err != nil {
		t.Fatal(err)
	}
	a, err := cli.ImageInspect(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	tag := "test-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	second, err := RelayImage.Build(ctx, cli, bins.TCPRelay, tag)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.ImageRemove(ctx, RelayImage.Ref(tag), image.RemoveOptions{})
	b, err := cli.ImageInspect(ctx, RelayImage.Ref(tag))
	if err != nil {
		t.Fatal(err)
	}
	if first != second || a.ID != b.ID || a.Created != b.Created {
		t.Errorf("expected the same image found again and tagged %s: %s %s (%s) vs %s %s (%s)", tag, first, a.ID, a.Created, second, b.ID, b.Created)
	}
	if a.Config == nil || a.Config.User != "65532:65532" {
		t.Errorf("expected the image to run as 65532:65532, found %+v", a.Config)
	}
}
