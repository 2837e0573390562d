// Package container is the Docker backend of harness/cluster: every node
// is a container of the tidal-server image (FROM scratch around the static
// binary, built on demand and found again by a content hash), on a
// user-defined bridge network of its own per run, with the relay mesh in a
// tcp-relay container on the same network.
//
// Addresses. The cluster allocates every node's client and peer port on
// Host() (127.0.0.1) as it does for processes. A node's container listens
// on the same port numbers on all of its own interfaces and publishes
// both on 127.0.0.1 only, so the harness reaches a node's client port at
// the address the cluster allocated. Nodes never dial each other: each
// dials, through --peer-dial, its relay in the tcp-relay container
// ("tcp-relay:<port>", by its alias on the run's network), and the relay
// dials the node by its alias ("n2:<port>"). Client relays listen on fixed
// ports inside the relay container, published on ephemeral 127.0.0.1
// ports: that is where workload clients connect. A partition is the same
// mesh change as with processes; `docker network disconnect` and `docker
// pause` are faults only containers have.
//
// Data. A node's directory (data/, node.log) is bind-mounted at the same
// path inside its container, so the arguments the cluster builds are
// valid unchanged, Wipe is a removal on the host, and a FUSE filesystem
// mounted under the directory (faultfs) before the container is created
// is what the node writes to (the bind is recursive). The clock offset
// file the harness rewrites lies in that directory too; one elsewhere is
// reached through its directory's mount (see clockOffsetMount).
//
// Cleanup. Everything a run creates carries the label tidal.run=<id> and
// the owner (host, pid and start time of the harness process). Close
// removes the run's containers, network and volumes; New first reaps every
// run whose owner process on this host is gone (a crashed harness).
package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/api/types/network"
	"github.com/docker/docker/client"
	"github.com/docker/go-connections/nat"

	"github.com/tidaldb/tidal/harness/cluster"
)

// Labels on every container, network and volume a run creates.
const (
	LabelRun   = "tidal.run"   // the run id
	LabelNode  = "tidal.node"  // the slot name, or "tcp-relay"
	LabelOwner = "tidal.owner" // host/pid/start-ms of the harness process
)

// ErrNoDaemon is returned (wrapped) when no Docker daemon answers: tests
// skip on it, loudly.
var ErrNoDaemon = errors.New("no Docker daemon answers")

// Connect returns a client for the daemon DOCKER_HOST names (default: the
// local socket), with the API version negotiated down to the daemon's (a
// Debian daemon may be years older than the SDK), once it answers a ping.
func Connect(ctx context.Context) (*client.Client, error) {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDaemon, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Ping(pctx); err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w at %s: %v", ErrNoDaemon, cli.DaemonHost(), err)
	}
	return cli, nil
}

// Options configure a Backend.
type Options struct {
	// ServerBinary is a static tidal-server (CGO_ENABLED=0, no -race); its
	// image is built unless one with the same content exists.
	ServerBinary string
	// RelayBinary is a static tcp-relay, for the mesh's container; needed
	// only by RelayMesh.
	RelayBinary string
	// RunID names the run's resources; empty: a random one.
	RunID string
	// NoReap skips reaping the resources of gone runs in New.
	NoReap bool
	Logger *slog.Logger
}

// Backend runs cluster nodes as containers. It implements cluster.Backend.
type Backend struct {
	cli     *client.Client
	opts    Options
	run     string
	owner   string
	network string
	log     *slog.Logger

	serverImage string
	relayImage  string

	ctx    context.Context // cancelled by Close: ends log streams and waits
	cancel context.CancelFunc
	wg     sync.WaitGroup // every handle's goroutines

	mu     sync.Mutex
	closed bool
}

var _ cluster.Backend = (*Backend)(nil)

