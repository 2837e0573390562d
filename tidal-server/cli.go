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
	"github.com/tidaldb/tidal/buildinfo"
	"github.com/tidaldb/tidal/tidal-server/ingest"
	"github.com/tidaldb/tidal/tidal-server/peer"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/server"
	"github.com/tidaldb/tidal/tidal-server/wal"
	"github.com/tidaldb/tidal/usage"
	"go.yaml.in/yaml/v3"
)

// Exit statuses of tidal-server; `run --help` lists them (runExitStatuses)
// and README.md repeats them. Each outcome a supervisor must tell apart
// has its own.
const (
	exitOK      = 0 // clean stop (SIGTERM, SIGINT), or a command that succeeded
	exitFailed  = 1 // could not start, bad flags, or failed while serving
	exitDamage  = 3 // wal verify found damage; wal repair refused to cut
	exitFenced  = 4 // the node fenced itself after a failed WAL or snapshot write/fsync
	exitRemoved = 5 // the node was removed from the cluster (expected, not an error)
)

const runExitStatuses = `Exit status:
  0  stopped cleanly by SIGTERM or SIGINT (leadership handed off, in-flight
     requests drained)
  1  could not start (a bad flag value, a port in use, a data dir that belongs to
     another schema or cluster, or was written in a newer format than this
     build reads: the error names the file and both versions) or failed
     while serving (a log entry in a format this build cannot read)
  4  fenced: a WAL or snapshot write or fsync failed, so the node stopped
     writing, refused requests and exited; fix the disk and start it again
     (recovery keeps every acknowledged write)
  5  removed: this node was removed from the cluster; its id is retired,
     so add the machine back as a new member with an empty data dir
 64  usage: an unknown flag or subcommand, a flag value that does not
     parse, or the wrong number of arguments (the same in every tidal
     binary)`

// exitError carries a specific exit status (e.g. wal verify finding damage).
// notAnError marks outcomes that are expected (a removed node stopping):
// main prints them without the "error:" prefix.
type exitError struct {
	code       int
	err        error
	notAnError bool
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if usage.Is(err) {
		return usage.Code
	}
	return exitFailed
}

func isExpectedExit(err error) bool {
	var ee *exitError
	return errors.As(err, &ee) && ee.notAnError
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
		Version:       buildinfo.Read().String(),
		// No subcommand: behave as `run` with its flags.
		RunE: run.RunE,
	}
	root.Long += "\n\n" + runExitStatuses
	root.SetVersionTemplate(buildinfo.Line("tidal-server") + "\n")
	root.Flags().AddFlagSet(run.Flags())
	root.AddCommand(run, newStatusCommand(), newMembersCommand(), newTransferLeaderCommand(),
		newBackupCommand(), newRestoreCommand(), newRecoverCommand(), newWALCommand(), newVersionCommand())
	root.AddCommand(newCertsCommand(), newTokensCommand())
	usage.Install(root)
	return root
}

