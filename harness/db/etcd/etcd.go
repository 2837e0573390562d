// Package etcd is the harness's adapter for etcd: real etcd
// processes from Debian's etcd-server package (3.4), every peer link and
// every client link through the relay mesh, the register and append
// workloads, and their checkers. It is the first database the harness
// runs that no one here wrote.
//
// Peer traffic: etcd members share one membership in which each member
// has one peer URL; every slot's URL is an ingress (package db/ingress)
// that finds which node dialed and forwards through the mesh relay for
// that directed pair, so every partition shape works as for tidal-server.
// Clients dial each node's client relay; the harness's own control calls
// (status, member API) go to nodes directly, as Jepsen's control node.
//
// The client speaks etcd's v3 API through its gRPC gateway (JSON over
// HTTP) with the standard library, so the main module does not depend on
// go.etcd.io/etcd/client/v3 (see docs/ARCHITECTURE.md, "etcd").
package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/db"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/process"
)

// Workloads.
const (
	// Register puts, reads and compare-and-sets a few keys at a time;
	// checked for linearizability with porcupine.
	Register = "register"
	// Append writes batches of unique keys (one txn each) under a prefix;
	// checked by the ledger checker: every acknowledged key on every node
	// after the heal, nothing that was never sent, nothing at two revisions.
	Append = "append"
)

// Node selections: which member a client op goes to.
const (
	// RoundRobin cycles through the members, op by op, across all workers.
	RoundRobin = "round-robin"
	// Random picks a member uniformly for every op.
	Random = "random"
	// Leader sends every op to the member last seen leading; the hint is
	// refreshed every half second and at once after an op sent to it did
	// not complete ok. While no leader is known, ops go round-robin.
	Leader = "leader"
	// Bound ties each worker to one member for the whole run (worker i to
	// member i mod n, Jepsen's default): a paused member stalls only its
	// own workers while the others keep the majority writing, the writes
	// a stale read on the paused member is judged against.
	Bound = "bound"
)

// Selections lists every node selection, for flag help and errors.
var Selections = []string{RoundRobin, Random, Leader, Bound}

// Read consistencies of the register workload.
const (
	Linearizable = "linearizable"
	Serializable = "serializable"
)

// Config is the etcd part of a run's configuration (config.json).
type Config struct {
	// Binary is etcd; empty finds it on PATH (installing Debian's
	// etcd-server when absent and the harness runs as root).
	Binary   string `json:"binary,omitempty"`
	Workload string `json:"workload"`
	// Reads is the register workload's read consistency.
	Reads string `json:"reads,omitempty"`
	// Keys is how many register keys are in use at once; OpsPerKey how
	// many ops a key takes before its slot moves on to a fresh key (the
	// linearizability search stays small however long the run).
	Keys      int `json:"keys,omitempty"`
	OpsPerKey int `json:"ops_per_key,omitempty"`
	// Values, when > 0, draws every written value from 1..Values (a cas
	// then often compares equal, but a stale read can return the value it
	// should have seen). 0, the default, writes a value never written
	// before on any key, so that every value read names the one write
	// that produced it.
	Values int `json:"values,omitempty"`
	// Select is how a worker chooses the member of each op (Selections);
	// empty is round-robin.
	Select string `json:"select,omitempty"`
	// LinearizableTimeout bounds the register workload's porcupine search
	// of one run (past it: unknown); the runner sets it from its own.
	LinearizableTimeout Duration `json:"linearizable_timeout,omitempty"`
	// Concurrency is the number of client workers; Rate, when > 0, makes
	// the load open loop at that many ops/s.
	Concurrency int     `json:"concurrency,omitempty"`
	Rate        float64 `json:"rate,omitempty"`
	// OpTimeout bounds one request; past it the op is info.
	OpTimeout Duration `json:"op_timeout,omitempty"`
	// SnapshotCount is etcd's --snapshot-count (small, so that restarted
	// and re-added members catch up from snapshots).
	SnapshotCount int      `json:"snapshot_count,omitempty"`
	Flags         []string `json:"flags,omitempty"`
	Seed          uint64   `json:"seed,omitempty"`
	// SampleInterval is how often every member's maintenance status is
	// polled for the lag checker (Observe).
	SampleInterval Duration `json:"sample_interval,omitempty"`
}

