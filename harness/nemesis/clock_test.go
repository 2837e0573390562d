package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// SetClockOffset makes the fake a ClockSetter: the call is recorded as
// "clock <node> <offset>", and a node not running defers it.
func (f *fakeCluster) SetClockOffset(_ context.Context, n string, offset time.Duration) (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf("clock %s %v", n, offset))
	if f.states[n] != cluster.Running {
		return time.Time{}, fmt.Errorf("%w: %s is %s", cluster.ErrClockDeferred, n, f.states[n])
	}
	return time.Now(), nil
}

// clockCalls lists the fake's clock calls in order.
func (f *fakeCluster) clockCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, "clock ") {
			out = append(out, c)
		}
	}
	return out
}

// Clock-skew draws a minority and one offset class per
// step (within ±20s or beyond ±3m), clock-jump one node ±2h; the offsets
// are in the schedule (schedule.json round trip) and no other kind draws
// any; the group "clock" and "all" hold both kinds.
func TestClockSchedule(t *testing.T) {
	cfg := ScheduleConfig{Duration: 10 * time.Minute, Interval: 5 * time.Second, FaultDuration: time.Second,
		Mix: []string{"clock-skew", "clock-jump", "kill-one"}, Nodes: []string{"n1", "n2", "n3", "n4", "n5"}}
	s, err := Generate(7, cfg)
	must(t, err)
	sizes := map[string]map[time.Duration]bool{"clock-skew": {}, "clock-jump": {}}
	for _, st := range s.Steps {
		if st.Kind == "kill-one" {
			if st.Offsets != nil {
				t.Fatalf("kill-one step with offsets %v", st.Offsets)
			}
			continue
		}
		if len(st.Offsets) != len(st.Targets) {
			t.Fatalf("%s on %v: offsets %v; expected one per target", st.Kind, st.Targets, st.Offsets)
		}
		if st.Kind == "clock-skew" && len(st.Targets) != 2 || st.Kind == "clock-jump" && len(st.Targets) != 1 {
			t.Fatalf("%s on %v: expected a minority of 5 (2) for skew, one node for jump", st.Kind, st.Targets)
		}
		for _, d := range st.Offsets {
			sizes[st.Kind][d.Abs()] = true
		}
	}
	if !sizes["clock-skew"][skewWithin] || !sizes["clock-skew"][skewBeyond] || len(sizes["clock-skew"]) != 2 {
		t.Errorf("clock-skew offsets drawn %v; expected both ±%v and ±%v, nothing else", sizes["clock-skew"], skewWithin, skewBeyond)
	}
	if !sizes["clock-jump"][jumpBy] || len(sizes["clock-jump"]) != 1 {
		t.Errorf("clock-jump offsets drawn %v; expected ±%v", sizes["clock-jump"], jumpBy)
	}
	b, err := json.Marshal(s)
	must(t, err)
	var back Schedule
	must(t, json.Unmarshal(b, &back))
	must(t, back.Validate())
	for i := range s.Steps {
		if fmt.Sprint(back.Steps[i].Offsets) != fmt.Sprint(s.Steps[i].Offsets) {
			t.Fatalf("step %d offsets %v after a JSON round trip; expected %v", i, back.Steps[i].Offsets, s.Steps[i].Offsets)
		}
	}
	bad := s
	bad.Steps = []Step{{Kind: "clock-jump", Targets: []string{"n1"}, Duration: time.Second}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "offsets: expected one for target n1") {
		t.Errorf("a clock step without offsets validated: %v", err)
	}
	for _, group := range []string{"clock", "all"} {
		mix, err := ParseMix(group, 3)
		must(t, err)
		if !UsesClock(mix) || !strings.Contains(strings.Join(mix, ","), "clock-skew") || !strings.Contains(strings.Join(mix, ","), "clock-jump") {
			t.Errorf("group %s expands to %v; expected both clock kinds", group, mix)
		}
	}
	if UsesClock([]string{"kill-one", "partition-halves"}) {
		t.Error("UsesClock says yes to a mix without clock kinds")
	}
}

