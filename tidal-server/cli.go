package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/tidaldb/tidal/tidal-server/peer"
	"github.com/tidaldb/tidal/tidal-server/server"
	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.yaml.in/yaml/v3"
)

// exitError carries a specific exit status (e.g. wal verify finding damage).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}

func newRootCommand() *cobra.Command {
	run := newRunCommand()
	root := &cobra.Command{
		Use:   "tidal-server",
		Short: "A replicated store for time-decayed signals and embeddings",
		Long: `tidal-server stores engagement signals (view, like, share, ...) on numeric
entity ids, folded into counts, decayed scores and windowed counts, plus one
embedding vector per entity. Nodes replicate with raft; a write is
acknowledged once it is durable on a quorum and applied on the node that
took it.

Run with no arguments to start a single node on 127.0.0.1:7070 with its data
in ./tidal-data (the same as "tidal-server run").`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// No subcommand: behave as `run` with its flags.
		RunE: run.RunE,
	}
	root.Flags().AddFlagSet(run.Flags())
	root.AddCommand(run, newStatusCommand(), newMembersCommand(), newTransferLeaderCommand(),
		newBackupCommand(), newRestoreCommand(), newWALCommand())
	root.AddCommand(newCertsCommand(), newTokensCommand())
	return root
}

func newRunCommand() *cobra.Command {
	cfg := server.DefaultConfig()
	var configFile, logLevel, logFormat, logFile string
	var drainTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run a node (the default command)",
		Long: `Run a tidal-server node until SIGTERM or SIGINT.

On SIGTERM the node stops accepting requests, lets in-flight writes finish
(each is bounded by --write-timeout), stops raft, closes the WAL and exits 0.
Every acknowledged write was fsynced before it was acknowledged.

Flags override the --config file; the file's keys are the flag names with
underscores (client_addr, data_dir, ...).`,
		Example: `  # one node, defaults
  tidal-server run

  # node 1 of a 3-node cluster on one machine
  tidal-server run --id 1 --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 \
    --client-addr 127.0.0.1:7071 --peer-addr 127.0.0.1:7101 --data-dir n1

  # a fourth node, after: curl -XPOST 127.0.0.1:7071/admin/members -H 'Content-Type: application/json' \
  #   -d '{"id":4,"peer_addr":"127.0.0.1:7104","client_addr":"127.0.0.1:7074"}'
  tidal-server run --id 4 --join --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103,4=127.0.0.1:7104 \
    --client-addr 127.0.0.1:7074 --peer-addr 127.0.0.1:7104 --data-dir n4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				fileCfg, err := loadConfigFile(configFile)
				if err != nil {
					return err
				}
				cfg = mergeConfig(fileCfg, cfg, cmd.Flags())
			}
			log, closeLog, err := newLogger(logLevel, logFormat, logFile)
			if err != nil {
				return err
			}
			defer closeLog()
			cfg.Transport = peer.Factory(peer.Options{})
			srv, err := server.Start(cfg, log)
			if err != nil {
				return err
			}
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
			defer signal.Stop(sigs)
			select {
			case sig := <-sigs:
				log.Info("signal received; shutting down", "signal", sig.String())
			case err := <-srv.Err():
				log.Error("serving failed", "err", err)
				srv.Shutdown(context.Background())
				return err
			case <-srv.ReplicaDone():
				log.Error("replica stopped; shutting down")
			}
			ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
			defer cancel()
			return srv.Shutdown(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&configFile, "config", "", "YAML config file (keys = flag names with underscores)")
	f.Uint64Var(&cfg.ID, "id", cfg.ID, "this node's id (> 0, unique, never reused)")
	f.StringVar(&cfg.ClientAddr, "client-addr", cfg.ClientAddr, "HTTP API listen address")
	f.StringVar(&cfg.PeerAddr, "peer-addr", cfg.PeerAddr, "raft peer (gRPC) listen address")
	f.StringVar(&cfg.Peers, "peers", cfg.Peers, "initial cluster: id=host:port,... (peer addresses); empty = single node")
	f.StringVar(&cfg.PeerDial, "peer-dial", cfg.PeerDial, "dial address rewrites: advertised=dial,... host:port pairs (route links through relays)")
	f.BoolVar(&cfg.Join, "join", cfg.Join, "join an existing cluster that added this node with /admin/members")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the WAL and snapshots")
	f.StringVar(&cfg.SchemaPath, "schema", cfg.SchemaPath, "signal schema YAML (default: view, like, share, skip; 1536-dim embeddings)")
	f.DurationVar(&cfg.TickInterval, "tick-interval", 100*time.Millisecond, "raft tick")
	f.IntVar(&cfg.ElectionTicks, "election-ticks", 10, "ticks without a leader before an election")
	f.IntVar(&cfg.HeartbeatTicks, "heartbeat-ticks", 1, "ticks between leader heartbeats")
	f.Uint64Var(&cfg.MaxSizePerMsg, "max-size-per-msg", 1<<20, "max bytes of entries per append message")
	f.IntVar(&cfg.MaxInflightMsgs, "max-inflight-msgs", 256, "replication window: append messages in flight per follower")
	f.Uint64Var(&cfg.MaxUncommittedBytes, "max-uncommitted-bytes", 64<<20, "uncommitted log bytes before writes get 503")
	f.Uint64Var(&cfg.SnapshotEvery, "snapshot-every", 10000, "applied entries between snapshots")
	f.Uint64Var(&cfg.SnapshotCatchUp, "snapshot-catch-up", 5000, "entries kept after a snapshot for slow followers")
	f.Uint64Var(&cfg.ReadyWithin, "ready-within", cfg.ReadyWithin, "/readyz fails while applied is more than this behind commit")
	f.Int64Var(&cfg.WALSegmentSize, "wal-segment-size", 64<<20, "WAL segment file size (preallocated)")
	f.IntVar(&cfg.WALBatchMaxBytes, "wal-batch-max-bytes", 4<<20, "max bytes one group commit writes")
	f.DurationVar(&cfg.WALBatchTimeout, "wal-batch-timeout", 0, "how long a group commit may wait to gather more appends")
	f.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", 8<<20, "max request body (413 above)")
	f.IntVar(&cfg.MaxBatch, "max-batch", 10000, "max events per POST /v1/signals (413 above)")
	f.IntVar(&cfg.MaxInflightWrites, "max-inflight-writes", 4096, "writes admitted at once; more get 503 + Retry-After")
	f.DurationVar(&cfg.WriteTimeout, "write-timeout", 5*time.Second, "time a write may wait for commit before 504 (outcome unknown)")
	f.IntVar(&cfg.IDsPerGeneration, "ids-per-generation", 500000, "event id memory: a retry is recognised within this many later ids")
	f.BoolVar(&cfg.EnablePprof, "enable-pprof", false, "serve Go's /debug/pprof/ on the client address")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	f.StringVar(&logFile, "log-file", "", "write logs to this file instead of stderr")
	f.DurationVar(&drainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM, how long to wait for in-flight requests")
	return cmd
}

func loadConfigFile(path string) (server.Config, error) {
	cfg := server.DefaultConfig()
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, err
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// mergeConfig takes the file's values, then every flag the user set.
func mergeConfig(file, flags server.Config, set *pflag.FlagSet) server.Config {
	out := file
	set.Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "id":
			out.ID = flags.ID
		case "client-addr":
			out.ClientAddr = flags.ClientAddr
		case "peer-addr":
			out.PeerAddr = flags.PeerAddr
		case "peers":
			out.Peers = flags.Peers
		case "peer-dial":
			out.PeerDial = flags.PeerDial
		case "join":
			out.Join = flags.Join
		case "data-dir":
			out.DataDir = flags.DataDir
		case "schema":
			out.SchemaPath = flags.SchemaPath
		case "tick-interval":
			out.TickInterval = flags.TickInterval
		case "election-ticks":
			out.ElectionTicks = flags.ElectionTicks
		case "heartbeat-ticks":
			out.HeartbeatTicks = flags.HeartbeatTicks
		case "max-size-per-msg":
			out.MaxSizePerMsg = flags.MaxSizePerMsg
		case "max-inflight-msgs":
			out.MaxInflightMsgs = flags.MaxInflightMsgs
		case "max-uncommitted-bytes":
			out.MaxUncommittedBytes = flags.MaxUncommittedBytes
		case "snapshot-every":
			out.SnapshotEvery = flags.SnapshotEvery
		case "snapshot-catch-up":
			out.SnapshotCatchUp = flags.SnapshotCatchUp
		case "ready-within":
			out.ReadyWithin = flags.ReadyWithin
		case "wal-segment-size":
			out.WALSegmentSize = flags.WALSegmentSize
		case "wal-batch-max-bytes":
			out.WALBatchMaxBytes = flags.WALBatchMaxBytes
		case "wal-batch-timeout":
			out.WALBatchTimeout = flags.WALBatchTimeout
		case "max-body-bytes":
			out.MaxBodyBytes = flags.MaxBodyBytes
		case "max-batch":
			out.MaxBatch = flags.MaxBatch
		case "max-inflight-writes":
			out.MaxInflightWrites = flags.MaxInflightWrites
		case "write-timeout":
			out.WriteTimeout = flags.WriteTimeout
		case "enable-pprof":
			out.EnablePprof = flags.EnablePprof
		case "ids-per-generation":
			out.IDsPerGeneration = flags.IDsPerGeneration
		}
	})
	return out
}

func newLogger(level, format, file string) (*slog.Logger, func(), error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, fmt.Errorf("--log-level: expected debug, info, warn or error, found %q", level)
	}
	var w io.Writer = os.Stderr
	closeFn := func() {}
	if file != "" {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return nil, nil, err
		}
		f, err := os.OpenFile(file, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return nil, nil, fmt.Errorf("--log-file: %w", err)
		}
		w = f
		closeFn = func() { f.Close() }
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), closeFn, nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), closeFn, nil
	}
	closeFn()
	return nil, nil, fmt.Errorf("--log-format: expected text or json, found %q", format)
}

func newWALCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "wal",
		Short: "Inspect or repair a node's write-ahead log (the node must be stopped)",
	}
	var dataDir string
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Scan every WAL segment and report the first damaged record",
		Long: `Scan every segment of the WAL read-only. Exit status 0 when every record is
intact; 3 when a problem is found (file and offset are printed). A torn tail
in the newest segment is reported but is normal after a crash: the node
truncates it on start.`,
		Example: "  tidal-server wal verify --data-dir n1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := wal.Verify(filepath.Join(dataDir, "wal"))
			if rep != nil {
				fmt.Fprint(cmd.OutOrStdout(), rep.String())
			}
			if err != nil {
				return &exitError{code: 3, err: err}
			}
			return nil
		},
	}
	repair := &cobra.Command{
		Use:   "repair",
		Short: "Truncate the WAL after its last good record and report what was dropped",
		Long: `Truncate the WAL after the last record that checks out, removing everything
after it, and print what was dropped. Acknowledged writes in the dropped
part are lost from this node: prefer wiping the node and letting it catch
up from the cluster (runbooks/) unless it is the only copy.`,
		Example: "  tidal-server wal repair --data-dir n1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := wal.Repair(filepath.Join(dataDir, "wal"))
			if rep != nil {
				fmt.Fprint(cmd.OutOrStdout(), rep.String())
			}
			return err
		},
	}
	for _, c := range []*cobra.Command{verify, repair} {
		c.Flags().StringVar(&dataDir, "data-dir", "tidal-data", "the node's data directory")
	}
	cmd.AddCommand(verify, repair)
	return cmd
}