// New connects to the daemon, reaps what gone runs left, builds (or finds)
// the images and creates the run's network.
func New(ctx context.Context, opts Options) (*Backend, error) {
	if opts.ServerBinary == "" {
		return nil, errors.New("container backend: ServerBinary: required (a static tidal-server; `make build`)")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.RunID == "" {
		var b [5]byte
		rand.Read(b[:])
		opts.RunID = hex.EncodeToString(b[:])
	}
	if err := checkName(opts.RunID); err != nil {
		return nil, fmt.Errorf("container backend: run id: %w", err)
	}
	cli, err := Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("container backend: %w", err)
	}
	owner, err := currentOwner()
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("container backend: owner label: %w", err)
	}
	bctx, cancel := context.WithCancel(context.Background())
	b := &Backend{cli: cli, opts: opts, run: opts.RunID, owner: owner, network: "tidal-" + opts.RunID,
		log: opts.Logger.With("backend", "docker", "run", opts.RunID), ctx: bctx, cancel: cancel}
	fail := func(err error) (*Backend, error) {
		b.Close()
		return nil, fmt.Errorf("container backend: %w", err)
	}
	if !opts.NoReap {
		reaped, err := Reap(ctx, cli)
		if len(reaped) > 0 {
			b.log.Info("reaped the resources of gone runs", "removed", reaped)
		}
		if err != nil {
			b.log.Warn("reaping gone runs", "err", err)
		}
	}
	if b.serverImage, err = ServerImage.Build(ctx, cli, opts.ServerBinary); err != nil {
		return fail(err)
	}
	if opts.RelayBinary != "" {
		if b.relayImage, err = RelayImage.Build(ctx, cli, opts.RelayBinary); err != nil {
			return fail(err)
		}
	}
	if _, err := cli.NetworkCreate(ctx, b.network, network.CreateOptions{Driver: "bridge", Labels: b.labels("")}); err != nil {
		return fail(fmt.Errorf("create network %s: %w", b.network, err))
	}
	b.log.Info("docker backend ready", "network", b.network, "server_image", b.serverImage, "relay_image", b.relayImage)
	return b, nil
}

// Name implements cluster.Backend.
func (b *Backend) Name() string { return "docker" }

// Host implements cluster.Backend: ports are allocated, and published, on
// the host's loopback.
func (b *Backend) Host() string { return "127.0.0.1" }

// RunID is the id in the tidal.run label of everything this run created.
func (b *Backend) RunID() string { return b.run }

// Network is the name of the run's Docker network.
func (b *Backend) Network() string { return b.network }

// Client is the Docker client, for faults only containers have (network
// disconnect) and for tests.
func (b *Backend) Client() *client.Client { return b.cli }

// ContainerName is the name of the container that runs node.
func (b *Backend) ContainerName(node string) string { return "tidal-" + b.run + "-" + node }

func (b *Backend) labels(node string) map[string]string {
	l := map[string]string{LabelRun: b.run, LabelOwner: b.owner}
	if node != "" {
		l[LabelNode] = node
	}
	return l
}

// Launch implements cluster.Backend: it starts spec as a new container of
// the server image (a node's earlier, exited container is removed first;
// its output is already in the node's log file).
func (b *Backend) Launch(spec cluster.NodeSpec) (cluster.Handle, error) {
	if spec.Binary != "" && spec.Binary != b.opts.ServerBinary {
		return nil, fmt.Errorf("container backend: cannot run %s in a container: it runs only the tidal-server image (the relay mesh of a docker run is its own container: set cluster.Config.NewNetwork to Backend.RelayMesh)", spec.Binary)
	}
	if err := checkName(spec.Name); err != nil {
		return nil, fmt.Errorf("container backend: node name: %w", err)
	}
	plan, err := planNode(spec, b.Host())
	if err != nil {
		return nil, fmt.Errorf("container backend: %s: %w", spec.Name, err)
	}
	user, chown := containerUser()
	if chown {
		// The node writes data/ and node.log into its directory as the
		// image's user; the harness (root) can still read and remove them.
		if err := chownTree(spec.Dir, UID, GID); err != nil {
			return nil, fmt.Errorf("container backend: %s: give %s to uid %d: %w", spec.Name, spec.Dir, UID, err)
		}
	}
	cfg := &container.Config{
		Image:        b.serverImage,
		Cmd:          plan.Args,
		User:         user,
		Hostname:     spec.Name,
		Labels:       b.labels(spec.Name),
		ExposedPorts: nat.PortSet{},
	}
	hc := &container.HostConfig{
		NetworkMode:  container.NetworkMode(b.network),
		PortBindings: nat.PortMap{},
		Mounts:       plan.Mounts,
	}
	for _, p := range plan.Ports {
		port := nat.Port(strconv.Itoa(p) + "/tcp")
		cfg.ExposedPorts[port] = struct{}{}
		hc.PortBindings[port] = []nat.PortBinding{{HostIP: b.Host(), HostPort: strconv.Itoa(p)}}
	}
	return b.launch(spec.Name, cfg, hc, spec.LogPath)
}

