package runner

import (
	"fmt"

	"github.com/tidaldb/tidal/harness/db"
	"github.com/tidaldb/tidal/harness/db/etcd"
)

// Databases a run can test (Config.DB).
const (
	DBTidal = "tidal"
	DBEtcd  = "etcd"
)

// extraDBs are adapters registered by tests of the runner itself.
var extraDBs = map[string]func(Config) (db.DB, error){}

// openDB returns the adapter of the run's database: tidal-server
// (the default) or etcd.
func openDB(cfg Config) (db.DB, error) {
	if open, ok := extraDBs[cfg.DB]; ok {
		return open(cfg)
	}
	switch cfg.DB {
	case "", DBTidal:
		return tidalDB{cfg: cfg}, nil
	case DBEtcd:
		// The etcd adapter runs local processes (its ingress reads their
		// sockets in /proc) and the in-process mesh.
		if cfg.Backend != "" && cfg.Backend != BackendProcess {
			return nil, fmt.Errorf("db etcd: expected backend %s, found %q (etcd runs as local processes only)", BackendProcess, cfg.Backend)
		}
		if cfg.RelayBinary != "" {
			return nil, fmt.Errorf("db etcd: the relay mesh runs in process; --relay-bin is for tidal-server runs")
		}
		e := cfg.Etcd
		if e.Seed == 0 {
			e.Seed = uint64(cfg.Seed)
		}
		if e.Concurrency == 0 {
			e.Concurrency = cfg.Workload.Concurrency
		}
		if e.Rate == 0 {
			e.Rate = cfg.Workload.Rate
		}
		if e.LinearizableTimeout == 0 {
			e.LinearizableTimeout = etcd.Duration(cfg.LinearizableTimeout.D())
		}
		if e.SampleInterval == 0 {
			e.SampleInterval = etcd.Duration(cfg.SampleInterval.D())
		}
		return etcd.New(e)
	}
	return nil, fmt.Errorf("db: expected %s or %s, found %q", DBTidal, DBEtcd, cfg.DB)
}
