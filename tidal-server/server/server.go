// Package server assembles a tidal-server node from its configuration: the
// state machine (ledger + vectors), the replica (raft, WAL, snapshots), the
// peer transport and the HTTP API; and it starts, drains and stops them in
// the right order.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/tidaldb/tidal/buildinfo"
	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/ingest"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Config is everything a node needs. YAML keys match the flag names with
// dashes turned into underscores; see `tidal-server run --help`.
type Config struct {
	ID         uint64 `yaml:"id"`
	ClientAddr string `yaml:"client_addr"`
	// AdvertiseClientAddr is the client address published in the
	// membership table (what `status` shows and dials to reach the
	// leader) when it differs from the listener's: a container listening
	// on 0.0.0.0:7070 behind a published 127.0.0.1:7071, a pod behind
	// its DNS name. Empty: ClientAddr.
	AdvertiseClientAddr string `yaml:"advertise_client_addr"`
	PeerAddr            string `yaml:"peer_addr"`
	// GRPCAddr, when set, serves the gRPC ingest stream
	// (tidal.v1.Ingest/Stream, package ingest) on its own listener, with
	// the client plane's TLS and roles. Empty: not served.
	GRPCAddr string `yaml:"grpc_addr"`
	// IngestStreamMaxAge ends an ingest stream about this long after it
	// opened (ingest.Options.MaxStreamAge; the client reconnects): 0 the
	// default (30m), negative no bound. --ingest-stream-max-age.
	IngestStreamMaxAge time.Duration `yaml:"ingest_stream_max_age"`
	// Peers is the initial cluster as "1=host:port,2=host:port"; empty
	// means a single-node cluster of this node at PeerAddr.
	Peers string `yaml:"peers"`
	// PeerDial rewrites peer addresses before dialing
	// ("127.0.0.1:7102=127.0.0.1:9102,..."): advertised=dial. The harness
	// routes every link through a relay this way.
	PeerDial   string `yaml:"peer_dial"`
	Join       bool   `yaml:"join"`
	DataDir    string `yaml:"data_dir"`
	SchemaPath string `yaml:"schema"`

	TickInterval        time.Duration `yaml:"tick_interval"`
	ElectionTicks       int           `yaml:"election_ticks"`
	HeartbeatTicks      int           `yaml:"heartbeat_ticks"`
	MaxSizePerMsg       uint64        `yaml:"max_size_per_msg"`
	MaxInflightMsgs     int           `yaml:"max_inflight_msgs"`
	MaxUncommittedBytes uint64        `yaml:"max_uncommitted_bytes"`
	PackProposals       bool          `yaml:"pack_proposals"`
	SnapshotEvery       uint64        `yaml:"snapshot_every"`
	SnapshotStagger     bool          `yaml:"snapshot_stagger"`
	SnapshotCatchUp     uint64        `yaml:"snapshot_catch_up"`
	ReadyWithin         uint64        `yaml:"ready_within"`

	WALSegmentSize   int64         `yaml:"wal_segment_size"`
	WALBatchMaxBytes int           `yaml:"wal_batch_max_bytes"`
	WALBatchTimeout  time.Duration `yaml:"wal_batch_timeout"`

	MaxBodyBytes      int64         `yaml:"max_body_bytes"`
	MaxBatch          int           `yaml:"max_batch"`
	MaxInflightWrites int           `yaml:"max_inflight_writes"`
	WriteTimeout      time.Duration `yaml:"write_timeout"`
	IDsPerGeneration  int           `yaml:"ids_per_generation"`
	// SkipEarlyIDCheck: api.Options.SkipEarlyCheck (--skip-early-id-check).
	SkipEarlyIDCheck bool `yaml:"skip_early_id_check"`

	// Per-request bounds of the client API (api.Options has the rules).
	// A body must arrive within HTTPReadTimeout (the API enforces it per
	// request, with the minimum rate).
	MaxInflightBytes int64         `yaml:"max_inflight_bytes"`
	MinBodyRate      int64         `yaml:"min_body_rate"`
	MaxWriteWait     time.Duration `yaml:"max_write_wait"`
	MaxClockSkew     time.Duration `yaml:"max_clock_skew"`
	// TestClockOffset shifts this node's clock for stamping and the skew
	// check (and, wired by the caller, for the peer plane's clock
	// probes). TEST ONLY: it simulates a skewed node.
	TestClockOffset time.Duration `yaml:"test_clock_offset"`
	// TestClockOffsetFile, when set, names a file holding this node's
	// clock offset ("90s", "-5m"), re-read every 100ms; while it is
	// missing or empty TestClockOffset applies. TEST ONLY: the harness's
	// clock nemesis writes it (testclock.go says why a file, not an API).
	TestClockOffsetFile string `yaml:"test_clock_offset_file"`
	// TestClock is the shifted clock built from the two above; the caller
	// builds it when it must share it with the transport (the CLI does),
	// else Start does.
	TestClock *TestClock `yaml:"-"`
	// ClockHealthy gates writes and /readyz on this node's clock being
	// within bounds of its peers (api.Options.ClockHealthy). Nil: Start
	// builds the check (clockguard.go) from a transport that measures its
	// peers' clocks (ClockMeter, as package peer's does).
	ClockHealthy func() (ok bool, reason string) `yaml:"-"`
	// EnablePprof serves /debug/pprof/ on the client address.
	EnablePprof bool `yaml:"enable_pprof"`

	// The client plane's http.Server (docs/ARCHITECTURE.md, "Client
	// plane: connections and timeouts"); zero values take the defaults.
	HTTPReadHeaderTimeout time.Duration `yaml:"http_read_header_timeout"`
	HTTPReadTimeout       time.Duration `yaml:"http_read_timeout"`
	HTTPWriteTimeout      time.Duration `yaml:"http_write_timeout"`
	HTTPIdleTimeout       time.Duration `yaml:"http_idle_timeout"`
	HTTPStreamTimeout     time.Duration `yaml:"http_stream_timeout"`
	MaxConns              int           `yaml:"max_conns"`
	HTTP2MaxStreams       int           `yaml:"http2_max_streams"`

	// Security (docs/ARCHITECTURE.md, "Security"). CertsDir turns on TLS:
	// the client plane serves TLS with HTTP/2 and the peer transport is
	// handed the same store (Certs). Without it, every listener must be
	// loopback unless Insecure is set.
	CertsDir   string `yaml:"certs_dir"`
	Insecure   bool   `yaml:"insecure"`
	TokensPath string `yaml:"tokens"`
	// OpenProbes serves /healthz, /readyz and /metrics without
	// credentials; false asks for the reader role.
	OpenProbes bool `yaml:"open_probes"`
	// Certs is CertsDir loaded (LoadCerts); Start loads CertsDir itself
	// when it is nil. Set it before building Transport so the peer plane
	// uses the same store (Certs.PeerServerTLS, Certs.PeerClientTLS).
	Certs *certs.Store `yaml:"-"`
	// PeerTLS says Transport serves and dials the peer plane with Certs'
	// peer configurations. With Certs set and PeerTLS not, the peer plane
	// is plaintext: Start logs so, and refuses a non-loopback --peer-addr
	// unless Insecure.
	PeerTLS bool `yaml:"-"`

	// MaxSnapshotBytes caps one snapshot received from a peer: a longer
	// stream is cut (the peer transport's Options.MaxSnapshotBytes; the
	// caller wires it). It must exceed the cluster's largest snapshot, or
	// a follower that needs one can never catch up.
	MaxSnapshotBytes int64 `yaml:"max_snapshot_bytes"`

	// Transport carries raft messages to other nodes; nil with more than
	// one peer is an error. package peer provides the gRPC one.
	Transport TransportFactory `yaml:"-"`
}

