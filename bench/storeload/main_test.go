package main

import (
	"encoding/json"
	"strings"
	"testing"

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
		"no endpoints":               {system: "tidal", batch: 1, clients: 1},
		"bad system":                 {system: "redis", endpoints: []string{"127.0.0.1:1"}, batch: 1, clients: 1},
		"etcd batch":                 {system: "etcd", endpoints: []string{"127.0.0.1:1"}, batch: 100, clients: 1},
		"zero batch":                 {system: "tidal", endpoints: []string{"127.0.0.1:1"}, batch: 0, clients: 1},
		"bad protocol":               {system: "tidal", endpoints: []string{"127.0.0.1:1"}, batch: 1, clients: 1, protocol: "quic"},
		"grpc without its endpoints": {system: "tidal", endpoints: []string{"127.0.0.1:1"}, batch: 1, clients: 1, protocol: "grpc"},
	} {
		if err := run(t.Context(), o); err == nil {
			t.Errorf("%s: expected an error", name)
		}
	}
}
