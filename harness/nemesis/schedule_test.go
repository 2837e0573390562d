package nemesis

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func genConfig(mix ...string) ScheduleConfig {
	return ScheduleConfig{
		Duration: 10 * time.Minute, Interval: 5 * time.Second, FaultDuration: 4 * time.Second,
		Mix: mix, Nodes: []string{"n1", "n2", "n3", "n4", "n5"},
	}
}

func TestGenerateIsDeterministic(t *testing.T) {
	cfg := genConfig("partition", "kill-leader", "pause-minority", "slow-links", "transfer-leader")
	cfg.Mix, _ = ParseMix(strings.Join(cfg.Mix, ","), len(cfg.Nodes))
	a, err := Generate(42, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Generate(42, cfg)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("same seed, different schedules:\n%+v\n%+v", a.Steps[:3], b.Steps[:3])
	}
	c, _ := Generate(43, cfg)
	if reflect.DeepEqual(a.Steps, c.Steps) {
		t.Fatal("seeds 42 and 43 gave the same schedule")
	}
	if len(a.Steps) < 50 {
		t.Fatalf("10 minutes at a 5s mean interval: expected at least 50 steps, found %d", len(a.Steps))
	}
}

func TestGenerateRespectsMixAndClasses(t *testing.T) {
	mix := []string{"partition-halves", "majorities-ring", "kill-minority", "pause-one", "restart-one", "bandwidth", "transfer-leader"}
	for seed := range int64(20) {
		s, err := Generate(seed, genConfig(mix...))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		busy := map[Class]time.Duration{}
		var last time.Duration
		for i, st := range s.Steps {
			k, ok := LookupKind(st.Kind)
			if !ok || !slices.Contains(mix, st.Kind) {
				t.Fatalf("seed %d step %d: kind %q is not in the mix %v", seed, i, st.Kind, mix)
			}
			seen[st.Kind] = true
			if st.At <= last && i > 0 {
				t.Fatalf("seed %d step %d: starts at %s, not after the previous step at %s", seed, i, st.At, last)
			}
			last = st.At
			if busy[k.Class] > st.At {
				t.Fatalf("seed %d step %d: %s at %s overlaps a %s fault active until %s", seed, i, st.Kind, st.At, k.Class, busy[k.Class])
			}
			if k.Instant != (st.Duration == 0) {
				t.Fatalf("seed %d step %d: %s (instant %v) has duration %s", seed, i, st.Kind, k.Instant, st.Duration)
			}
			if !k.Instant {
				busy[k.Class] = st.At + st.Duration
			}
			if end := st.At + st.Duration; end > s.Config.Duration {
				t.Fatalf("seed %d step %d: ends at %s, after the run (%s)", seed, i, end, s.Config.Duration)
			}
			switch st.Kind {
			case "kill-minority":
				if len(st.Targets) != 2 {
					t.Fatalf("seed %d step %d: minority of 5: expected 2 targets, found %v", seed, i, st.Targets)
				}
			case "partition-halves", "majorities-ring":
				if got := slices.Sorted(slices.Values(st.Targets)); !slices.Equal(got, s.Config.Nodes) {
					t.Fatalf("seed %d step %d: expected an order of every node, found %v", seed, i, st.Targets)
				}
			case "bandwidth":
				if st.Link == nil || st.Link.Type != "bandwidth" || st.Link.RateBytes != 128<<10 {
					t.Fatalf("seed %d step %d: bandwidth link spec %+v", seed, i, st.Link)
				}
			}
		}
		if len(seen) != len(mix) {
			t.Fatalf("seed %d: expected every kind of the mix over 10 minutes, found only %v", seed, seen)
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("seed %d: generated schedule does not validate: %v", seed, err)
		}
	}
}

func TestScheduleJSONRoundTrip(t *testing.T) {
	s, err := Generate(7, genConfig("partition", "kill", "pause", "slow", "membership", "transfer", "restart"))
	if err == nil {
		t.Fatal("group names are not kinds: expected Generate to refuse them")
	}
	cfg := genConfig()
	cfg.Mix, err = ParseMix("partition,kill,pause,slow,membership,transfer,restart", 5)
	if err != nil {
		t.Fatal(err)
	}
	if s, err = Generate(7, cfg); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "schedule.json")
	if err := s.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	back, err := LoadSchedule(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s, back) {
		t.Fatalf("round trip changed the schedule:\nwrote %+v\nread  %+v", s.Config, back.Config)
	}
	// Durations are written for people.
	b, _ := s.Steps[0].MarshalJSON()
	if !strings.Contains(string(b), `"at":"`) {
		t.Fatalf("expected at as a duration string, found %s", b)
	}
}