// TransportFactory builds the peer transport once the replica exists (the
// transport delivers inbound messages to it) and serves it on lis.
type TransportFactory func(self uint64, lis net.Listener, inbound Inbound, reg prometheus.Registerer, log *slog.Logger) (replica.Transport, func(), error)

// Inbound is the node as its transport sees it: where received messages
// go, and who may send them.
type Inbound interface {
	Receive(ctx context.Context, data []byte) error
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, ok bool)
	// MemberStatus is this node's replicated membership's word on id
	// (replica.Replica.MemberStatus): a current member (voter or learner),
	// removed for good, or neither. The transport admits raft messages
	// only from current members.
	MemberStatus(id uint64) (current, removed bool)
	// ReportRemoved: member by told this node, on the peer plane, that
	// its applied membership has removed this node
	// (replica.Replica.ReportRemoved).
	ReportRemoved(by uint64)
}

// DefaultConfig is a single node on 127.0.0.1:7070 with data in ./tidal-data.
func DefaultConfig() Config {
	return Config{
		ID:              1,
		ClientAddr:      "127.0.0.1:7070",
		PeerAddr:        "127.0.0.1:7100",
		DataDir:         "tidal-data",
		ReadyWithin:     1000,
		OpenProbes:      true,
		PackProposals:   true,
		SnapshotStagger: true,
	}
}

