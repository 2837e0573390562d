package container

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/go-connections/nat"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tcp-relay/mesh"
)

// Inside the relay's container: the alias nodes dial, the control API's
// port, and the first client relay's port (the rest follow in name order).
// The container's network namespace is its own, so fixed ports are free.
const (
	RelayAlias      = "tcp-relay"
	relayControl    = 8474
	relayClientBase = 9001
)

// RelayMesh returns what cluster.Config.NewNetwork needs: it runs the
// relay mesh in a tcp-relay container on the run's network (log in
// dir/tcp-relay.log), drives it over its control API published on
// 127.0.0.1, and answers each node's peer relays as "tcp-relay:<port>"
// (dialed from the node's container) and each client relay as the
// 127.0.0.1 port it is published on (dialed by the harness).
func (b *Backend) RelayMesh(dir string) func(map[string]mesh.Node) (cluster.Network, error) {
	return func(nodes map[string]mesh.Node) (cluster.Network, error) {
		n, err := b.startMesh(dir, nodes)
		if err != nil {
			return nil, fmt.Errorf("container backend: relay mesh: %w", err)
		}
		return n, nil
	}
}

func (b *Backend) startMesh(dir string, nodes map[string]mesh.Node) (cluster.Network, error) {
	if b.relayImage == "" {
		return nil, errors.New("no tcp-relay image: Options.RelayBinary is required for the relay mesh")
	}
	names := make([]string, 0, len(nodes))
	for n := range nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	plan, err := planMesh(nodes, names)
	if err != nil {
		return nil, err
	}
	ctl := nat.Port(strconv.Itoa(relayControl) + "/tcp")
	cfg := &container.Config{
		Image:        b.relayImage,
		Cmd:          []string{"--control", net.JoinHostPort("0.0.0.0", strconv.Itoa(relayControl))},
		Hostname:     RelayAlias,
		Labels:       b.labels(RelayAlias),
		ExposedPorts: nat.PortSet{ctl: {}},
	}
	// Ephemeral host ports: Docker picks free ones at start, so nothing
	// races the allocation the cluster did for the nodes.
	hc := &container.HostConfig{PortBindings: nat.PortMap{ctl: {{HostIP: b.Host()}}}, NetworkMode: container.NetworkMode(b.network)}
	for _, n := range names {
		p := nat.Port(strconv.Itoa(plan.ClientPorts[n]) + "/tcp")
		cfg.ExposedPorts[p] = struct{}{}
		hc.PortBindings[p] = []nat.PortBinding{{HostIP: b.Host()}}
	}
	h, err := b.launch(RelayAlias, cfg, hc, filepath.Join(dir, "tcp-relay.log"))
	if err != nil {
		return nil, err
	}
	fail := func(err error) (cluster.Network, error) {
		h.Kill()
		return nil, err
	}
	published, err := b.publishedPorts(h.id)
	if err != nil {
		return fail(err)
	}
	ctlAddr, ok := published[relayControl]
	if !ok {
		return fail(fmt.Errorf("relay container %s: control port %d not published (found %v)", h.name, relayControl, published))
	}
	api := control.NewClient(ctlAddr, &http.Client{Timeout: 10 * time.Second})
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := waitHealthy(ctx, api, h); err != nil {
		return fail(fmt.Errorf("relay container %s, control API at %s: %w (log %s)", h.name, ctlAddr, err, filepath.Join(dir, "tcp-relay.log")))
	}
	info, err := api.CreateMesh(ctx, control.MeshConfig{Nodes: plan.Upstreams, Host: "0.0.0.0", ClientPorts: plan.ClientPorts})
	if err != nil {
		return fail(fmt.Errorf("relay container %s: create mesh of %v: %w", h.name, names, err))
	}
	if err := plan.rewrite(&info, published); err != nil {
		return fail(fmt.Errorf("relay container %s: %w", h.name, err))
	}
	b.log.Info("relay mesh up", "container", h.name, "control", ctlAddr, "nodes", names)
	return &relayNetwork{RemoteNetwork: cluster.NewRemoteNetwork(api, info, b.log), relay: h}, nil
}