func TestLoadScheduleRejectsBadSteps(t *testing.T) {
	s := Schedule{Config: genConfig("kill-one"), Steps: []Step{
		{At: time.Second, Kind: "kill-everything", Duration: time.Second},
		{At: time.Second, Kind: "kill-one", Targets: []string{"n9"}, Duration: time.Second},
		{At: time.Second, Kind: "pause-one", Targets: []string{"n1"}},
		{At: time.Second, Kind: "slow-links", Duration: time.Second},
	}}
	path := filepath.Join(t.TempDir(), "schedule.json")
	if err := s.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	_, err := LoadSchedule(path)
	if err == nil {
		t.Fatal("expected an invalid schedule to be refused")
	}
	for _, want := range []string{`step 0: unknown kind "kill-everything"`, `step 1 (kill-one): target "n9"`, "step 2 (pause-one): duration", "step 3 (slow-links): link"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q: expected it to say %q", err, want)
		}
	}
}

func TestGenerateRefusesBadConfig(t *testing.T) {
	cfg := genConfig("majorities-ring")
	cfg.Nodes = []string{"n1", "n2", "n3"}
	if _, err := Generate(1, cfg); err == nil || !strings.Contains(err.Error(), "majorities-ring expects at least 4 nodes, found 3") {
		t.Fatalf("majorities-ring on 3 nodes: expected a refusal naming it, found %v", err)
	}
	cfg = genConfig()
	cfg.Duration = 0
	if _, err := Generate(1, cfg); err == nil || !strings.Contains(err.Error(), "duration") || !strings.Contains(err.Error(), "mix") {
		t.Fatalf("expected errors for duration and mix, found %v", err)
	}
}

func TestParseMix(t *testing.T) {
	got, err := ParseMix("partition-halves, kill-leader,pause-one,kill", 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"partition-halves", "kill-leader", "pause-one", "kill-one", "kill-minority"}
	if !slices.Equal(got, want) {
		t.Fatalf("expected %v, found %v", want, got)
	}
	part3, _ := ParseMix("partition", 3)
	part5, _ := ParseMix("partition", 5)
	if slices.Contains(part3, "majorities-ring") || !slices.Contains(part5, "majorities-ring") {
		t.Fatalf("the partition group: expected majorities-ring only on 5 nodes, found %v (3) and %v (5)", part3, part5)
	}
	all, _ := ParseMix("all", 5)
	if want := slices.DeleteFunc(KindNames(), func(k string) bool { return k == "power-cut-reorder" || k == "pause-leader-burst" }); !slices.Equal(all, want) {
		t.Fatalf("all on 5 nodes: expected every kind but the opt-in power-cut-reorder and pause-leader-burst, found %v", all)
	}
	if got, err := ParseMix("power-cut-reorder", 3); err == nil && !slices.Equal(got, []string{"power-cut-reorder"}) {
		t.Fatalf("power-cut-reorder named: expected it alone, found %v", got)
	}
	_, err = ParseMix("partition-halves,kill-everyone", 3)
	if err == nil || !strings.Contains(err.Error(), `"kill-everyone"`) || !strings.Contains(err.Error(), "kill-leader") || !strings.Contains(err.Error(), "partition") {
		t.Fatalf("expected an error naming the unknown kind and listing the valid ones, found %v", err)
	}
	if _, err := ParseMix("majorities-ring", 3); err == nil {
		t.Fatal("majorities-ring named on 3 nodes: expected an error")
	}
}

func TestHelpDescribesEveryKind(t *testing.T) {
	h := Help()
	for _, k := range Kinds() {
		if k.Doc == "" || !strings.Contains(h, k.Name+" ") {
			t.Errorf("help: expected a line for %s", k.Name)
		}
	}
}

// A heal-<f> closes every open window of f (checker.FaultWindows), so two
// kinds sharing an f must share a class, which holds one fault at a time.
func TestKindsSharingAnFShareAClass(t *testing.T) {
	classOf := map[string]Class{}
	for _, k := range Kinds() {
		if c, ok := classOf[k.F]; ok && c != k.Class {
			t.Errorf("%s: f %q is in class %s here and %s elsewhere", k.Name, k.F, k.Class, c)
		}
		classOf[k.F] = k.Class
		if !k.Leader && k.pick == nil {
			t.Errorf("%s: expected targets picked at generation, as it is not resolved at run time", k.Name)
		}
	}
}

// A run asked for "partition,kill,pause" gets at least one fault of each
// group whenever it has a start for each: before groups were covered
// first, 1 seed in 8 drew six partition shapes and kills and no pause,
// and the run passed without the fault it was asked for.
func TestGenerateCoversEveryGroupRequested(t *testing.T) {
	mix, err := ParseMix("partition,kill,pause", 3)
	if err != nil {
		t.Fatal(err)
	}
	for seed := int64(1); seed <= 300; seed++ {
		s, err := Generate(seed, ScheduleConfig{Duration: time.Minute, Interval: 8 * time.Second, FaultDuration: 4 * time.Second,
			Mix: mix, Nodes: []string{"n1", "n2", "n3"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Steps) < 3 {
			continue // too few starts to cover three groups
		}
		got := map[string]bool{}
		for _, st := range s.Steps {
			got[groupOf(st.Kind)] = true
		}
		for _, g := range []string{"partition", "kill", "pause"} {
			if !got[g] {
				t.Fatalf("seed %d: expected a %s fault among %d steps, found %v", seed, g, len(s.Steps), s.Steps)
			}
		}
	}
}