// ParsePeers parses "1=127.0.0.1:7101,2=127.0.0.1:7102".
func ParsePeers(s string) ([]replica.Member, error) {
	var out []replica.Member
	seen := map[uint64]bool{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		idStr, addr, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("peers[%d]: expected id=host:port, found %q", i, part)
		}
		id, err := strconv.ParseUint(idStr, 10, 64)
		if err != nil || id == 0 {
			return nil, fmt.Errorf("peers[%d]: expected a node id > 0, found %q", i, idStr)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("peers[%d]: address %q: %v", i, addr, err)
		}
		if seen[id] {
			return nil, fmt.Errorf("peers[%d]: node id %d listed twice", i, id)
		}
		seen[id] = true
		out = append(out, replica.Member{ID: id, PeerAddr: addr})
	}
	return out, nil
}

// ParseDialOverrides parses "advertised=dial,..." address pairs.
func ParseDialOverrides(s string) (map[string]string, error) {
	out := map[string]string{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		from, to, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("peer-dial[%d]: expected advertised=dial host:port pair, found %q", i, part)
		}
		for _, a := range []string{from, to} {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, fmt.Errorf("peer-dial[%d]: address %q: %v", i, a, err)
			}
		}
		out[from] = to
	}
	return out, nil
}

// Server is one running node.
type Server struct {
	cfg      Config
	log      *slog.Logger
	reg      *prometheus.Registry
	sm       *StateMachine
	replica  *replica.Replica
	node     *node
	http     *http.Server
	httpLis  net.Listener
	peerLis  net.Listener
	grpcLis  net.Listener    // nil without --grpc-addr
	ingest   *ingest.Service // nil without --grpc-addr
	stopPeer func()
	serveErr chan error
	stopOnce sync.Once

	sec         security
	inbound     inboundProxy
	stopPublish context.CancelFunc // called by Shutdown
	publishDone chan struct{}      // closed when publishClientAddr returns
	clock       *clockGuard        // nil without a transport that measures clocks
	stopClock   context.CancelFunc // ends clock.run; nil when it does not run
	// stopTestClock ends the test clock's file watch; nil without one.
	stopTestClock context.CancelFunc
}