func newVersionCommand() *cobra.Command {
	var formats bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go toolchain this binary was built from",
		Long: `Print the version, commit and Go toolchain this binary was built from.

With --formats, also the on-disk and wire formats this build writes and
reads, one "name written readable" line each (docs/ARCHITECTURE.md,
"Format versions"): before an upgrade or a rollback, compare them between
the two builds.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			fmt.Fprintln(out, buildinfo.Line("tidal-server"))
			if formats {
				fmt.Fprintf(out, "wal-segment %d %d-%d\n", wal.FormatVersion, wal.MinFormatVersion, wal.FormatVersion)
				fmt.Fprintf(out, "snapshot %d %d-%d\n", replica.SnapshotFormatVersion, replica.MinSnapshotFormatVersion, replica.SnapshotFormatVersion)
				fmt.Fprintf(out, "entry %d 1-%d\n", replica.EntryFormat, replica.EntryFormat)
				fmt.Fprintf(out, "peer-protocol %d %d-%d\n", peer.ProtocolVersion, peer.MinProtocolVersion, peer.ProtocolVersion)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&formats, "formats", false, "also print the format versions written and readable")
	return cmd
}

func newRunCommand() *cobra.Command {
	cfg := server.DefaultConfig()
	var configFile, logLevel, logFormat, logFile string
	var drainTimeout time.Duration
	var applyTestFlags func(*slog.Logger)
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run a node (the default command)",
		Long: `Run a tidal-server node until SIGTERM or SIGINT.

On SIGTERM a leader first hands leadership to its most caught-up voter
(bounded by two election timeouts and half of --drain-timeout), so writes
in flight through it commit instead of ending as 504; then the node stops
accepting requests, lets in-flight writes finish (each is bounded by
--write-timeout), stops raft, closes the WAL and exits 0. Every
acknowledged write was fsynced before it was acknowledged.

Every listener is bound before the data dir is touched. A data dir whose
stored voters share less than a majority with the voters of --peers
(another cluster's; learners do not count) is refused, naming both.

Security: with --certs-dir the peer plane is mutual TLS (each node's
certificate names its member id), the client API is served over TLS (HTTP/2
and HTTP/1.1), and every request needs a client certificate from the
cluster's CA or a bearer token (--tokens); /healthz, /readyz and /metrics stay open
unless --open-probes=false. Without --certs-dir the node serves plaintext,
without authentication unless --tokens is given, and refuses to bind any
address but loopback unless --insecure. SIGHUP re-reads the tokens file and
the certificates, and ends the open gRPC ingest streams whose token or
certificate they no longer accept.

Flags override the --config file; the file's keys are the flag names with
underscores (client_addr, data_dir, ...).

` + runExitStatuses,
		Example: `  # one node, defaults
  tidal-server run

  # one node that also serves the gRPC ingest stream (many writes in flight per stream)
  tidal-server run --grpc-addr 127.0.0.1:7080

  # node 1 of a 3-node cluster on one machine
  tidal-server run --id 1 --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 \
    --client-addr 127.0.0.1:7071 --peer-addr 127.0.0.1:7101 --data-dir n1

  # node 1 of a secured cluster: TLS with HTTP/2, client certificates and tokens
  tidal-server run --id 1 --peers 1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103 \
    --client-addr 127.0.0.1:7071 --peer-addr 127.0.0.1:7101 --data-dir n1 --certs-dir n1-certs --tokens tokens

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
			if cfg.CertsDir != "" {
				// Loaded here, before the transport is built, so that both
				// planes share one store.
				if cfg.Certs, err = server.LoadCerts(cfg.CertsDir, log); err != nil {
					return err
				}
			}
			if applyTestFlags != nil {
				applyTestFlags(log)
			}
			popts, err := peerOptions(&cfg)
			if err != nil {
				return err
			}
			cfg.Transport = peer.Factory(popts)
			srv, err := server.Start(cfg, log)
			if err != nil {
				return err
			}
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
			defer signal.Stop(sigs)
		wait:
			for {
				select {
				case sig := <-sigs:
					if sig == syscall.SIGHUP {
						log.Info("SIGHUP: reloading the tokens file and certificates")
						srv.Reload() // logs what it could not reload; the old sets stay
						continue
					}
					log.Info("signal received; shutting down", "signal", sig.String())
					break wait
				case err := <-srv.Err():
					log.Error("serving failed", "err", err)
					srv.Shutdown(context.Background())
					return err
				case <-srv.ReplicaDone():
					return stopAfterReplica(srv, log, drainTimeout)
				}
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
	f.StringVar(&cfg.GRPCAddr, "grpc-addr", cfg.GRPCAddr, "serve the gRPC ingest stream (tidal.v1.Ingest/Stream: many writes in flight per stream) on this address, with the client plane's TLS and roles; empty: not served")
	f.DurationVar(&cfg.IngestStreamMaxAge, "ingest-stream-max-age", ingest.DefaultMaxStreamAge, "end a gRPC ingest stream about this long after it opened (the Go client reconnects and resends unanswered writes with the same ids); negative: never")
	f.StringVar(&cfg.AdvertiseClientAddr, "advertise-client-addr", cfg.AdvertiseClientAddr, "client address published to the cluster (status, leader lookups) when clients reach this node elsewhere than --client-addr (a container's published port, a pod's DNS name); default --client-addr")
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
	f.BoolVar(&cfg.PackProposals, "pack-proposals", true, "pack writes proposed concurrently on this node into one raft entry (fewer log entries, WAL records and replication messages per write); packed in the newest envelope every member advertises it reads (entry format 3, else 2, else none), so a mix with an older release stays safe")
	f.Uint64Var(&cfg.SnapshotEvery, "snapshot-every", 10000, "applied entries between snapshots")
	f.BoolVar(&cfg.SnapshotStagger, "snapshot-stagger", true, "spread the members' snapshot points over the --snapshot-every interval by member id, so members do not all encode a snapshot at the same index (at most one at a time under steady load); false snapshots every member at the same indexes")
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
	f.BoolVar(&cfg.SkipEarlyIDCheck, "skip-early-id-check", false, "propose a write without first checking its ids against the remembered ones (that pre-check repeats apply's lookups); a reused id with another payload is then refused by apply, still 409, its log position consumed")
	f.BoolVar(&cfg.EnablePprof, "enable-pprof", false, "serve Go's /debug/pprof/ on the client address (admin role when authentication is on)")
	f.StringVar(&cfg.CertsDir, "certs-dir", cfg.CertsDir, "directory with ca.crt, node.crt, node.key (tidal-server certs ...): mutual TLS between nodes, TLS with HTTP/2 for clients")
	f.BoolVar(&cfg.Insecure, "insecure", cfg.Insecure, "without --certs-dir, allow binding non-loopback addresses in plaintext (logged as a warning)")
	f.StringVar(&cfg.TokensPath, "tokens", cfg.TokensPath, "bearer tokens file (tidal-server tokens add), re-read on SIGHUP")
	f.BoolVar(&cfg.OpenProbes, "open-probes", cfg.OpenProbes, "serve /healthz, /readyz and /metrics without credentials (false: reader role)")
	f.DurationVar(&cfg.HTTPReadHeaderTimeout, "http-read-header-timeout", server.DefaultHTTPReadHeaderTimeout, "time to read a request's headers (TLS handshake included)")
	f.DurationVar(&cfg.HTTPReadTimeout, "http-read-timeout", server.DefaultHTTPReadTimeout, "time to read a whole request, headers and body")
	f.DurationVar(&cfg.HTTPWriteTimeout, "http-write-timeout", server.DefaultHTTPWriteTimeout, "time to answer a request once read (longer than --write-timeout)")
	f.DurationVar(&cfg.HTTPIdleTimeout, "http-idle-timeout", server.DefaultHTTPIdleTimeout, "keep-alive: close a connection idle this long")
	f.DurationVar(&cfg.HTTPStreamTimeout, "http-stream-timeout", server.DefaultHTTPStreamTimeout, "time to write a streamed answer (GET /admin/backup, /v1/audit/events)")
	f.IntVar(&cfg.MaxConns, "max-conns", server.DefaultMaxConns, "client connections open at once; past it requests but /healthz and /readyz get 503, past twice it connections are closed")
	f.IntVar(&cfg.HTTP2MaxStreams, "http2-max-streams", server.DefaultHTTP2MaxStreams, "HTTP/2: concurrent requests per connection")
	// Per-request bounds of the client API (docs/ARCHITECTURE.md, API details).
	f.Int64Var(&cfg.MaxInflightBytes, "max-inflight-bytes", 64<<20, "request body bytes held at once; a body that does not fit gets 503 + Retry-After before it is read")
	f.Var(byteSize{&cfg.MaxMemory}, "max-memory", "refuse embedding writes (503 memory_limit + Retry-After) that would take this node's memory past this bound: RSS + writes pending + two copies of the vectors for the next snapshot; units B, KB, MB, GB, KiB, MiB, GiB (0: no bound; signals and reads are never refused by it)")
	f.Int64Var(&cfg.MinBodyRate, "min-body-rate", 64<<10, "bytes/s a request body must average after a 5s grace (and arrive within --http-read-timeout); slower gets 408 (negative: no minimum)")
	f.DurationVar(&cfg.MaxWriteWait, "max-write-wait", 0, "shed a write (503 + Retry-After) expected to wait longer for commit (0: half of --write-timeout)")
	f.DurationVar(&cfg.MaxClockSkew, "max-clock-skew", time.Minute, "refuse (400, events[i].ts) an event whose ts is further ahead of this node's clock; a node this far off a majority of the voters' clocks refuses writes (503)")
	f.DurationVar(&cfg.TestClockOffset, "test-clock-offset", 0, "TEST ONLY: shift this node's clock (stamping, skew check, clock probes) to simulate skew")
	f.StringVar(&cfg.TestClockOffsetFile, "test-clock-offset-file", "", "TEST ONLY: file holding this node's clock offset (\"90s\", \"-5m\"), re-read every 100ms so a test can move the clock at run time; missing or empty: --test-clock-offset")
	f.Int64Var(&cfg.MaxSnapshotBytes, "max-snapshot-bytes", 1<<30, "cap on one snapshot received from a peer, spooled to <data-dir>/snap-spool as it arrives; a longer stream is cut (must exceed the largest snapshot)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	f.StringVar(&logFile, "log-file", "", "write logs to this file instead of stderr")
	f.DurationVar(&drainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM, how long to wait for in-flight requests")
	if runTestFlags != nil {
		applyTestFlags = runTestFlags(f)
	}
	return cmd
}

// peerOptions configures the peer transport from cfg.
//
//   - The plane is mutual TLS with the client plane's certificate store:
//     the transport verifies that each peer's certificate names a member
//     and that a dialled peer is the member meant.
//   - Membership is left nil: peer.Factory then admits raft messages by
//     the server's replicated membership (replica.Replica.MemberStatus,
//     through server.Inbound), voters and learners current, removed ids
//     refused for good.
//   - Inbound snapshots are spooled under the data dir, and cut past
//     --max-snapshot-bytes.
//   - --test-clock-offset and --test-clock-offset-file (tests only) shift
//     this node's clock in the clock probes: the transport reads the
//     server's test clock, built here so both share it.
func peerOptions(cfg *server.Config) (peer.Options, error) {
	if cfg.MaxSnapshotBytes < 0 {
		// 0 (a --config file without the key) is the transport's default.
		return peer.Options{}, fmt.Errorf("--max-snapshot-bytes: expected a size in bytes > 0, found %d", cfg.MaxSnapshotBytes)
	}
	o := peer.Options{
		SpoolDir:         filepath.Join(cfg.DataDir, snapshotSpoolDir),
		MaxSnapshotBytes: cfg.MaxSnapshotBytes,
	}
	if cfg.TestClockOffset != 0 || cfg.TestClockOffsetFile != "" {
		// TEST ONLY: the one test clock shifts the clock probes as it
		// shifts the stamping clock (the server's), so the node looks as
		// skewed to its peers as its writes would be.
		clock, err := server.NewTestClock(cfg.TestClockOffset, cfg.TestClockOffsetFile)
		if err != nil {
			return peer.Options{}, err
		}
		cfg.TestClock, o.Now = clock, clock.Now
	}
	if cfg.Certs != nil {
		o.ServerTLS, o.ClientTLS = cfg.Certs.PeerServerTLS(), cfg.Certs.PeerClientTLS
		cfg.PeerTLS = true
	}
	return o, nil
}

// runTestFlags, set only in a tidalbugs build (testflags_tidalbugs.go),
// registers that build's hidden test-only flags on the run command and
// returns what to do with them once the log is open. A normal build has
// none: the flags, and the hooks they call, are not in its binary.
var runTestFlags func(f *pflag.FlagSet) (apply func(log *slog.Logger))

// snapshotSpoolDir is where, under the data dir, inbound snapshots are
// written as they stream in (the transport empties it at start).
const snapshotSpoolDir = "snap-spool"

// stopAfterReplica shuts down a node whose replica stopped by itself and
// picks the exit status that says why: removed from the cluster (expected;
// logged as a warning) or fenced after a disk failure.
func stopAfterReplica(srv *server.Server, log *slog.Logger, drainTimeout time.Duration) error {
	cause := srv.ReplicaErr()
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	var efe *replica.EntryFormatError
	switch {
	case errors.As(cause, &efe):
		log.Error("stopping: the log holds an entry this build cannot read", "err", efe, "exit_status", exitFailed)
		srv.Shutdown(ctx)
		return efe
	case errors.Is(cause, replica.ErrRemoved):
		log.Warn("this node was removed from the cluster; stopping", "exit_status", exitRemoved)
		if err := srv.Shutdown(ctx); err != nil {
			log.Warn("shutdown after removal", "err", err)
		}
		return &exitError{code: exitRemoved, notAnError: true,
			err: errors.New("this node was removed from the cluster; its id is retired (add the machine back as a new member with an empty data dir)")}
	case errors.Is(cause, replica.ErrFenced):
		log.Error("node fenced after a failed disk write; stopping", "err", cause, "exit_status", exitFenced)
		srv.Shutdown(ctx)
		return &exitError{code: exitFenced, err: fmt.Errorf("%w; fix the disk and start the node again", cause)}
	}
	log.Error("replica stopped unexpectedly; stopping", "err", cause)
	srv.Shutdown(ctx)
	return fmt.Errorf("replica stopped: %w", cause)
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
		case "advertise-client-addr":
			out.AdvertiseClientAddr = flags.AdvertiseClientAddr
		case "grpc-addr":
			out.GRPCAddr = flags.GRPCAddr
		case "ingest-stream-max-age":
			out.IngestStreamMaxAge = flags.IngestStreamMaxAge
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
		case "pack-proposals":
			out.PackProposals = flags.PackProposals
		case "snapshot-every":
			out.SnapshotEvery = flags.SnapshotEvery
		case "snapshot-stagger":
			out.SnapshotStagger = flags.SnapshotStagger
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
		case "skip-early-id-check":
			out.SkipEarlyIDCheck = flags.SkipEarlyIDCheck
		case "certs-dir":
			out.CertsDir = flags.CertsDir
		case "insecure":
			out.Insecure = flags.Insecure
		case "tokens":
			out.TokensPath = flags.TokensPath
		case "open-probes":
			out.OpenProbes = flags.OpenProbes
		case "http-read-header-timeout":
			out.HTTPReadHeaderTimeout = flags.HTTPReadHeaderTimeout
		case "http-read-timeout":
			out.HTTPReadTimeout = flags.HTTPReadTimeout
		case "http-write-timeout":
			out.HTTPWriteTimeout = flags.HTTPWriteTimeout
		case "http-idle-timeout":
			out.HTTPIdleTimeout = flags.HTTPIdleTimeout
		case "http-stream-timeout":
			out.HTTPStreamTimeout = flags.HTTPStreamTimeout
		case "max-conns":
			out.MaxConns = flags.MaxConns
		case "http2-max-streams":
			out.HTTP2MaxStreams = flags.HTTP2MaxStreams
		case "max-inflight-bytes":
			out.MaxInflightBytes = flags.MaxInflightBytes
		case "max-memory":
			out.MaxMemory = flags.MaxMemory
		case "min-body-rate":
			out.MinBodyRate = flags.MinBodyRate
		case "max-write-wait":
			out.MaxWriteWait = flags.MaxWriteWait
		case "max-clock-skew":
			out.MaxClockSkew = flags.MaxClockSkew
		case "test-clock-offset":
			out.TestClockOffset = flags.TestClockOffset
		case "test-clock-offset-file":
			out.TestClockOffsetFile = flags.TestClockOffsetFile
		case "max-snapshot-bytes":
			out.MaxSnapshotBytes = flags.MaxSnapshotBytes
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
		Long: `Scan every segment of the WAL read-only and print what was found.

Exit status:
  0  every record is intact, or the only problem is a torn tail in the
     newest segment (normal after a crash: the node truncates it on start)
  1  the WAL could not be read
  3  damage the node will refuse to start with; file and offset are printed`,
		Example: "  tidal-server wal verify --data-dir n1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := wal.Verify(filepath.Join(dataDir, "wal"))
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), rep.String())
			if rep.Problem != nil && rep.TornTail == nil {
				return &exitError{code: exitDamage, err: rep.Problem}
			}
			return nil
		},
	}
	var allowCommittedLoss bool
	repair := &cobra.Command{
		Use:   "repair",
		Short: "Truncate the WAL after its last good record and report what was dropped",
		Long: `Truncate the WAL after the last record that checks out, removing everything
after it, and print what was dropped.

Repair refuses, changing nothing, when the cut would drop entries the log
records as committed (its last index would fall below its commit index):
the other members rely on this node holding them, and raft would panic on
every start ("tocommit(N) is out of range [lastIndex(M)]"). The way out is
to retire the node's id and let it catch up as a new member:

  tidal-server members remove ID --addr OTHER_NODE
  rm -rf DATA_DIR
  tidal-server members add --addr OTHER_NODE --id NEW_ID --peer-addr ... --client-addr ...
  tidal-server run --id NEW_ID --join --peers ... --data-dir DATA_DIR

--allow-committed-loss cuts anyway: it is for a node that holds the only
copy of its data (a one-member cluster) and is refused for a member of a
larger one.

Exit status:
  0  repaired, or nothing to repair
  1  the WAL could not be read or changed
  3  refused: the cut would drop committed entries (nothing was changed)`,
		Example: "  tidal-server wal repair --data-dir n1",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if allowCommittedLoss {
				members, _, err := replica.StoredMembers(dataDir)
				var ce *wal.CorruptionError
				if err != nil && !errors.As(err, &ce) {
					return err
				}
				if len(members) > 1 {
					return &exitError{code: exitDamage, err: fmt.Errorf("--allow-committed-loss: refused, the data dir %s belongs to a cluster of %d members (%s) "+
						"that hold the committed entries: remove this member, wipe the data dir and add it back under a new id", dataDir, len(members), formatMembers(members))}
				}
			}
			rep, err := wal.Repair(filepath.Join(dataDir, "wal"), wal.RepairOptions{AllowCommittedLoss: allowCommittedLoss})
			if rep != nil {
				fmt.Fprint(out, rep.String())
			}
			var cut *wal.CutsCommittedError
			if errors.As(err, &cut) {
				fmt.Fprint(out, repairWayOut(dataDir, cut))
				return &exitError{code: exitDamage, err: err}
			}
			return err
		},
	}
	repair.Flags().BoolVar(&allowCommittedLoss, "allow-committed-loss", false,
		"cut even below the commit index (one-member clusters only: acknowledged writes after the cut are lost)")
	for _, c := range []*cobra.Command{verify, repair} {
		c.Flags().StringVar(&dataDir, "data-dir", "tidal-data", "the node's data directory")
	}
	cmd.AddCommand(verify, repair)
	return cmd
}

