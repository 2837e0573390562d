package shrink

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/nemesis"
)

// Episode is the unit the shrink removes: one fault step of the original
// schedule together with its heal, which the step carries as its
// duration (instant kinds have none and are episodes alone). ID is the
// step's index in the original schedule, so an episode keeps its name
// while its offset, duration and targets are shortened.
type Episode struct {
	ID   int          `json:"id"`
	Step nemesis.Step `json:"step"`
}

func (e Episode) String() string {
	s := fmt.Sprintf("#%d %s@%s", e.ID, e.Step.Kind, e.Step.At.Round(time.Millisecond))
	if e.Step.Duration > 0 {
		s += "+" + e.Step.Duration.Round(time.Millisecond).String()
	}
	if len(e.Step.Targets) > 0 {
		s += "[" + strings.Join(e.Step.Targets, ",") + "]"
	}
	return s
}

// End is when the episode's fault is healed (its start for an instant
// one).
func (e Episode) End() time.Duration { return e.Step.At + e.Step.Duration }

// Candidate is one schedule the shrink tries: episodes in start order and
// how long the run's workload lasts. The workload keeps the original
// run's seed; only the faults and the run's length change.
type Candidate struct {
	Episodes []Episode     `json:"episodes"`
	Duration time.Duration `json:"-"`
}

// FromSchedule makes the candidate that replays s unchanged for a run of
// duration d.
func FromSchedule(s nemesis.Schedule, d time.Duration) Candidate {
	c := Candidate{Duration: d}
	for i, st := range s.Steps {
		c.Episodes = append(c.Episodes, Episode{ID: i, Step: st})
	}
	return c
}

// Schedule is base with the candidate's steps and duration: the schedule
// a run of the candidate replays (base keeps the seed and the generation
// config, so the stored schedule still says where it came from).
func (c Candidate) Schedule(base nemesis.Schedule) nemesis.Schedule {
	s := base
	s.Config.Duration = c.Duration
	s.Config.Mix = nil
	s.Steps = nil
	for _, e := range c.Episodes {
		s.Steps = append(s.Steps, e.Step)
		if !slices.Contains(s.Config.Mix, e.Step.Kind) {
			s.Config.Mix = append(s.Config.Mix, e.Step.Kind)
		}
	}
	return s
}

// IDs are the candidate's episode IDs, in start order.
func (c Candidate) IDs() []int {
	out := make([]int, len(c.Episodes))
	for i, e := range c.Episodes {
		out[i] = e.ID
	}
	return out
}

// Keep is the candidate with only the episodes whose IDs are in ids.
func (c Candidate) Keep(ids []int) Candidate {
	out := Candidate{Duration: c.Duration}
	for _, e := range c.Episodes {
		if slices.Contains(ids, e.ID) {
			out.Episodes = append(out.Episodes, e)
		}
	}
	return out
}

// with is the candidate with episode i replaced by e (a deep enough copy
// that the original's steps are never shared with a variant's).
func (c Candidate) with(i int, e Episode) Candidate {
	out := Candidate{Duration: c.Duration, Episodes: slices.Clone(c.Episodes)}
	out.Episodes[i] = e
	return out
}

// End is when the candidate's last fault is healed.
func (c Candidate) End() time.Duration {
	var end time.Duration
	for _, e := range c.Episodes {
		end = max(end, e.End())
	}
	return end
}

func (c Candidate) String() string {
	if len(c.Episodes) == 0 {
		return "no faults"
	}
	parts := make([]string, len(c.Episodes))
	for i, e := range c.Episodes {
		parts[i] = e.String()
	}
	return strings.Join(parts, " ")
}

// Hash names the candidate by what a run of it does: its steps and its
// duration (not the episode IDs: two ways of reaching the same schedule
// are one candidate). Hex of the first 8 bytes of a SHA-256.
func (c Candidate) Hash() string {
	steps := make([]nemesis.Step, len(c.Episodes))
	for i, e := range c.Episodes {
		steps[i] = e.Step
	}
	b, err := json.Marshal(struct {
		Duration string         `json:"duration"`
		Steps    []nemesis.Step `json:"steps"`
	}{c.Duration.String(), steps})
	if err != nil {
		panic(fmt.Sprintf("shrink: a schedule step that does not encode: %v", err)) // Step's encoder fails on nothing it holds
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// fewerTargets says whether a step of kind may lose targets and still be
// the same kind of fault: the minority kinds (any non-empty minority is
// one) and clock-skew (a minority with an offset each). Shapes, one-node
// and leader kinds, and power-cut-all are defined by their targets.
func fewerTargets(kind string) bool {
	if kind == "clock-skew" {
		return true
	}
	k, ok := nemesis.LookupKind(kind)
	return ok && k.Sub == "minority"
}

// withoutTarget is st without target t (and its clock offset, if any).
func withoutTarget(st nemesis.Step, t string) nemesis.Step {
	st.Targets = slices.DeleteFunc(slices.Clone(st.Targets), func(x string) bool { return x == t })
	if st.Offsets != nil {
		offs := make(map[string]time.Duration, len(st.Offsets))
		for k, v := range st.Offsets {
			if k != t {
				offs[k] = v
			}
		}
		st.Offsets = offs
	}
	return st
}

// classOf is the class of kind ("" if unknown: then it is treated as
// its own class).
func classOf(kind string) nemesis.Class {
	if k, ok := nemesis.LookupKind(kind); ok {
		return k.Class
	}
	return nemesis.Class("kind:" + kind)
}