// Start opens the data dir, recovers, starts raft and begins serving.
//
// Every listener is bound before anything is written: a node that cannot
// serve (a port in use) must fail without leaving behind a data dir it
// initialised, or a later start with other --peers would find a cluster of
// the wrong shape already there.
func Start(cfg Config, log *slog.Logger) (_ *Server, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := bugs.Announce(log); err != nil {
		return nil, err
	}
	schema := ledger.DefaultSchema()
	if cfg.SchemaPath != "" {
		s, err := ledger.LoadSchema(cfg.SchemaPath)
		if err != nil {
			return nil, err
		}
		schema = s
	}
	peers, err := ParsePeers(cfg.Peers)
	if err != nil {
		return nil, err
	}
	peersGiven := len(peers) > 0
	if !peersGiven {
		peers = []replica.Member{{ID: cfg.ID, PeerAddr: cfg.PeerAddr}}
	}

	overrides, err := ParseDialOverrides(cfg.PeerDial)
	if err != nil {
		return nil, err
	}
	multi := len(peers) > 1 || cfg.Join
	if multi && cfg.Transport == nil {
		return nil, errors.New("a cluster of more than one node needs a peer transport")
	}

	if err := httpDefaults(&cfg); err != nil {
		return nil, err
	}
	if err := checkAdvertisedAddr(cfg.AdvertiseClientAddr); err != nil {
		return nil, err
	}
	if cfg.CertsDir != "" && cfg.Certs == nil {
		if cfg.Certs, err = LoadCerts(cfg.CertsDir, log); err != nil {
			return nil, err
		}
	}
	if cfg.Certs != nil {
		if err := checkMember(cfg.Certs, cfg.CertsDir, cfg.ID); err != nil {
			return nil, err
		}
	}
	sec, err := newSecurity(cfg)
	if err != nil {
		return nil, err
	}
	servePeers := multi || cfg.Transport != nil
	plaintext := sec.plaintextPlanes(cfg, servePeers)
	if !cfg.Insecure {
		for _, p := range plaintext {
			if err := checkLoopbackAddr(p[0], p[1], p[2]); err != nil {
				return nil, err
			}
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{cfg: cfg, log: log, reg: reg, serveErr: make(chan error, 2), sec: sec}
	defer func() {
		if err != nil {
			s.closeListeners()
		}
	}()
	if s.httpLis, err = net.Listen("tcp", cfg.ClientAddr); err != nil {
		return nil, fmt.Errorf("client listener on %s: %w (nothing was written to %s)", cfg.ClientAddr, err, cfg.DataDir)
	}
	if cfg.GRPCAddr != "" {
		if s.grpcLis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
			return nil, fmt.Errorf("gRPC ingest listener on %s: %w (nothing was written to %s)", cfg.GRPCAddr, err, cfg.DataDir)
		}
	}
	if servePeers {
		if s.peerLis, err = net.Listen("tcp", cfg.PeerAddr); err != nil {
			return nil, fmt.Errorf("peer listener on %s: %w (nothing was written to %s)", cfg.PeerAddr, err, cfg.DataDir)
		}
	}
	if !cfg.Insecure {
		for _, p := range plaintext {
			lis := s.httpLis
			switch p[0] {
			case "--peer-addr":
				lis = s.peerLis
			case "--grpc-addr":
				lis = s.grpcLis
			}
			if err := checkLoopbackBound(p[0], p[1], p[2], lis); err != nil {
				return nil, err
			}
		}
	}
	s.logSecurity(plaintext)

	// With several peers every node must write the same bootstrap
	// entries, so they carry peer addresses only, and each node publishes
	// its client address once it runs (publishClientAddr). A one-member
	// cluster's bootstrap entry is this node's alone: it may carry the
	// client address, and nothing needs publishing.
	if len(peers) == 1 && peers[0].ID == cfg.ID {
		peers[0].ClientAddr = s.advertisedClientAddr()
	}

	if err := prepareDataDir(cfg.DataDir, schema, log); err != nil {
		return nil, err
	}
	if peersGiven && !cfg.Join {
		if err := checkPeersMatchDataDir(cfg.DataDir, peers); err != nil {
			return nil, err
		}
	}

	s.sm = NewStateMachine(schema, ledger.Options{IDsPerGeneration: cfg.IDsPerGeneration})
	s.sm.noteRestart(cfg.DataDir)

	var transport replica.Transport
	s.inbound.peers = peers
	if s.peerLis != nil {
		transport, s.stopPeer, err = cfg.Transport(cfg.ID, s.peerLis, &s.inbound, reg, log.With("component", "peer"))
		if err != nil {
			return nil, err
		}
	}

	walMetrics := wal.NewMetrics(reg)
	s.replica, err = replica.Start(replica.Config{
		ID: cfg.ID, Peers: peers, Join: cfg.Join, DataDir: cfg.DataDir, DialOverrides: overrides,
		TickInterval: cfg.TickInterval, ElectionTicks: cfg.ElectionTicks, HeartbeatTicks: cfg.HeartbeatTicks,
		MaxSizePerMsg: cfg.MaxSizePerMsg, MaxInflightMsgs: cfg.MaxInflightMsgs, MaxUncommittedBytes: cfg.MaxUncommittedBytes,
		SnapshotEvery: cfg.SnapshotEvery, StaggerSnapshots: cfg.SnapshotStagger, SnapshotCatchUp: cfg.SnapshotCatchUp, PackProposals: cfg.PackProposals,
		WAL:          wal.Options{SegmentSize: cfg.WALSegmentSize, BatchMaxBytes: cfg.WALBatchMaxBytes, BatchTimeout: cfg.WALBatchTimeout, Metrics: walMetrics},
		Transport:    transport,
		StateMachine: s.sm,
		Logger:       log.With("component", "replica"),
		Metrics:      replica.NewMetrics(reg),
	})
	if err != nil {
		return nil, err
	}
	s.inbound.set(s.replica)
	if reg != nil {
		// The minimum-entry-format rule as this node applies it (ARCHITECTURE,
		// "Format versions"): a rolling upgrade shows here when the last
		// member runs a release that reads a new entry format.
		r := s.replica
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tidal_cluster_entry_format",
			Help: "Newest raft entry format every current member advertised it reads (this node proposes no newer)."},
			func() float64 { return float64(r.ClusterEntryFormat()) }))
	}
	s.node = &node{id: cfg.ID, schema: schema, sm: s.sm, r: s.replica, readyWithin: cfg.ReadyWithin}

	now := time.Now
	if cfg.TestClock == nil && (cfg.TestClockOffset != 0 || cfg.TestClockOffsetFile != "") {
		if cfg.TestClock, err = NewTestClock(cfg.TestClockOffset, cfg.TestClockOffsetFile); err != nil {
			return nil, err
		}
	}
	if cfg.TestClock != nil {
		log.Warn("TEST ONLY: this node's clock is shifted (--test-clock-offset, --test-clock-offset-file); never run a real node like this",
			"offset", cfg.TestClock.Offset(), "file", cfg.TestClockOffsetFile)
		now = cfg.TestClock.Now
		var clockCtx context.Context
		clockCtx, s.stopTestClock = context.WithCancel(context.Background())
		go cfg.TestClock.watch(clockCtx, log.With("component", "clock"), newTestClockGauge(reg))
	}
	// Clock admission (clockguard.go): a transport that measures its
	// peers' clocks gates writes and /readyz, unless the caller brought a
	// check of its own.
	if meter, ok := transport.(ClockMeter); ok && cfg.ClockHealthy == nil {
		bound := cfg.MaxClockSkew
		if bound == 0 {
			bound = time.Minute // api.Options' default, for the same flag
		}
		s.clock = newClockGuardOn(now, cfg.ID, bound, meter.ClockReadings, s.replica.Voters, reg, log.With("component", "clock"))
		s.clock.check(time.Now()) // a restarted one-voter node decides at once
		cfg.ClockHealthy = s.clock.healthy
	}
	handler, ingestPath := api.NewWithIngest(s.node, api.Options{
		MaxBodyBytes: cfg.MaxBodyBytes, MaxBatch: cfg.MaxBatch, MaxInflightWrites: cfg.MaxInflightWrites,
		WriteTimeout: cfg.WriteTimeout, Logger: log.With("component", "api"), Registry: reg,
		MaxInflightBytes: cfg.MaxInflightBytes, BodyReadTimeout: cfg.HTTPReadTimeout, MinBodyRate: cfg.MinBodyRate,
		MaxWriteWait: cfg.MaxWriteWait, MaxClockSkew: cfg.MaxClockSkew, Now: now,
		ClockHealthy: cfg.ClockHealthy, SkipEarlyCheck: cfg.SkipEarlyIDCheck,
	})
	if cfg.EnablePprof {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.Handle("/", handler)
		handler = mux
	}
	if sec.auth {
		// Every route, pprof included (a route the policy does not list
		// needs admin).
		policy, err := auth.NewPolicy(auth.DefaultRules(cfg.OpenProbes))
		if err != nil {
			return nil, err
		}
		handler = auth.Handler(handler, auth.Options{Policy: policy, Tokens: sec.tokens})
	}
	s.http = newHTTPServer(cfg, handler, log.With("component", "http"))
	lis := net.Listener(newConnLimit(s.httpLis, cfg.MaxConns, reg, log.With("component", "http")))
	if sec.clientTLS {
		s.http.TLSConfig = cfg.Certs.ServerTLS()
	}
	if s.grpcLis != nil {
		// The ingest stream is the client plane's: the same TLS
		// configuration and the same credentials, writer role required.
		iopts := ingest.Options{Auth: sec.auth, Tokens: sec.tokens, MaxStreamAge: cfg.IngestStreamMaxAge,
			Registry: reg, Logger: log.With("component", "ingest")}
		if sec.clientTLS {
			iopts.TLS = cfg.Certs.ServerTLS()
			iopts.VerifyClientCert = cfg.Certs.VerifyClient
		}
		s.ingest = ingest.New(ingestPath, iopts)
		go func() {
			if err := s.ingest.Serve(s.grpcLis); err != nil {
				s.serveErr <- fmt.Errorf("gRPC ingest: %w", err)
			}
		}()
	}
	go func() {
		var err error
		if sec.clientTLS {
			err = s.http.ServeTLS(lis, "", "")
		} else {
			err = s.http.Serve(lis)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.serveErr <- err
		}
	}()
	log.Info("tidal-server started", "build", buildinfo.Read().String(), "id", cfg.ID, "client_addr", s.httpLis.Addr().String(), "grpc_addr", s.GRPCAddr(), "peer_addr", cfg.PeerAddr,
		"data_dir", cfg.DataDir, "peers", len(peers), "signals", len(schema.Signals), "embedding_dim", schema.EmbeddingDim, "security", sec.describe())
	var publishCtx context.Context
	publishCtx, s.stopPublish = context.WithCancel(context.Background())
	s.publishDone = make(chan struct{})
	go s.publishClientAddr(publishCtx)
	if s.clock != nil {
		var clockCtx context.Context
		clockCtx, s.stopClock = context.WithCancel(context.Background())
		go s.clock.run(clockCtx)
	}
	return s, nil
}