// Duration is a time.Duration that reads and writes as "5s" in JSON.
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// WithDefaults fills what is unset and checks the rest.
func (c Config) WithDefaults() (Config, error) {
	if c.Workload == "" {
		c.Workload = Register
	}
	if c.Workload != Register && c.Workload != Append {
		return c, fmt.Errorf("etcd workload: expected %s or %s, found %q", Register, Append, c.Workload)
	}
	if c.Reads == "" {
		c.Reads = Linearizable
	}
	if c.Reads != Linearizable && c.Reads != Serializable {
		return c, fmt.Errorf("etcd reads: expected %s or %s, found %q", Linearizable, Serializable, c.Reads)
	}
	if c.Keys == 0 {
		c.Keys = 3
	}
	if c.Keys < 0 || c.OpsPerKey < 0 || c.Values < 0 {
		return c, fmt.Errorf("etcd register: expected keys, ops per key and values >= 0, found %d, %d, %d", c.Keys, c.OpsPerKey, c.Values)
	}
	if c.Select == "" {
		c.Select = RoundRobin
	}
	if !slices.Contains(Selections, c.Select) {
		return c, fmt.Errorf("etcd node selection: expected one of %s, found %q", strings.Join(Selections, ", "), c.Select)
	}
	if c.LinearizableTimeout <= 0 {
		c.LinearizableTimeout = Duration(LinearizableTimeout)
	}
	if c.OpsPerKey == 0 {
		c.OpsPerKey = 120
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = Duration(5 * time.Second)
	}
	if c.SnapshotCount == 0 {
		c.SnapshotCount = 2000
	}
	if c.SampleInterval <= 0 {
		c.SampleInterval = Duration(250 * time.Millisecond)
	}
	return c, nil
}

// DB is etcd as a db.DB.
type DB struct{ cfg Config }

// New returns the etcd adapter for cfg.
func New(cfg Config) (*DB, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	return &DB{cfg: cfg}, nil
}

var _ db.DB = (*DB)(nil)

// Config is the adapter's configuration, defaults filled in.
func (d *DB) Config() Config { return d.cfg }

// Name implements db.DB.
func (d *DB) Name() string { return "etcd" }

// Capabilities implements db.DB.
func (d *DB) Capabilities() nemesis.Capabilities {
	return nemesis.Capabilities{DB: "etcd",
		Has: []nemesis.Capability{nemesis.CapNetwork, nemesis.CapKill, nemesis.CapPause, nemesis.CapLeader,
			nemesis.CapTransferLeader, nemesis.CapMembership, nemesis.CapDisk},
		Lacks: map[nemesis.Capability]string{
			nemesis.CapClock:       "etcd reads the system clock and has no flag to offset it; a Go binary reads the clock through the vDSO, not libc, so LD_PRELOAD libfaketime cannot move it, and a time namespace offsets CLOCK_MONOTONIC and CLOCK_BOOTTIME only, not the wall clock",
			nemesis.CapElectionLog: "the adapter does not follow etcd's log for elections as they happen",
			nemesis.CapStop:        "the adapter has no graceful stop",
		}}
}

// Setup implements db.DB.
func (d *DB) Setup(ctx context.Context, env db.Env) (db.Cluster, error) {
	bin, err := Find(d.cfg.Binary)
	if err != nil {
		return nil, err
	}
	cfg := d.cfg
	cfg.Binary = bin
	var backend cluster.Backend
	backend, err = process.NewBackend(bin, env.Registry)
	if err != nil {
		return nil, err
	}
	if env.Wrap != nil {
		backend = env.Wrap(backend)
	}
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c, err := startCluster(cfg, env.Nodes, env.NodesDir, env.DiskFaults, backend, log)
	if err != nil {
		backend.Close()
		return nil, err
	}
	if env.Up != nil {
		env.Up()
	}
	upCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := c.WaitLeader(upCtx); err != nil {
		c.Close()
		return nil, fmt.Errorf("etcd cluster did not come up (logs in %s): %w", env.NodesDir, err)
	}
	if err := c.refreshMembers(upCtx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Find returns the etcd binary to run: bin if set, else etcd on PATH.
// When there is none and the harness runs as root, it installs Debian's
// etcd-server and etcd-client with apt-get (as ci/bench does), saying so
// on stderr; otherwise the error says how to install it.
func Find(bin string) (string, error) {
	if bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("etcd binary: %w", err)
		}
		return filepath.Abs(bin)
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p, nil
	}
	if os.Geteuid() != 0 {
		return "", errors.New("etcd is not installed: run 'apt-get update && apt-get install -y etcd-server etcd-client' as root, or pass --etcd-bin")
	}
	fmt.Fprintln(os.Stderr, "tidal-chaos: etcd is not installed; installing etcd-server and etcd-client from Debian (apt-get)")
	for _, args := range [][]string{{"update"}, {"install", "-y", "--no-install-recommends", "etcd-server", "etcd-client"}} {
		cmd := exec.Command("apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("installing etcd: apt-get %v: %w", args, err)
		}
	}
	return exec.LookPath("etcd")
}

// ElectionTimeout is the election timeout the members run with: the last
// --election-timeout (ms) among Flags, else etcd's default of 1000ms.
func (c Config) ElectionTimeout() time.Duration {
	et := time.Second
	for i, f := range c.Flags {
		v, ok := strings.CutPrefix(f, "--election-timeout=")
		if !ok && f == "--election-timeout" && i+1 < len(c.Flags) {
			v, ok = c.Flags[i+1], true
		}
		if ms, err := strconv.Atoi(v); ok && err == nil && ms > 0 {
			et = time.Duration(ms) * time.Millisecond
		}
	}
	return et
}