// meshPlan is the mesh as the relay container sees it: each node's
// upstreams by its alias on the run's network, and a fixed port per
// client relay.
type meshPlan struct {
	Upstreams   map[string]mesh.Node
	ClientPorts map[string]int
}

// planMesh maps the addresses the cluster allocated on the host to the
// relay container's view: a node listens on the same port numbers in its
// own container, reached by its alias.
func planMesh(nodes map[string]mesh.Node, names []string) (meshPlan, error) {
	p := meshPlan{Upstreams: map[string]mesh.Node{}, ClientPorts: map[string]int{}}
	for i, n := range names {
		if err := checkName(n); err != nil {
			return meshPlan{}, fmt.Errorf("node name: %w", err)
		}
		_, peer, err := net.SplitHostPort(nodes[n].Peer)
		if err != nil {
			return meshPlan{}, fmt.Errorf("node %s: peer address: %w", n, err)
		}
		_, cl, err := net.SplitHostPort(nodes[n].Client)
		if err != nil {
			return meshPlan{}, fmt.Errorf("node %s: client address: %w", n, err)
		}
		p.Upstreams[n] = mesh.Node{Peer: net.JoinHostPort(n, peer), Client: net.JoinHostPort(n, cl)}
		p.ClientPorts[n] = relayClientBase + i
	}
	return p, nil
}

// rewrite turns the relay's own view of its listeners (0.0.0.0:port) into
// what each side dials: peer relays by the relay's alias, from the nodes'
// containers; client relays at their published host address.
func (p meshPlan) rewrite(info *control.MeshInfo, published map[int]string) error {
	for name, n := range info.Nodes {
		for to, addr := range n.Peers {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return fmt.Errorf("peer relay %s->%s: %w", name, to, err)
			}
			n.Peers[to] = net.JoinHostPort(RelayAlias, port)
		}
		want := p.ClientPorts[name]
		_, port, err := net.SplitHostPort(n.ClientAddr)
		if err != nil || port != strconv.Itoa(want) {
			return fmt.Errorf("client relay of %s: expected it on port %d, found %q", name, want, n.ClientAddr)
		}
		host, ok := published[want]
		if !ok {
			return fmt.Errorf("client relay of %s: port %d is not published (found %v)", name, want, published)
		}
		n.ClientAddr = host
		info.Nodes[name] = n
	}
	return nil
}

// publishedPorts maps each published container port of id to its host
// address.
func (b *Backend) publishedPorts(id string) (map[int]string, error) {
	ctx, cancel := context.WithTimeout(b.ctx, callTimeout)
	defer cancel()
	in, err := b.cli.ContainerInspect(ctx, id)
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	if in.NetworkSettings == nil {
		return out, nil
	}
	for port, bindings := range in.NetworkSettings.Ports {
		for _, bnd := range bindings {
			if bnd.HostIP == "127.0.0.1" && bnd.HostPort != "" {
				out[port.Int()] = net.JoinHostPort(bnd.HostIP, bnd.HostPort)
			}
		}
	}
	return out, nil
}

// waitHealthy polls the control API until it answers, the container
// exits, or ctx ends.
func waitHealthy(ctx context.Context, api *control.Client, h *Handle) error {
	for {
		hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := api.Healthz(hctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-h.Exited():
			st, _ := h.ExitStatus()
			return fmt.Errorf("the relay exited (%s) before /healthz answered", st.Text)
		case <-ctx.Done():
			return fmt.Errorf("expected /healthz to answer, last error: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// relayNetwork is the remote mesh of the relay container; closing it also
// stops the container.
type relayNetwork struct {
	*cluster.RemoteNetwork
	relay *Handle
}

// Relay is the relay container's handle.
func (n *relayNetwork) Relay() *Handle { return n.relay }

// Close deletes the mesh and kills the relay container (Backend.Close
// removes it).
func (n *relayNetwork) Close() error {
	err := n.RemoteNetwork.Close()
	if kerr := n.relay.Kill(); err == nil {
		err = kerr
	}
	return err
}
