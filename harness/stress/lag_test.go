package stress

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestTimeLag(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	history := []commitSeen{{at(0), 10}, {at(10), 20}, {at(20), 30}}
	for _, tc := range []struct {
		applied uint64
		now     time.Time
		want    time.Duration
	}{
		{30, at(25), 0},                     // caught up with everything seen
		{25, at(25), 5 * time.Millisecond},  // entries 26..30 first seen at 20ms
		{20, at(25), 5 * time.Millisecond},  // 21.. first seen at 20ms
		{19, at(25), 15 * time.Millisecond}, // 20 first seen at 10ms
		{5, at(25), 25 * time.Millisecond},  // behind the whole history
		{5, at(0), 0},                       // never negative
	} {
		if got := timeLag(history, tc.applied, tc.now); got != tc.want {
			t.Errorf("applied %d at %s: expected lag %s, found %s", tc.applied, tc.now.Sub(t0), tc.want, got)
		}
	}
}

// statusServer answers /cluster/status as a node would, each answer after
// delay (a loaded machine answers late). After its polls-th answer it calls
// done (when not nil): a test ends the sampling on how many rounds ran,
// not after a fixed time that a slow machine fills with fewer rounds.
func statusServer(t *testing.T, delay time.Duration, polls int64, done func(), node, leader, commit, applied uint64) *httptest.Server {
	t.Helper()
	var answered atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/cluster/status" {
			http.NotFound(w, r)
			return
		}
		time.Sleep(delay)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"node": node, "leader": leader, "term": 2, "commit": commit, "applied": applied, "members": []any{},
		})
		if answered.Add(1) == polls && done != nil {
			done()
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// machineSpeeds runs a lag test as on an idle machine and as on a loaded
// one, where every status answer comes 150ms late.
var machineSpeeds = []struct {
	name  string
	delay time.Duration
}{{"idle", 0}, {"loaded", 150 * time.Millisecond}}

// hangGuard bounds a sampling that its condition should have ended long
// before; it is no assertion about speed.
const hangGuard = 2 * time.Minute

// TestSampleLag: a leader at commit 1000, one follower stuck 10 entries
// behind, one caught up. The stuck follower's oldest missing entry was
// committed before sampling began, so its time lag grows with the run.
//
// Regression: the sampling ran for a fixed 400ms and the
// test wanted 5 rounds in it, which a loaded machine (or the race detector)
// does not always fit; it now ends once the leader has answered the 6th
// poll, so at least 5 rounds were complete, however long they took.
func TestSampleLag(t *testing.T) {
	for _, speed := range machineSpeeds {
		t.Run(speed.name, func(t *testing.T) { testSampleLag(t, speed.delay) })
	}
}

func testSampleLag(t *testing.T, delay time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	// Round k starts only after round k-1 was counted, so when the leader
	// answers its 6th poll, 5 rounds are in the report; the 6th may be cut
	// short by the cancel (and is then dropped, not counted).
	leader := statusServer(t, delay, 6, cancel, 1, 1, 1000, 1000)
	stuck := statusServer(t, delay, 0, nil, 2, 1, 1000, 990)
	current := statusServer(t, delay, 0, nil, 3, 1, 1000, 1000)
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close() // a node that does not answer counts as failed polls

	rep := SampleLag(ctx, []string{leader.URL, stuck.URL, current.URL, downURL}, 10*time.Millisecond)
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("the sampling was not ended by the leader's 6th answer within %s: %+v", hangGuard, rep)
	}
	if rep.Rounds < 5 || rep.Failed < rep.Rounds || rep.NoLeader != 0 || rep.Elections != 0 {
		t.Fatalf("expected several rounds with a leader and a failed poll each, found %+v", rep)
	}
	if len(rep.Followers) != 2 || rep.Followers[0].Node != 2 || rep.Followers[1].Node != 3 {
		t.Fatalf("expected followers 2 and 3, found %+v", rep.Followers)
	}
	f2, f3 := rep.Followers[0], rep.Followers[1]
	if f2.EntriesP50 != 10 || f2.EntriesMax != 10 {
		t.Errorf("node 2: expected a steady lag of 10 entries, found p50 %d max %d", f2.EntriesP50, f2.EntriesMax)
	}
	// Growing, not a figure: how far it grows in 400ms depends on how
	// often a loaded machine lets the sampler run.
	if f2.TimeMax <= 0 || f2.TimeP50 >= f2.TimeMax {
		t.Errorf("node 2: expected a time lag growing over the run, found p50 %s max %s", f2.TimeP50, f2.TimeMax)
	}
	if f3.EntriesMax != 0 || f3.TimeMax != 0 {
		t.Errorf("node 3: expected no lag, found %d entries, %s", f3.EntriesMax, f3.TimeMax)
	}
	if rep.All.Samples != f2.Samples+f3.Samples || rep.All.EntriesMax != 10 {
		t.Errorf("expected the summary to pool both followers, found %+v", rep.All)
	}
}

// Regression: a fixed 150ms, which a loaded machine can
// spend on the first round alone, is now "until the second poll of a".
func TestSampleLagWithoutLeader(t *testing.T) {
	for _, speed := range machineSpeeds {
		t.Run(speed.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			a := statusServer(t, speed.delay, 2, cancel, 1, 0, 5, 5)
			b := statusServer(t, speed.delay, 0, nil, 2, 0, 5, 5)
			rep := SampleLag(ctx, []string{a.URL, b.URL}, 10*time.Millisecond)
			if !errors.Is(ctx.Err(), context.Canceled) {
				t.Fatalf("the sampling was not ended by a's 2nd answer within %s: %+v", hangGuard, rep)
			}
			if rep.Rounds != 0 || rep.NoLeader == 0 || len(rep.Followers) != 0 {
				t.Errorf("expected only leaderless rounds, found %+v", rep)
			}
		})
	}
}