// launch creates and starts one container on the run's network (alias =
// node) and returns its handle once it runs.
func (b *Backend) launch(node string, cfg *container.Config, hc *container.HostConfig, logPath string) (*Handle, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, errors.New("container backend: closed")
	}
	hc.LogConfig = container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "20m", "max-file": "2"}}
	hc.RestartPolicy = container.RestartPolicy{Name: container.RestartPolicyDisabled}
	nc := &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{
		b.network: {Aliases: []string{node}},
	}}
	name := b.ContainerName(node)
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()
	// A node's earlier container (killed, or stopped) is in the way of
	// the name; its output is already in the log file.
	if err := b.cli.ContainerRemove(ctx, name, container.RemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !client.IsErrNotFound(err) {
		return nil, fmt.Errorf("container backend: remove the earlier %s: %w", name, err)
	}
	created, err := b.cli.ContainerCreate(ctx, cfg, hc, nc, nil, name)
	if err != nil {
		return nil, fmt.Errorf("container backend: create %s (%s): %w", name, cfg.Image, err)
	}
	h, err := b.start(node, created.ID, name, logPath, cfg)
	if err != nil {
		rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
		b.cli.ContainerRemove(rctx, created.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
		rcancel()
		return nil, err
	}
	return h, nil
}

// Close implements cluster.Backend: it removes every container, the
// network and any volume of this run, then closes the client.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	removed, err := RemoveRun(ctx, b.cli, b.run)
	b.log.Info("docker backend closed", "removed", removed)
	// Removed containers end their waits and log streams; anything still
	// blocked on the daemon ends with the context.
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		b.log.Warn("container goroutines still running 30s after their containers were removed; cancelling")
	}
	b.cancel()
	<-done
	b.cli.Close()
	if err != nil {
		return fmt.Errorf("container backend: close run %s: %w", b.run, err)
	}
	return nil
}

// checkName accepts what Docker accepts in a container name part.
func checkName(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	for i, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || (i > 0 && (r == '_' || r == '.' || r == '-'))
		if !ok {
			return fmt.Errorf("%q: expected letters, digits and _.- (not first)", s)
		}
	}
	return nil
}

// containerUser is who a node's container runs as: the harness's own user
// (so the files in the run store are the user's), or, when the harness is
// root, the image's unprivileged user, to which the node's directory is
// then given.
func containerUser() (user string, chown bool) {
	if uid := os.Getuid(); uid != 0 {
		return fmt.Sprintf("%d:%d", uid, os.Getgid()), false
	}
	return fmt.Sprintf("%d:%d", UID, GID), true
}

