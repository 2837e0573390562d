package cluster_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/process"
)

// fakeEnv makes the test binary stand in for tidal-server: it binds
// --peer-addr and --client-addr as tidal-server does and then runs until
// killed, or, when binding fails, prints tidal-server's "error: ..." line
// and exits 1. failEnv makes it exit at once with that error instead.
const (
	fakeEnv = "CLUSTER_TEST_FAKE_SERVER"
	failEnv = "CLUSTER_TEST_FAKE_FAIL"
)

func TestMain(m *testing.M) {
	if os.Getenv(fakeEnv) != "" {
		fakeServer(os.Args[1:])
		return
	}
	os.Exit(m.Run())
}

func fakeServer(args []string) {
	flag := func(name string) string {
		for i, a := range args {
			if a == name && i+1 < len(args) {
				return args[i+1]
			}
		}
		return ""
	}
	if msg := os.Getenv(failEnv); msg != "" {
		fmt.Fprintln(os.Stderr, "error:", msg)
		os.Exit(1)
	}
	var lns []net.Listener
	for _, what := range []string{"peer", "client"} {
		addr := flag("--" + what + "-addr")
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "error: %s listener on %s: %v\n", what, addr, err)
			os.Exit(1)
		}
		lns = append(lns, ln)
	}
	fmt.Println("fake tidal-server up")
	select {}
}

// stealingBackend is the process backend with a neighbour that takes a
// node's client port between New choosing it and the node binding it, as
// a busy host does.
type stealingBackend struct {
	*process.Backend
	t      *testing.T
	victim string
	steals int // how many launches of victim lose their port

	mu       sync.Mutex
	launches map[string]int
	stolen   []string
}

func (b *stealingBackend) Launch(spec cluster.NodeSpec) (cluster.Handle, error) {
	b.mu.Lock()
	b.launches[spec.Name]++
	if spec.Name == b.victim && len(b.stolen) < b.steals {
		addr := argAfter(spec.Args, "--client-addr")
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			b.t.Errorf("could not take %s's port %s: %v", spec.Name, addr, err)
		} else {
			b.t.Cleanup(func() { ln.Close() })
			b.stolen = append(b.stolen, addr)
		}
	}
	b.mu.Unlock()
	return b.Backend.Launch(spec)
}

func argAfter(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func newStealing(t *testing.T, steals int) *stealingBackend {
	t.Setenv(fakeEnv, "1")
	be, err := process.NewBackend(os.Args[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	return &stealingBackend{Backend: be, t: t, victim: "n2", steals: steals, launches: map[string]int{}}
}

// Regression: New chose ports by opening and closing
// listeners and started the nodes later; on a busy host another process
// took one, the node exited at once with "address already in use", and
// the run waited 60s to say "cluster did not come up". New now waits for
// each node to bind its own listeners, notices the exit at once, and
// starts again on fresh ports.
func TestNewRetriesOnFreshPortsWhenOneIsTaken(t *testing.T) {
	be := newStealing(t, 1)
	var logs bytes.Buffer
	c, err := cluster.New(cluster.Config{Nodes: 3, Backend: be, Dir: t.TempDir(), StatsInterval: -1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("expected New to recover from the taken port, found %v", err)
	}
	t.Cleanup(func() { c.Close() })
	n2 := c.Nodes()[1]
	if len(be.stolen) != 1 || n2.ClientAddr == be.stolen[0] {
		t.Fatalf("expected n2 on a fresh port, not the taken %v, found %s", be.stolen, n2.ClientAddr)
	}
	if be.launches["n1"] != 2 || be.launches["n2"] != 2 || be.launches["n3"] != 2 {
		t.Errorf("expected every node launched again on fresh ports (twice each), found %v", be.launches)
	}
	if !strings.Contains(logs.String(), "address already in use") {
		t.Errorf("expected the retry logged with the node's own error, found:\n%s", logs.String())
	}
	// Every node is up: listening on its own ports, through the relays too.
	for _, n := range c.Nodes() {
		conn, err := net.Dial("tcp", n.ClientRelay)
		if err != nil {
			t.Errorf("%s: dial its client relay %s: %v", n.Name, n.ClientRelay, err)
			continue
		}
		conn.Close()
	}
}

// A port taken on every attempt: New gives up after its attempts and says
// why, quoting the node.
func TestNewGivesUpWhenPortsKeepBeingTaken(t *testing.T) {
	be := newStealing(t, 1000)
	_, err := cluster.New(cluster.Config{Nodes: 3, Backend: be, Dir: t.TempDir(), StatsInterval: -1})
	var se *cluster.StartError
	if !errors.As(err, &se) || !se.PortTaken || se.Node != "n2" || !strings.Contains(err.Error(), "address already in use") ||
		!strings.Contains(err.Error(), "3 attempts") {
		t.Fatalf("expected a StartError for n2 quoting \"address already in use\" after 3 attempts, found %v", err)
	}
}

// Regression: a node that exits during start-up for any
// other reason fails New at once, quoting the node's own error and naming
// its log — no retry, no 60s wait for a leader that cannot come.
func TestNewQuotesANodeThatExitsAtStart(t *testing.T) {
	be := newStealing(t, 0)
	t.Setenv(failEnv, "wal: corrupt record in 0000000000000001.wal at offset 4096")
	dir := t.TempDir()
	_, err := cluster.New(cluster.Config{Nodes: 3, Backend: be, Dir: dir, StatsInterval: -1})
	var se *cluster.StartError
	if !errors.As(err, &se) {
		t.Fatalf("expected a *StartError, found %v", err)
	}
	if !se.Exited || se.PortTaken || !strings.Contains(se.Quote, "error: wal: corrupt record in 0000000000000001.wal at offset 4096") ||
		!strings.HasPrefix(se.Log, filepath.Join(dir, se.Node)) {
		t.Errorf("expected the node's own error quoted from its log under %s, found %+v", dir, se)
	}
	for name, n := range be.launches {
		if n != 1 {
			t.Errorf("expected no retry for an error other than a taken port, found %s launched %d times", name, n)
		}
	}
}

// The harness's nodes get small WAL segments: 64 MiB
// preallocated per node made every chaos run leave ~230 MB.
func TestNodesGetSmallWALSegments(t *testing.T) {
	be := newStealing(t, 0)
	var args []string
	rec := &recordingBackend{stealingBackend: be, args: &args}
	c, err := cluster.New(cluster.Config{Nodes: 1, Backend: rec, Dir: t.TempDir(), StatsInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if got := argAfter(args, "--wal-segment-size"); got != fmt.Sprint(cluster.DefaultWALSegmentSize) {
		t.Errorf("expected --wal-segment-size %d, found %q in %v", cluster.DefaultWALSegmentSize, got, args)
	}
}

type recordingBackend struct {
	*stealingBackend
	args *[]string
}

func (b *recordingBackend) Launch(spec cluster.NodeSpec) (cluster.Handle, error) {
	*b.args = spec.Args
	return b.stealingBackend.Launch(spec)
}