// ClientAddr is the address the HTTP API listens on (useful with port 0).
func (s *Server) ClientAddr() string { return s.httpLis.Addr().String() }

// GRPCAddr is the address the gRPC ingest stream listens on; "" without
// --grpc-addr.
func (s *Server) GRPCAddr() string {
	if s.grpcLis == nil {
		return ""
	}
	return s.grpcLis.Addr().String()
}

// Err delivers a fatal serving error.
func (s *Server) Err() <-chan error { return s.serveErr }

// ReplicaDone is closed when the replica stops on its own (fenced, removed).
func (s *Server) ReplicaDone() <-chan struct{} { return s.replica.Done() }

// ReplicaErr says why the replica stopped: an error wrapping
// replica.ErrFenced or replica.ErrRemoved, or replica.ErrStopped; nil
// while it runs.
func (s *Server) ReplicaErr() error { return s.replica.Err() }

// Shutdown hands leadership off if this node leads, stops accepting
// requests, lets in-flight ones finish (each write is already bounded by
// its own timeout), then stops raft and closes the WAL. Everything
// acknowledged was fsynced before its ack, so there is nothing to flush.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		s.stopPublish()
		<-s.publishDone
		if s.stopClock != nil {
			s.stopClock()
		}
		if s.stopTestClock != nil {
			s.stopTestClock()
		}
		s.plantedDrainStart()
		s.handOffLeadership(ctx)
		s.log.Info("draining: no new requests; waiting for in-flight ones")
		var ingestDone chan struct{}
		if s.ingest != nil {
			ingestDone = make(chan struct{})
			go func() {
				defer close(ingestDone)
				s.ingest.Shutdown(ctx)
			}()
		}
		if e := s.http.Shutdown(ctx); e != nil {
			err = fmt.Errorf("drain HTTP: %w", e)
			s.http.Close()
		}
		if ingestDone != nil {
			<-ingestDone
		}
		if e := s.replica.Stop(); e != nil && err == nil {
			err = e
		}
		s.closeListeners()
		s.log.Info("stopped")
	})
	return err
}

