package runner

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/db"
	"github.com/tidaldb/tidal/harness/db/etcd"
	"github.com/tidaldb/tidal/harness/nemesis"
)

// pauselessDB is a database that cannot be paused; Setup must never be
// reached when a run asks for a pause.
type pauselessDB struct{ t *testing.T }

func (pauselessDB) Name() string { return "pauseless" }
func (pauselessDB) Capabilities() nemesis.Capabilities {
	return nemesis.Capabilities{DB: "pauseless", Has: []nemesis.Capability{nemesis.CapNetwork, nemesis.CapKill, nemesis.CapLeader},
		Lacks: map[nemesis.Capability]string{nemesis.CapPause: "its nodes run where SIGSTOP does not reach"}}
}
func (d pauselessDB) Setup(context.Context, db.Env) (db.Cluster, error) {
	d.t.Fatal("Setup reached: the run should have been refused first")
	return nil, nil
}
func (pauselessDB) Check(db.CheckInput) []checker.Result { return nil }

// A run refuses a fault its database cannot take, saying
// which and why, before it starts anything or makes a run directory.
func TestRunRefusesFaultTheDBCannotTake(t *testing.T) {
	extraDBs["pauseless"] = func(Config) (db.DB, error) { return pauselessDB{t}, nil }
	defer delete(extraDBs, "pauseless")
	store := t.TempDir()
	_, err := Run(context.Background(), Config{DB: "pauseless", Nodes: 3, Store: store, Nemesis: []string{"kill", "pause-leader"}}, Options{})
	if err == nil {
		t.Fatal("expected the run refused, found no error")
	}
	for _, want := range []string{"pauseless", "pause-leader needs pause (its nodes run where SIGSTOP does not reach)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("expected the error to say %q, found %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "kill-one") {
		t.Errorf("expected kill kinds not named, found %v", err)
	}
	if ents, _ := os.ReadDir(store); len(ents) > 0 {
		t.Errorf("expected nothing made in the store, found %v", ents)
	}
}

// The tidal adapter takes every fault kind there is.
func TestTidalTakesEveryKind(t *testing.T) {
	if err := nemesis.CheckMix(nemesis.KindNames(), tidalDB{}.Capabilities()); err != nil {
		t.Fatal(err)
	}
}

func TestEtcdRefusesWhatItCannotRun(t *testing.T) {
	for _, cfg := range []Config{{DB: DBEtcd, Backend: BackendDocker}, {DB: DBEtcd, RelayBinary: "bin/tcp-relay"}, {DB: "mysql"}} {
		if _, err := openDB(cfg); err == nil {
			t.Errorf("%+v: expected an error, found none", cfg)
		}
	}
	if d, err := openDB(Config{DB: DBEtcd, Backend: BackendProcess}); err != nil || d.Name() != "etcd" {
		t.Fatalf("expected the etcd adapter, found %v, %v", d, err)
	}
}

// "all" against a database that lacks some capabilities runs the kinds it
// can take and leaves the others out; naming one of those by itself is
// still refused.
func TestAllMeansWhatTheDBCanTake(t *testing.T) {
	extraDBs["pauseless"] = func(Config) (db.DB, error) { return pauselessDB{t}, nil }
	defer delete(extraDBs, "pauseless")
	can, cannot := pauselessDB{}.Capabilities().Takeable(nemesis.KindNames())
	if len(can) == 0 || len(cannot) == 0 {
		t.Fatalf("expected some kinds taken and some not, found %v / %v", can, cannot)
	}
	for _, k := range cannot {
		if k == "kill-one" {
			t.Fatalf("expected kill-one taken, found it among %v", cannot)
		}
	}
	_, err := Run(context.Background(), Config{DB: "pauseless", Nodes: 3, Store: t.TempDir(), Nemesis: []string{"all", "pause-one"}}, Options{})
	if err == nil || !strings.Contains(err.Error(), "pause-one needs pause") {
		t.Fatalf("expected pause-one named by itself to be refused, found %v", err)
	}
}

// The etcd adapter's register search is bounded by the run's
// --linearizable-timeout, as tidal-server's is.
func TestEtcdLinearizableTimeout(t *testing.T) {
	t.Run("Regression: etcd linearizable timeout ignored", func(t *testing.T) {
		cfg := Config{DB: DBEtcd, Backend: BackendProcess, LinearizableTimeout: Duration(7 * time.Second)}
		d, err := openDB(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Duration(d.(*etcd.DB).Config().LinearizableTimeout); got != 7*time.Second {
			t.Fatalf("expected the etcd register search bounded by the run's 7s, found %v", got)
		}
	})
}