func chownTree(dir string, uid, gid int) error {
	return filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// nodePlan is what a container needs beyond the image: the arguments with
// listen addresses moved to the container's interfaces, the ports to
// publish, and the host paths to mount.
type nodePlan struct {
	Args   []string
	Ports  []int
	Mounts []mount.Mount
}

// listenFlags are the tidal-server flags that name a listener. In the
// container the listener binds all of its interfaces on the same port,
// which is published on host (where the cluster allocated it).
var listenFlags = map[string]bool{"--client-addr": true, "--peer-addr": true}

// planNode rewrites spec's arguments for a container (see nodePlan). The
// node's directory is mounted read-write at its own path; every other
// absolute path among the arguments that exists on the host (a schema, a
// certs directory) is mounted read-only at its own path.
func planNode(spec cluster.NodeSpec, host string) (nodePlan, error) {
	if spec.Dir == "" || !filepath.IsAbs(spec.Dir) {
		return nodePlan{}, fmt.Errorf("node directory: expected an absolute path, found %q", spec.Dir)
	}
	p := nodePlan{Mounts: []mount.Mount{{Type: mount.TypeBind, Source: spec.Dir, Target: spec.Dir}}}
	mounted := map[string]bool{spec.Dir: true}
	args := append([]string(nil), spec.Args...)
	var advertise string // the client address as the cluster allocated it
	for i := 0; i < len(args); i++ {
		flag, value, inline := splitFlag(args[i])
		if listenFlags[flag] {
			vi := i
			if !inline {
				vi = i + 1
				if vi >= len(args) {
					return nodePlan{}, fmt.Errorf("%s: expected host:port after it, found nothing", flag)
				}
				value = args[vi]
			}
			h, port, err := net.SplitHostPort(value)
			if err != nil {
				return nodePlan{}, fmt.Errorf("%s %q: %w", flag, value, err)
			}
			n, err := strconv.Atoi(port)
			if err != nil || n <= 0 || n > 65535 {
				return nodePlan{}, fmt.Errorf("%s %q: expected a fixed port (the container publishes it), found %q", flag, value, port)
			}
			if h != host && h != "localhost" {
				return nodePlan{}, fmt.Errorf("%s %q: expected host %s (the backend's Host, where ports are published)", flag, value, host)
			}
			rewritten := net.JoinHostPort("0.0.0.0", port)
			if inline {
				args[i] = flag + "=" + rewritten
			} else {
				args[vi] = rewritten
				i = vi
			}
			p.Ports = append(p.Ports, n)
			if flag == "--client-addr" {
				advertise = value
			}
			continue
		}
		if flag == clockOffsetFlag {
			vi := i
			if !inline {
				vi = i + 1
				if vi >= len(args) {
					return nodePlan{}, fmt.Errorf("%s: expected a file path after it, found nothing", flag)
				}
				value = args[vi]
			}
			i = vi
			m, err := clockOffsetMount(spec.Dir, value)
			if err != nil {
				return nodePlan{}, err
			}
			if m != nil && !mounted[m.Source] {
				mounted[m.Source] = true
				p.Mounts = append(p.Mounts, *m)
			}
			continue
		}
		path := args[i]
		if inline {
			path = value
		}
		if !filepath.IsAbs(path) || filepath.Clean(path) == "/" {
			continue
		}
		path = filepath.Clean(path)
		if within(spec.Dir, path) || mounted[path] {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			continue
		}
		mounted[path] = true
		p.Mounts = append(p.Mounts, mount.Mount{Type: mount.TypeBind, Source: path, Target: path, ReadOnly: true})
	}
	// A node without certificates binds loopback only unless told
	// --insecure; here its listeners moved to 0.0.0.0 inside its own
	// network namespace, published on host only, which is what loopback
	// means for a process. (With --certs-dir both planes are TLS and no
	// exception is needed.)
	if len(p.Ports) > 0 && !hasFlag(args, "--certs-dir") && !hasFlag(args, "--insecure") {
		args = append(args, "--insecure")
	}
	// The node publishes the address the harness reaches it at (its
	// published port), not the container's 0.0.0.0.
	if advertise != "" && !hasFlag(args, "--advertise-client-addr") {
		args = append(args, "--advertise-client-addr", advertise)
	}
	p.Args = args
	return p, nil
}

// clockOffsetFlag is tidal-server's test-only clock offset file, which
// the node re-reads and the harness replaces (write a temporary file,
// rename it over the old one) to move the node's clock.
const clockOffsetFlag = "--test-clock-offset-file"

// clockOffsetMount is what the container needs to see the harness's
// offset file: nothing when it lies in the node's directory (mounted
// already, the cluster's default), else its directory, read-only. Never
// the file itself: a bind mount of a file pins the inode it found, so the
// node would never see the files the harness renames over it.
func clockOffsetMount(nodeDir, file string) (*mount.Mount, error) {
	if !filepath.IsAbs(file) {
		return nil, fmt.Errorf("%s %q: expected an absolute path (the container sees host paths at their own path)", clockOffsetFlag, file)
	}
	file = filepath.Clean(file)
	if within(nodeDir, file) {
		return nil, nil
	}
	dir := filepath.Dir(file)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%s %q: expected its directory to exist on the host (it is mounted into the container), found %v", clockOffsetFlag, file, err)
	}
	return &mount.Mount{Type: mount.TypeBind, Source: dir, Target: dir, ReadOnly: true}, nil
}

// hasFlag reports whether args hold flag, as "--flag", "--flag value" or
// "--flag=value".
func hasFlag(args []string, flag string) bool {
	for _, a := range args {
		if f, _, _ := splitFlag(a); f == flag {
			return true
		}
	}
	return false
}

// splitFlag splits "--name=value"; for anything else inline is false.
func splitFlag(arg string) (flag, value string, inline bool) {
	if len(arg) < 3 || arg[:2] != "--" {
		return arg, "", false
	}
	for i := 2; i < len(arg); i++ {
		if arg[i] == '=' {
			return arg[:i], arg[i+1:], true
		}
	}
	return arg, "", false
}

func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && filepath.IsLocal(rel)
}