// closeListeners stops the peer transport and closes both listeners.
func (s *Server) closeListeners() {
	if s.stopPeer != nil {
		s.stopPeer()
	}
	if s.peerLis != nil {
		s.peerLis.Close()
	}
	if s.httpLis != nil && s.http == nil {
		// Once serving, http.Server owns the listener.
		s.httpLis.Close()
	}
	if s.grpcLis != nil && s.ingest == nil {
		s.grpcLis.Close() // once serving, the gRPC server owns it
	}
}

// inboundProxy lets the transport start before the replica exists. While
// a node that handed leadership off waits for the others to follow the new
// leader (handOffLeadership), it also notes when a message from any member
// but the new leader last arrived.
type inboundProxy struct {
	mu sync.RWMutex
	r  *replica.Replica
	// peers are --peers' ids: the membership until the replica runs.
	peers []replica.Member

	watchExcept atomic.Uint64 // the new leader; 0 when not watching
	lastOther   atomic.Int64  // unix nanoseconds
}

func (p *inboundProxy) set(r *replica.Replica) {
	p.mu.Lock()
	p.r = r
	p.mu.Unlock()
}

func (p *inboundProxy) get() *replica.Replica {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.r
}

func (p *inboundProxy) Receive(ctx context.Context, data []byte) error {
	if except := p.watchExcept.Load(); except != 0 {
		m := &raftpb.Message{}
		if proto.Unmarshal(data, m) == nil && m.GetFrom() != except {
			p.lastOther.Store(time.Now().UnixNano())
		}
	}
	r := p.get()
	if r == nil {
		return errors.New("node is starting")
	}
	return r.Receive(ctx, data)
}

func (p *inboundProxy) ReportUnreachable(id uint64) {
	if r := p.get(); r != nil {
		r.ReportUnreachable(id)
	}
}

func (p *inboundProxy) ReportSnapshot(id uint64, ok bool) {
	if r := p.get(); r != nil {
		r.ReportSnapshot(id, ok)
	}
}

func (p *inboundProxy) ReportRemoved(by uint64) {
	if r := p.get(); r != nil {
		r.ReportRemoved(by)
	}
}

// MemberStatus asks the replica; before it runs (recovering its WAL) the
// --peers count as current, as they do for a replica whose table is still
// empty. Nothing reaches raft then anyway: Receive refuses.
func (p *inboundProxy) MemberStatus(id uint64) (current, removed bool) {
	if r := p.get(); r != nil {
		return r.MemberStatus(id)
	}
	for _, m := range p.peers {
		if m.ID == id {
			return true, false
		}
	}
	return false, false
}
