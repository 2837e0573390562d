package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/process"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// cluster is three tidal-server processes on loopback, each with its own
// data directory and log file, talking to each other directly (no relay:
// the benchmark measures the server, not the fault injector).
type cluster struct {
	dir     string
	nodes   []*process.Process
	clients []string        // client addresses, host:port
	grpc    []string        // gRPC ingest addresses (--grpc-addr); nil unless asked for
	opts    []client.Option // how to reach a secured cluster (none: plaintext)
}

// nodeOptions are how startCluster runs its nodes beyond the defaults.
type nodeOptions struct {
	// secure: every node runs with its --certs-dir and the cluster is
	// reached over TLS with the writer's certificate (nil: plaintext).
	secure *clusterCerts
	// grpc: every node also serves the gRPC ingest stream (--grpc-addr,
	// over TLS too when secure).
	grpc bool
	// extra are more tidal-server flags for every node.
	extra []string
}

// benchClientName is the client certificate the benchmark presents to a
// secured cluster: a writer, what an ingesting application would be.
const benchClientName = "writer"

// clusterCerts are a secured cluster's certificates: one CA, a directory
// per member (ca.crt, node.crt/key naming the member, as README's secure
// cluster makes them) and the clients' directory (ca.crt and
// client.writer.crt/key).
type clusterCerts struct {
	clientDir string
	nodeDirs  []string
}

// makeClusterCerts makes a CA and the certificates of n members on
// 127.0.0.1 and of the benchmark's writer under dir, with the same
// package `tidal-server certs` uses.
func makeClusterCerts(dir string, n int) (*clusterCerts, error) {
	cc := &clusterCerts{clientDir: filepath.Join(dir, "clients")}
	caKey := filepath.Join(dir, "ca.key")
	if _, err := certs.CreateCA(certs.CreateOptions{CertsDir: cc.clientDir, CAKey: caKey}); err != nil {
		return nil, err
	}
	caCert, err := os.ReadFile(filepath.Join(cc.clientDir, certs.CACertFile))
	if err != nil {
		return nil, err
	}
	for i := range n {
		nd := filepath.Join(dir, "n"+strconv.Itoa(i+1))
		if err := os.MkdirAll(nd, 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(nd, certs.CACertFile), caCert, 0o644); err != nil {
			return nil, err
		}
		if _, err := certs.CreateNode(certs.CreateOptions{CertsDir: nd, CAKey: caKey}, uint64(i+1), []string{"127.0.0.1", "localhost"}); err != nil {
			return nil, err
		}
		cc.nodeDirs = append(cc.nodeDirs, nd)
	}
	if _, err := certs.CreateClient(certs.CreateOptions{CertsDir: cc.clientDir, CAKey: caKey}, benchClientName, auth.Writer); err != nil {
		return nil, err
	}
	return cc, nil
}

// startCluster launches n nodes under dir, as no asks, and waits until
// they agree on a leader. On error, whatever started is stopped.
func startCluster(ctx context.Context, binary, dir string, n int, no nodeOptions) (_ *cluster, err error) {
	secure := no.secure
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	var peers []string
	for i := range n {
		peers = append(peers, fmt.Sprintf("%d=127.0.0.1:%d", i+1, ports[n+i]))
	}
	c := &cluster{dir: dir}
	if secure != nil {
		if len(secure.nodeDirs) != n {
			return nil, fmt.Errorf("expected certificates for %d members, found %d", n, len(secure.nodeDirs))
		}
		tlsCfg, err := certs.ClientTLS(secure.clientDir, benchClientName)
		if err != nil {
			return nil, err
		}
		c.opts = []client.Option{client.WithTLS(tlsCfg)}
	}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	for i := range n {
		id := strconv.Itoa(i + 1)
		nodeDir := filepath.Join(dir, "n"+id)
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			return nil, err
		}
		clientAddr := fmt.Sprintf("127.0.0.1:%d", ports[i])
		args := []string{"run", "--id", id, "--peers", strings.Join(peers, ","),
			"--client-addr", clientAddr, "--peer-addr", fmt.Sprintf("127.0.0.1:%d", ports[n+i]),
			"--data-dir", filepath.Join(nodeDir, "data"), "--log-file", filepath.Join(nodeDir, "node.log")}
		if no.grpc {
			grpcAddr := fmt.Sprintf("127.0.0.1:%d", ports[2*n+i])
			args = append(args, "--grpc-addr", grpcAddr)
			c.grpc = append(c.grpc, grpcAddr)
		}
		if secure != nil {
			args = append(args, "--certs-dir", secure.nodeDirs[i])
		}
		p, err := process.Start(process.Spec{
			Name:   "n" + id,
			Binary: binary,
			Args:   append(args, no.extra...),
			Dir:    nodeDir,
			// The node logs to its file; this one catches what it prints
			// before the logger is up (flag errors, panics).
			LogPath: filepath.Join(nodeDir, "stdout.log"),
		}, nil)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, p)
		c.clients = append(c.clients, clientAddr)
	}
	return c, c.waitForLeader(ctx, 30*time.Second)
}

// waitForLeader polls every node until all name the same leader.
func (c *cluster) waitForLeader(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var last string
	for {
		leaders := map[uint64]bool{}
		for i, addr := range c.clients {
			if !c.nodes[i].Running() {
				return fmt.Errorf("node %s exited while starting: %v (logs in %s)", c.nodes[i].Name(), c.nodes[i].ExitErr(), c.dir)
			}
			cl := client.New(addr, append([]client.Option{client.WithRetries(0), client.WithTimeout(time.Second)}, c.opts...)...)
			st, err := cl.Status(ctx)
			cl.CloseIdleConnections()
			if err != nil {
				last = fmt.Sprintf("%s: %v", addr, err)
				leaders[0] = true
				continue
			}
			leaders[st.Leader] = true
		}
		if len(leaders) == 1 && !leaders[0] {
			return nil
		}
		if last == "" {
			last = fmt.Sprintf("leaders seen: %v", leaders)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("expected the %d nodes to agree on a leader within %s, found none (last: %s; logs in %s)", len(c.nodes), within, last, c.dir)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop terminates every node (SIGTERM to its process group, SIGKILL after
// the drain deadline).
func (c *cluster) stop() error {
	var errs []error
	for _, p := range c.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		errs = append(errs, p.Terminate(ctx))
		cancel()
	}
	return errors.Join(errs...)
}

// freePorts asks the kernel for n distinct free loopback ports. Another
// program may take one before the node binds it; the node then fails to
// start and says so, which waitForLeader reports.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free loopback port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
