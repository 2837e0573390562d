//go:build tidalbugs

package ledger

import (
	"math"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/bugs"
)

// The planted aggregate defects, each shown switched
// off (the ledger's real computation) and on, so a hook that silently does
// nothing fails here rather than passing the bugs suite by luck. Run with
// `go test -tags tidalbugs -run Planted ./tidal-server/ledger/`.

func withDefect(t *testing.T, d bugs.Defect) {
	t.Helper()
	if bugs.Active(d) {
		t.Fatalf("defect %d is already on for this process (TIDAL_BUGS set?); the off half of the test would prove nothing", d)
	}
	t.Cleanup(bugs.Enable(d))
}

// hourWindow is one signal with a 1h window (1-minute buckets) and a 72h
// half-life, the server's default schema for it.
func hourWindow() Schema {
	return Schema{Signals: []SignalType{{Name: "like", HalfLife: 72 * time.Hour, Windows: []Window{{"1h", time.Hour}, {"all", 0}}}}, EmbeddingDim: 4}
}

// windowCounts applies one event 10 s into a minute and returns the 1h
// window's count read 10 s later (the event in the current bucket) and 61
// minutes later (the event in the bucket the window has just let go of).
func windowCounts(t *testing.T) (current, expired uint64) {
	t.Helper()
	l := New(hourWindow(), Options{})
	ts := t0 + ms(10*time.Second)
	mustApply(t, l, 1, ev("e", 1, "like", 1, ts))
	read := func(at int64) uint64 { return l.Get(1, at).Signals["like"].Windows["1h"] }
	return read(ts + ms(10*time.Second)), read(ts + ms(61*time.Minute))
}

func TestPlantedWindowOffByOneBucketCountsTheExpiredBucketNotTheCurrent(t *testing.T) {
	if current, expired := windowCounts(t); current != 1 || expired != 0 {
		t.Fatalf("defect off: expected the 1h window to count the event in its current bucket (1) and not after it expired (0), found %d and %d", current, expired)
	}
	withDefect(t, bugs.WindowOffByOneBucket)
	if current, expired := windowCounts(t); current != 0 || expired != 1 {
		t.Fatalf("window-off-by-one-bucket on: expected the event left out while its bucket is current (0) and counted once it expired (1), found %d and %d", current, expired)
	}
}

func TestPlantedDecayWrongHalfLifeDecaysHoursAsMinutes(t *testing.T) {
	score := func() float64 {
		l := New(hourWindow(), Options{})
		mustApply(t, l, 1, ev("e", 1, "like", 1, t0))
		return l.Get(1, t0+ms(72*time.Minute)).Signals["like"].Score
	}
	if got, want := score(), math.Exp2(-1.0/60); !closeEnough(got, want) {
		t.Fatalf("defect off: expected 72 minutes to decay a 72h half-life score to %v, found %v", want, got)
	}
	withDefect(t, bugs.DecayWrongHalfLife)
	if got := score(); !closeEnough(got, 0.5) {
		t.Fatalf("decay-wrong-half-life on: expected 72 minutes to halve the score (0.5), found %v", got)
	}
}
