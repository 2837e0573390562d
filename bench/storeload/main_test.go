package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// TestEventsAreUniqueAndTheSameForBothSystems: ids never repeat across
// workers, sequence numbers and batch positions (a repeat would be folded
// as a retry by tidal and be cheaper), and etcd stores exactly the JSON
// of the event tidal receives, under the entity's key.
func TestEventsAreUniqueAndTheSameForBothSystems(t *testing.T) {
	ev := newEvents(42, 1000, "view")
	seen := map[string]bool{}
	for w := range 3 {
		r := ev.rng(w)
		for seq := range uint64(20) {
			for i := range 3 {
				e := ev.event(w, seq, i, ev.entity(r))
				if seen[e.ID] {
					t.Fatalf("id %q repeated", e.ID)
				}
				seen[e.ID] = true
				if e.Entity < 1 || e.Entity > 1000 || e.Signal != "view" {
					t.Fatalf("expected entity in 1..1000 and signal view, found %+v", e)
				}
			}
		}
	}
	e := ev.event(1, 2, 0, 77)
	key, value := etcdPut(e)
	if key != "/tidal-bench/signals/77" {
		t.Errorf("expected the entity's key, found %q", key)
	}
	var back client.Event
	if err := json.Unmarshal(value, &back); err != nil || back != e {
		t.Errorf("expected etcd's value to be the event's JSON, found %s (%v)", value, err)
	}
	if other := newEvents(43, 1000, "view").event(1, 2, 0, 77); other.ID == e.ID || !strings.HasSuffix(e.ID, "-1-2-0") {
		t.Errorf("expected runs with different seeds to use different ids, found %q and %q", e.ID, other.ID)
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	for name, o := range map[string]options{
		"no endpoints": {system: "tidal", batch: 1, clients: 1},
		"bad system":   {system: "redis", endpoints: []string{"127.0.0.1:1"}, batch: 1, clients: 1},
		"etcd batch":   {system: "etcd", endpoints: []string{"127.0.0.1:1"}, batch: 100, clients: 1},
		"zero batch":   {system: "tidal", endpoints: []string{"127.0.0.1:1"}, batch: 0, clients: 1},
	} {
		if err := run(t.Context(), o); err == nil {
			t.Errorf("%s: expected an error", name)
		}
	}
}

// TestTidalCredentials: plaintext has no options; -http1 without
// -certs-dir is refused; -certs-dir presents the client certificate over
// TLS, on HTTP/2 by default (one shared connection) and with -http1 on
// HTTP/1.1 only (one connection per worker), which the record's
// connection count says.
func TestTidalCredentials(t *testing.T) {
	if opts, err := tidalCredentials(options{}); err != nil || len(opts) != 0 {
		t.Fatalf("plaintext: expected no options and no error, found %d, %v", len(opts), err)
	}
	if _, err := tidalCredentials(options{http1: true}); err == nil || !strings.Contains(err.Error(), "-certs-dir") {
		t.Fatalf("-http1 alone: expected an error naming -certs-dir, found %v", err)
	}
	if _, err := tidalCredentials(options{certsDir: t.TempDir(), certName: "writer"}); err == nil || !strings.Contains(err.Error(), "-certs-dir") {
		t.Fatalf("an empty certs dir: expected an error naming -certs-dir, found %v", err)
	}
	dir := t.TempDir()
	if _, err := certs.CreateCA(certs.CreateOptions{CertsDir: dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateClient(certs.CreateOptions{CertsDir: dir}, "writer", auth.Writer); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		http1       bool
		options     int
		connections int
	}{{false, 1, 1}, {true, 2, 64}} {
		opts, err := tidalCredentials(options{certsDir: dir, certName: "writer", http1: tc.http1})
		if err != nil || len(opts) != tc.options {
			t.Fatalf("http1=%v: expected %d options, found %d, %v", tc.http1, tc.options, len(opts), err)
		}
		tt := &tidalTarget{opts: opts, http1: tc.http1, workers: 64}
		if got := tt.connections(); got != tc.connections {
			t.Errorf("http1=%v: expected %d connections recorded for 64 workers, found %d", tc.http1, tc.connections, got)
		}
		if c := client.New("127.0.0.1:1", opts...); !strings.HasPrefix(c.Addr(), "https://") {
			t.Errorf("http1=%v: expected an https:// base, found %s", tc.http1, c.Addr())
		}
	}
}
