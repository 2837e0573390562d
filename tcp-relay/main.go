// Command tcp-relay serves relays and a mesh under an HTTP control API.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/tidaldb/tidal/buildinfo"
	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tcp-relay/relay"
)

// fileConfig is the --config file: relays (with optional initial faults)
// and an optional mesh.
type fileConfig struct {
	Relays []control.RelayConfig `yaml:"relays"`
	Mesh   *control.MeshConfig   `yaml:"mesh"`
}

func loadConfig(path string) (fileConfig, error) {
	var cfg fileConfig
	f, err := os.Open(path)
	if err != nil {
		return cfg, err
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

func faultHelp() string {
	var b strings.Builder
	b.WriteString("Faults (POST /relays/{name}/faults; common fields: name, type, direction\n")
	b.WriteString("upstream|downstream|both (default both; upstream = client->server),\n")
	b.WriteString("toxicity 0..1 (default 1, drawn once per connection)):\n")
	for _, t := range relay.Types {
		attrs := t.Attributes
		if attrs == "" {
			attrs = "-"
		}
		fmt.Fprintf(&b, "  %-11s %-40s %s\n", t.Type, attrs, t.Doc)
	}
	return b.String()
}

const example = `Config file (YAML):
  relays:
    - name: db
      listen: 127.0.0.1:26379
      upstream: 127.0.0.1:6379
      faults:
        - {type: latency, latency_ms: 20, jitter_ms: 5, direction: downstream}
  mesh:
    nodes:
      n1: {peer: 127.0.0.1:7001, client: 127.0.0.1:8001}
      n2: {peer: 127.0.0.1:7002, client: 127.0.0.1:8002}
      n3: {peer: 127.0.0.1:7003, client: 127.0.0.1:8003}

Examples:
  curl -s -XPOST localhost:8474/relays -d '{"name":"db","listen":"127.0.0.1:0","upstream":"127.0.0.1:6379"}'
  curl -s -XPOST localhost:8474/relays/db/faults -d '{"type":"latency","latency_ms":100,"jitter_ms":10}'
  curl -s -XPOST localhost:8474/relays/db/faults -d '{"name":"cut","type":"blackhole","direction":"upstream"}'
  curl -s -XDELETE localhost:8474/relays/db/faults/cut
  curl -s -XPOST localhost:8474/mesh/partition -d '{"kind":"isolate","node":"n1"}'
  curl -s -XPOST localhost:8474/mesh/heal
  curl -s -XPOST localhost:8474/reset
`

func main() {
	var controlAddr, configPath, logLevel string
	cmd := &cobra.Command{
		Use:   "tcp-relay",
		Short: "TCP relays with live fault injection and cluster-shaped partitions, under an HTTP API",
		Long: "tcp-relay forwards TCP connections to upstreams and injects faults into them on command.\n" +
			"Every change acts on existing and new connections when the API call returns.\n\n" +
			faultHelp() + "\n" +
			"Mesh partitions (POST /mesh/partition {kind,...}): halves [order], isolate {node},\n" +
			"oneway {from,to}, bridge [order], majorities-ring [order], groups {groups}.\n\n" + example,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: expected debug, info, warn or error, found %q", logLevel)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return run(ctx, log, controlAddr, configPath)
		},
	}
	// --version: the same one line every tidal binary prints.
	cmd.Version = buildinfo.Read().String()
	cmd.SetVersionTemplate(buildinfo.Line("tcp-relay") + "\n")
	cmd.Flags().StringVar(&controlAddr, "control", "127.0.0.1:8474", "address of the HTTP control API")
	cmd.Flags().StringVar(&configPath, "config", "", "YAML file declaring relays and an optional mesh")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger, controlAddr, configPath string) error {
	srv := control.NewServer(log)
	defer srv.Close()
	if configPath != "" {
		cfg, err := loadConfig(configPath)
		if err != nil {
			return err
		}
		for _, rc := range cfg.Relays {
			if _, err := srv.AddRelay(rc); err != nil {
				return fmt.Errorf("config %s: relay %q: %w", configPath, rc.Name, err)
			}
		}
		if cfg.Mesh != nil {
			if _, err := srv.CreateMesh(*cfg.Mesh); err != nil {
				return fmt.Errorf("config %s: mesh: %w", configPath, err)
			}
		}
	}
	ln, err := net.Listen("tcp", controlAddr)
	if err != nil {
		return fmt.Errorf("control API: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	log.Info("control API listening", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("control API: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("control API shutdown", "err", err)
	}
	return srv.Close()
}