// repairWayOut is what `wal repair` prints when it refuses: the steps that
// bring the node back without it ever holding a log that contradicts what
// it acknowledged.
func repairWayOut(dataDir string, cut *wal.CutsCommittedError) string {
	var b strings.Builder
	log := "the log"
	if cut.Group != wal.DefaultGroup {
		log = fmt.Sprintf("raft group %d's log", cut.Group)
	}
	fmt.Fprintf(&b, "refused: cutting at the damage would end %s at index %d, below the commit index %d it records;\n", log, cut.LastIndex, cut.Commit)
	fmt.Fprintf(&b, "the other members rely on this node holding entries %d..%d, and raft would panic on every start.\n", cut.LastIndex+1, cut.Commit)
	members, _, err := replica.StoredMembers(dataDir)
	var ce *wal.CorruptionError
	if (err == nil || errors.As(err, &ce)) && len(members) > 0 {
		fmt.Fprintf(&b, "members stored in %s: %s\n", dataDir, formatMembers(members))
	}
	fmt.Fprintf(&b, `Retire this node's id and let it catch up from the others as a new member:
  tidal-server members remove ID --addr OTHER_NODE_CLIENT_ADDR
  rm -rf %s
  tidal-server members add --addr OTHER_NODE_CLIENT_ADDR --id NEW_ID --peer-addr PEER_ADDR --client-addr CLIENT_ADDR
  tidal-server run --id NEW_ID --join --peers ...,NEW_ID=PEER_ADDR --data-dir %s ...
If this node holds the only copy (a one-member cluster), --allow-committed-loss cuts anyway.
`, dataDir, dataDir)
	return b.String()
}

func formatMembers(ms []replica.Member) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%d=%s", m.ID, m.PeerAddr)
	}
	return strings.Join(parts, ",")
}