// A clock fault records its offsets and the bound in the
// history (invoke / took effect / heal, like every fault), moves each
// target's clock, and its heal (or HealAll, for a node killed meanwhile)
// sets them back.
func TestClockFaultRecordedAndHealed(t *testing.T) {
	ctx := context.Background()
	f := newFake(t, 3)
	rec, path := newRecorder(t)
	r := NewRunner(f, rec, nil)
	st := Step{Kind: "clock-skew", Targets: []string{"n2"}, Duration: time.Second, Offsets: map[string]time.Duration{"n2": -3 * time.Minute}}
	must(t, r.Inject(ctx, st))
	must(t, r.Heal(ctx, "clock-skew"))
	st = Step{Kind: "clock-jump", Targets: []string{"n3"}, Duration: time.Second, Offsets: map[string]time.Duration{"n3": 2 * time.Hour}}
	must(t, r.Inject(ctx, st))
	must(t, f.Kill("n3"))
	must(t, r.HealAll(ctx))
	want := []string{"clock n2 -3m0s", "clock n2 0s", "clock n3 2h0m0s", "clock n3 0s"}
	if got := f.clockCalls(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("clock calls %v; expected %v", got, want)
	}
	ops := readHistory(t, rec, path)
	var faults []history.Op
	for _, op := range ops {
		if op.F == history.FClock && op.Type == history.OK {
			faults = append(faults, op)
		}
	}
	if len(faults) != 2 {
		t.Fatalf("expected 2 clock faults that took effect, found %d", len(faults))
	}
	v, err := history.Decode[history.FaultValue](faults[0])
	must(t, err)
	var p history.ClockParams
	must(t, json.Unmarshal(v.Params, &p))
	if v.Kind != "skew" || p.OffsetsMS["n2"] != -180000 || p.BoundMS != DefaultClockBound.Milliseconds() {
		t.Fatalf("recorded %+v params %+v; expected skew of n2 by -180000ms, bound 60000ms", v, p)
	}
	kinds := []checker.FaultKind{mustKind(t, "clock-skew").Recorded(), mustKind(t, "clock-jump").Recorded()}
	if res := checker.Faults(ops, kinds); res.Valid != checker.Valid {
		t.Fatalf("faults checker: expected both clock kinds exercised, found %s: %s", res.Valid, res.Summary)
	}

	// A target not running: not applied, nothing moved.
	f2 := newFake(t, 3)
	rec2, _ := newRecorder(t)
	must(t, f2.Pause("n1"))
	err = NewRunner(f2, rec2, nil).Inject(ctx, Step{Kind: "clock-jump", Targets: []string{"n1"}, Duration: time.Second, Offsets: map[string]time.Duration{"n1": time.Hour}})
	if err == nil || len(f2.clockCalls()) != 0 {
		t.Fatalf("clock-jump on a paused node: err %v, calls %v; expected not applied and no call", err, f2.clockCalls())
	}
}

// Against real processes: clock-jump moves one node's
// clock through its offset file; from the moment it took effect that node
// refuses writes (503 naming its clock) while the others take them; after
// the heal it takes writes again once it has measured its peers anew.
func TestLiveClockJump(t *testing.T) {
	l := startLive(t)
	ctx := context.Background()
	target := "n2"
	must(t, l.r.Inject(ctx, Step{Kind: "clock-jump", Targets: []string{target}, Duration: time.Second,
		Offsets: map[string]time.Duration{target: 2 * time.Hour}}))
	if got, err := l.c.ClockOffset(ctx, target); err != nil || got != 2*time.Hour {
		t.Fatalf("%s reports clock offset %v (%v); expected 2h", target, got, err)
	}
	_, err := l.write(ctx, target)
	var api *client.APIError
	if !errors.As(err, &api) || api.Status != 503 || !strings.Contains(api.Message, "clock") {
		t.Fatalf("write via %s right after its clock jumped 2h: expected 503 naming the clock, found %v", target, err)
	}
	if _, err := l.write(ctx, "n1"); err != nil {
		t.Fatalf("write via n1 while %s's clock is off: %v", target, err)
	}
	must(t, l.r.Heal(ctx, "clock-jump"))
	deadline := time.Now().Add(30 * time.Second) // liveness bound only
	for {
		_, err := l.write(ctx, target)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("write via %s after its clock was set back: still failing: %v", target, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	got, _ := l.healAndCheck(t)
	want := []string{
		"invoke clock jump " + target, "ok clock jump " + target,
		"invoke heal-clock jump " + target, "ok heal-clock jump " + target,
		"invoke heal-all all n1,n2,n3", "ok heal-all all n1,n2,n3",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("nemesis ops: expected %v, found %v", want, got)
	}
}
