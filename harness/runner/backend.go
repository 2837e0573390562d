package runner

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/container"
	"github.com/tidaldb/tidal/harness/process"
	"github.com/tidaldb/tidal/tcp-relay/mesh"
)

// Backends a run can use (Config.Backend).
const (
	BackendProcess = "process"
	BackendDocker  = "docker"
)

// startBackend starts what runs the nodes. For docker it also returns the
// relay mesh builder (a tcp-relay container on the run's network), whose
// image is built from relayBin, by default the tcp-relay beside the server
// binary.
func startBackend(ctx context.Context, cfg Config, serverBin, relayBin string, reg *process.Registry, nodesDir string, log *slog.Logger) (cluster.Backend, func(map[string]mesh.Node) (cluster.Network, error), error) {
	switch cfg.Backend {
	case "", BackendProcess:
		b, err := process.NewBackend(serverBin, reg)
		return b, nil, err
	case BackendDocker:
		if relayBin == "" {
			relayBin = filepath.Join(filepath.Dir(serverBin), "tcp-relay")
		}
		if _, err := os.Stat(relayBin); err != nil {
			return nil, nil, fmt.Errorf("backend docker: the relay mesh runs in a tcp-relay container built from a static tcp-relay binary: %w (build it with `make build`, or pass --relay-bin)", err)
		}
		b, err := container.New(ctx, container.Options{ServerBinary: serverBin, RelayBinary: relayBin, Logger: log})
		if err != nil {
			return nil, nil, err
		}
		return b, b.RelayMesh(filepath.Join(nodesDir, "tcp-relay")), nil
	}
	return nil, nil, fmt.Errorf("backend: expected %s or %s, found %q", BackendProcess, BackendDocker, cfg.Backend)
}
