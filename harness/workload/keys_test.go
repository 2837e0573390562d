package workload

import (
	"testing"

	"github.com/tidaldb/tidal/harness/history"
)

// Regression: a key slot moves to a fresh key after
// OpsPerKey ops or InfosPerKey info adds (info reads do not count), and
// workers share a slot's key only with the workers of the same slot.
func TestKeySlots(t *testing.T) {
	cfg, err := Config{Kind: Counter, Keys: 2, OpsPerKey: 3, InfosPerKey: 2}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	k := newKeySlots(&cfg)
	a, b := k.take(0), k.take(1)
	if a == b || k.take(2) != a || k.take(3) != b {
		t.Fatalf("expected workers 0 and 2 on one key, 1 and 3 on another; found %d, %d", a, b)
	}
	// Slot 0 has taken 2 ops; the third is the last on its key.
	if got := k.take(0); got != a {
		t.Fatalf("expected the third op on key %d, found %d", a, got)
	}
	a2 := k.take(0)
	if a2 == a || a2 == b {
		t.Fatalf("expected a fresh key after %d ops, found %d (old %d, %d)", cfg.OpsPerKey, a2, a, b)
	}

	// Info adds retire the key; info reads and ok adds do not.
	k.done(0, a2, history.FRead, history.Info)
	k.done(0, a2, history.FAdd, history.OK)
	k.done(0, a2, history.FAdd, history.Info)
	if got := k.take(0); got != a2 {
		t.Fatalf("expected key %d kept after one info add, found %d", a2, got)
	}
	k.done(2, a2, history.FAdd, history.Info)
	a3 := k.take(2)
	if a3 == a2 {
		t.Fatalf("expected a fresh key after %d info adds, found %d again", cfg.InfosPerKey, a3)
	}
	// An info on a key the slot already left changes nothing.
	k.done(0, a2, history.FAdd, history.Info)
	k.done(0, a2, history.FAdd, history.Info)
	if got := k.take(0); got != a3 {
		t.Fatalf("expected key %d kept: infos on a retired key do not count, found %d", a3, got)
	}

	used := k.used()
	if len(used) != 4 || used[0] != CounterBase || used[3] != CounterBase+3 {
		t.Errorf("expected keys CounterBase..CounterBase+3 handed out, found %v", used)
	}
}
