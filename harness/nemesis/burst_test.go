package nemesis

import (
	"encoding/json"
	"testing"
	"time"
)

// A pause-leader-burst fills its fault window with leader pauses of 1-3
// election timeouts, in whole milliseconds, never overlapping, each
// followed by a gap of at least half an election timeout; it survives
// the schedule's JSON round trip.
func TestPauseLeaderBurst(t *testing.T) {
	et := 500 * time.Millisecond
	cfg := ScheduleConfig{Duration: time.Minute, Interval: 10 * time.Second, FaultDuration: 8 * time.Second,
		Mix: []string{"pause-leader-burst"}, Nodes: []string{"n1", "n2", "n3"}, ElectionTimeout: et}
	s, err := Generate(7, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Steps) < 8 {
		t.Fatalf("expected bursts of several pauses over a minute, found %d steps", len(s.Steps))
	}
	lengths := map[time.Duration]bool{}
	for i, st := range s.Steps {
		if st.Kind != "pause-leader-burst" || len(st.Targets) != 0 {
			t.Fatalf("step %d: expected a leader pause resolved at run time, found %+v", i, st)
		}
		if st.Duration < et || st.Duration > 3*et || st.Duration%time.Millisecond != 0 {
			t.Fatalf("step %d: expected a pause of 1-3 election timeouts in whole ms, found %s", i, st.Duration)
		}
		if st.At+st.Duration > cfg.Duration {
			t.Fatalf("step %d: expected it healed by the end of the run, found %s + %s", i, st.At, st.Duration)
		}
		if i > 0 {
			prev := s.Steps[i-1]
			if gap := st.At - (prev.At + prev.Duration); gap < et/2 {
				t.Fatalf("step %d: expected a gap of at least %s after the pause before, found %s", i, et/2, gap)
			}
		}
		lengths[st.Duration] = true
	}
	if len(lengths) < len(s.Steps)/2 {
		t.Fatalf("expected pause lengths drawn, not repeated: %d distinct of %d", len(lengths), len(s.Steps))
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back Schedule
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Config.ElectionTimeout != et || len(back.Steps) != len(s.Steps) || back.Steps[3].Duration != s.Steps[3].Duration {
		t.Fatalf("expected the schedule to survive JSON, found %+v", back.Config)
	}
	if err := back.Validate(); err != nil {
		t.Fatal(err)
	}
	// Opt-in: "all" leaves it out.
	mix, err := ParseMix("all", 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range mix {
		if k == "pause-leader-burst" {
			t.Fatal("expected all to leave the opt-in pause-leader-burst out")
		}
	}
}
