package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/process"
)

// etcdCluster is n etcd processes on loopback with their defaults
// (fsync on every commit, snapshot every 100,000 entries), each with its
// own data directory and log file.
type etcdCluster struct {
	dir     string
	nodes   []*process.Process
	clients []string // client addresses, host:port
}

// startEtcd launches n members under dir and waits until every member
// reports itself healthy (which etcd does only once there is a leader).
// On error, whatever started is stopped.
func startEtcd(ctx context.Context, binary, dir string, n int) (_ *etcdCluster, err error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	var initial []string
	for i := range n {
		initial = append(initial, fmt.Sprintf("e%d=http://127.0.0.1:%d", i+1, ports[n+i]))
	}
	c := &etcdCluster{dir: dir}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	token := fmt.Sprintf("tidal-bench-%d", time.Now().UnixNano())
	for i := range n {
		name := fmt.Sprintf("e%d", i+1)
		nodeDir := filepath.Join(dir, name)
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			return nil, err
		}
		clientURL := fmt.Sprintf("http://127.0.0.1:%d", ports[i])
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[n+i])
		p, err := process.Start(process.Spec{
			Name:   name,
			Binary: binary,
			Args: []string{"--name", name, "--data-dir", filepath.Join(nodeDir, "data"),
				"--listen-client-urls", clientURL, "--advertise-client-urls", clientURL,
				"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
				"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-token", token,
				"--initial-cluster-state", "new"},
			Dir:     nodeDir,
			LogPath: filepath.Join(nodeDir, "etcd.log"),
		}, nil)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, p)
		c.clients = append(c.clients, fmt.Sprintf("127.0.0.1:%d", ports[i]))
	}
	return c, c.waitHealthy(ctx, 30*time.Second)
}

// waitHealthy polls every member's /health until all say "true".
func (c *etcdCluster) waitHealthy(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	var last string
	for {
		healthy := 0
		for i, addr := range c.clients {
			if !c.nodes[i].Running() {
				return fmt.Errorf("etcd member %s exited while starting: %v (log in %s)", c.nodes[i].Name(), c.nodes[i].ExitErr(), c.nodes[i].LogPath())
			}
			ok, err := etcdHealthy(ctx, hc, addr)
			if err != nil {
				last = fmt.Sprintf("%s: %v", addr, err)
				continue
			}
			if ok {
				healthy++
			}
		}
		if healthy == len(c.clients) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("expected the %d etcd members healthy within %s, found %d (last: %s; logs in %s)", len(c.clients), within, healthy, last, c.dir)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func etcdHealthy(ctx context.Context, hc *http.Client, addr string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/health", nil)
	if err != nil {
		return false, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return false, fmt.Errorf("/health: %w", err)
	}
	return h.Health == "true", nil
}

// stop terminates every member by pid (SIGTERM to its process group,
// SIGKILL after 10 s: an etcd 3.4 member whose peers are gone can wait
// out its own election before it exits).
func (c *etcdCluster) stop() error {
	var errs []error
	for _, p := range c.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := p.Terminate(ctx); err != nil && !strings.Contains(err.Error(), "killed") {
			errs = append(errs, err)
		}
		cancel()
	}
	return errors.Join(errs...)
}
