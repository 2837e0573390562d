package nemesis

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/tidaldb/tidal/tcp-relay/relay"
)

// ScheduleConfig shapes a generated schedule.
type ScheduleConfig struct {
	// Duration is how long the run lasts; every fault that is not instant
	// is scheduled to be healed by then.
	Duration time.Duration
	// Interval is the mean gap between fault starts (each gap is drawn
	// uniformly from [Interval/2, 3·Interval/2)). Default 10s.
	Interval time.Duration
	// FaultDuration is how long each fault lasts before its heal. Default 5s.
	FaultDuration time.Duration
	// Mix lists the kinds to draw from (see ParseMix), uniformly among
	// those whose class is free at the time.
	Mix []string
	// Nodes are the cluster's node names (n1..nN).
	Nodes []string
	// Latency and Jitter are what slow-links adds per direction of a link
	// (default 50ms ± 25ms); Bandwidth is bandwidth's cap in bytes per
	// second per direction (default 128 KiB/s).
	Latency, Jitter time.Duration
	Bandwidth       int64
	// ElectionTimeout is the database's, which pause-leader-burst sizes
	// its pauses by (0: DefaultElectionTimeout).
	ElectionTimeout time.Duration
}

// Step is one fault of a schedule.
type Step struct {
	// At is when the fault starts, from the start of the run.
	At time.Duration
	// Kind names the fault kind.
	Kind string
	// Targets are chosen at generation time: a node, a minority, an order
	// of all nodes for shapes; empty for kinds resolved at run time
	// (leader kinds) and for slow links on every link.
	Targets []string
	// Duration is how long the fault lasts; zero for instant kinds.
	Duration time.Duration
	// Link is the relay fault of slow-links and bandwidth.
	Link *relay.Spec
	// Disk is what a disk kind does (disk.go).
	Disk *DiskSpec
	// Offsets are the clock offsets of clock-skew and clock-jump, per
	// target (clock.go).
	Offsets map[string]time.Duration
	// Rolling is what rolling-restart drew (graceful.go).
	Rolling *RollingSpec
}

// Schedule is a run's faults, in start order. It is a pure function of
// its seed and config, and survives a JSON round trip, so a run can be
// replayed from its store.
type Schedule struct {
	Seed   int64          `json:"seed"`
	Config ScheduleConfig `json:"config"`
	Steps  []Step         `json:"steps"`
}

// pcgStream is the second PCG word; fixed so that a seed alone names a
// schedule.
const pcgStream = 0x7469_6461_6c6e_656d // "tidalnem"

// withDefaults returns c with zero fields set to their defaults.
func (c ScheduleConfig) withDefaults() ScheduleConfig {
	c.defaults()
	return c
}

func (c *ScheduleConfig) defaults() {
	if c.Interval == 0 {
		c.Interval = 10 * time.Second
	}
	if c.FaultDuration == 0 {
		c.FaultDuration = 5 * time.Second
	}
	if c.Latency == 0 {
		c.Latency = 50 * time.Millisecond
		if c.Jitter == 0 {
			c.Jitter = 25 * time.Millisecond
		}
	}
	if c.Bandwidth == 0 {
		c.Bandwidth = 128 << 10
	}
}

func (c ScheduleConfig) validate() error {
	var errs []error
	if c.Duration <= 0 {
		errs = append(errs, fmt.Errorf("duration: expected > 0, found %s", c.Duration))
	}
	if c.Interval <= 0 {
		errs = append(errs, fmt.Errorf("interval: expected > 0, found %s", c.Interval))
	}
	if c.FaultDuration <= 0 {
		errs = append(errs, fmt.Errorf("fault duration: expected > 0, found %s", c.FaultDuration))
	}
	if c.Jitter < 0 || c.Jitter > c.Latency {
		errs = append(errs, fmt.Errorf("jitter: expected between 0 and latency %s, found %s", c.Latency, c.Jitter))
	}
	if c.Bandwidth < 0 {
		errs = append(errs, fmt.Errorf("bandwidth: expected bytes per second > 0, found %d", c.Bandwidth))
	}
	if len(c.Nodes) == 0 {
		errs = append(errs, errors.New("nodes: expected at least one node name, found none"))
	}
	if s := slices.Sorted(slices.Values(c.Nodes)); len(slices.Compact(s)) != len(c.Nodes) {
		errs = append(errs, fmt.Errorf("nodes: expected distinct names, found %v", c.Nodes))
	}
	if len(c.Mix) == 0 {
		errs = append(errs, errors.New("mix: expected at least one fault kind, found none"))
	}
	for _, name := range c.Mix {
		k, ok := LookupKind(name)
		if !ok {
			errs = append(errs, fmt.Errorf("mix: unknown kind %q; expected one of %v", name, KindNames()))
		} else if len(c.Nodes) < k.MinNodes {
			errs = append(errs, fmt.Errorf("mix: %s expects at least %d nodes, found %d", name, k.MinNodes, len(c.Nodes)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nemesis schedule config: %w", err)
	}
	return nil
}

// linkSpec is the relay fault a links kind installs.
func (c ScheduleConfig) linkSpec(kind string) *relay.Spec {
	switch kind {
	case "slow-links":
		return &relay.Spec{Type: "latency", LatencyMS: c.Latency.Milliseconds(), JitterMS: c.Jitter.Milliseconds()}
	case "bandwidth":
		return &relay.Spec{Type: "bandwidth", RateBytes: c.Bandwidth}
	}
	return nil
}

// Generate draws a schedule from seed. Fault starts are spaced by gaps of
// mean cfg.Interval; at each start a kind is drawn uniformly from the mix
// among those whose class has no fault active then (so faults of a class
// never overlap) and that can be healed by cfg.Duration — and, while some
// group of the mix (partition, kill, pause, ...; see groupOf) has not been
// drawn yet, only among the kinds of such groups: a run asked for
// "partition,kill,pause" must not end without a pause because the draws
// fell on the six partition shapes. A start where no kind is eligible
// stays empty. The same seed and config always give the same schedule.
func Generate(seed int64, cfg ScheduleConfig) (Schedule, error) {
	cfg.defaults()
	var mix []string // without duplicates, in the user's order
	for _, k := range cfg.Mix {
		if !slices.Contains(mix, k) {
			mix = append(mix, k)
		}
	}
	cfg.Mix = mix
	if err := cfg.validate(); err != nil {
		return Schedule{}, err
	}
	r := rand.New(rand.NewPCG(uint64(seed), pcgStream))
	nodes := slices.Sorted(slices.Values(cfg.Nodes))
	gap := func() time.Duration { return cfg.Interval/2 + time.Duration(r.Int64N(int64(cfg.Interval))) }
	busyUntil := map[Class]time.Duration{}
	covered := map[string]bool{} // groups drawn so far
	s := Schedule{Seed: seed, Config: cfg}
	for t := gap(); t < cfg.Duration; t += gap() {
		var eligible []Kind
		for _, name := range cfg.Mix {
			k, _ := LookupKind(name)
			if busyUntil[k.Class] <= t && (k.Instant || t+cfg.FaultDuration <= cfg.Duration) {
				eligible = append(eligible, k)
			}
		}
		if len(eligible) == 0 {
			continue
		}
		var uncovered []Kind
		for _, k := range eligible {
			if !covered[groupOf(k.Name)] {
				uncovered = append(uncovered, k)
			}
		}
		if len(uncovered) > 0 {
			eligible = uncovered
		}
		k := eligible[r.IntN(len(eligible))]
		covered[groupOf(k.Name)] = true
		if k.Name == "pause-leader-burst" {
			b := burst(r, cfg, t, min(t+cfg.FaultDuration, cfg.Duration))
			last := b[len(b)-1]
			busyUntil[k.Class] = last.At + last.Duration
			s.Steps = append(s.Steps, b...)
			continue
		}
		st := Step{At: t, Kind: k.Name, Link: cfg.linkSpec(k.Name)}
		if k.pick != nil {
			st.Targets = k.pick(r, nodes)
		}
		if k.IsDisk() {
			// Drawn only for disk kinds: schedules without them are
			// what the same seed always gave.
			st.Disk = diskSpec(k.Name, r)
		}
		st.Offsets = clockOffsets(r, k.Name, st.Targets)
		st.Rolling = rollingSpec(k.Name, r)
		if !k.Instant {
			st.Duration = cfg.FaultDuration
			busyUntil[k.Class] = t + cfg.FaultDuration
		}
		s.Steps = append(s.Steps, st)
	}
	return s, nil
}

// Validate checks a schedule (a loaded one may have been edited by hand):
// known kinds, targets among the nodes, durations for faults that last.
// Overlapping faults of one class are allowed; the Runner heals the
// earlier one first.
func (s Schedule) Validate() error {
	var errs []error
	for i, st := range s.Steps {
		k, ok := LookupKind(st.Kind)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("step %d: unknown kind %q; expected one of %v", i, st.Kind, KindNames()))
			continue
		case st.At < 0:
			errs = append(errs, fmt.Errorf("step %d (%s): at: expected >= 0, found %s", i, st.Kind, st.At))
		case !k.Instant && st.Duration <= 0:
			errs = append(errs, fmt.Errorf("step %d (%s): duration: expected > 0, found %s", i, st.Kind, st.Duration))
		case k.Instant && st.Duration != 0:
			errs = append(errs, fmt.Errorf("step %d (%s): duration: expected none for an instant kind, found %s", i, st.Kind, st.Duration))
		}
		for _, t := range st.Targets {
			if !slices.Contains(s.Config.Nodes, t) {
				errs = append(errs, fmt.Errorf("step %d (%s): target %q: expected one of the nodes %v", i, st.Kind, t, s.Config.Nodes))
			}
		}
		if err := validateClockStep(st); err != nil {
			errs = append(errs, fmt.Errorf("step %d (%s): %w", i, st.Kind, err))
		}
		if k.Class == Links {
			if st.Link == nil {
				errs = append(errs, fmt.Errorf("step %d (%s): link: expected a relay fault spec, found none", i, st.Kind))
			} else if _, err := st.Link.Fault(); err != nil {
				errs = append(errs, fmt.Errorf("step %d (%s): link: %w", i, st.Kind, err))
			}
		}
		if k.Class == Disk && k.F == FDisk {
			if st.Disk == nil || st.Disk.Faults == nil {
				errs = append(errs, fmt.Errorf("step %d (%s): disk: expected a disk fault spec, found none", i, st.Kind))
			} else if err := st.Disk.Faults.Validate(); err != nil {
				errs = append(errs, fmt.Errorf("step %d (%s): disk: %w", i, st.Kind, err))
			}
		}
	}
	return errors.Join(errs...)
}

// WriteFile saves the schedule as indented JSON (schedule.json).
func (s Schedule) WriteFile(path string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("nemesis: writing schedule: %w", err)
	}
	return nil
}

// LoadSchedule reads and validates a schedule written by WriteFile.
func LoadSchedule(path string) (Schedule, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Schedule{}, fmt.Errorf("nemesis: reading schedule: %w", err)
	}
	var s Schedule
	if err := json.Unmarshal(b, &s); err != nil {
		return Schedule{}, fmt.Errorf("nemesis: schedule %s: %w", path, err)
	}
	if err := s.Validate(); err != nil {
		return Schedule{}, fmt.Errorf("nemesis: schedule %s: %w", path, err)
	}
	return s, nil
}

// End is when the last fault of the schedule is healed (or Config.Duration
// if that is later): how long Run takes before its final heal.
func (s Schedule) End() time.Duration {
	end := s.Config.Duration
	for _, st := range s.Steps {
		end = max(end, st.At+st.Duration)
	}
	return end
}

// JSON: durations are written as Go duration strings ("1.5s"), which a
// person reading schedule.json can follow.

type jsonDuration time.Duration

func (d jsonDuration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *jsonDuration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("expected a duration string such as \"1.5s\", found %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = jsonDuration(v)
	return nil
}

type scheduleConfigJSON struct {
	Duration      jsonDuration `json:"duration"`
	Interval      jsonDuration `json:"interval"`
	FaultDuration jsonDuration `json:"fault_duration"`
	Mix           []string     `json:"mix"`
	Nodes         []string     `json:"nodes"`
	Latency       jsonDuration `json:"latency"`
	Jitter        jsonDuration `json:"jitter"`
	Bandwidth     int64        `json:"bandwidth_bytes"`
	// ElectionTimeout is left out when zero: schedules without it read
	// as they were written.
	ElectionTimeout jsonDuration `json:"election_timeout,omitempty"`
}

func (c ScheduleConfig) MarshalJSON() ([]byte, error) {
	return json.Marshal(scheduleConfigJSON{jsonDuration(c.Duration), jsonDuration(c.Interval), jsonDuration(c.FaultDuration),
		c.Mix, c.Nodes, jsonDuration(c.Latency), jsonDuration(c.Jitter), c.Bandwidth, jsonDuration(c.ElectionTimeout)})
}

func (c *ScheduleConfig) UnmarshalJSON(b []byte) error {
	var j scheduleConfigJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*c = ScheduleConfig{time.Duration(j.Duration), time.Duration(j.Interval), time.Duration(j.FaultDuration),
		j.Mix, j.Nodes, time.Duration(j.Latency), time.Duration(j.Jitter), j.Bandwidth, time.Duration(j.ElectionTimeout)}
	return nil
}

type stepJSON struct {
	At       jsonDuration            `json:"at"`
	Kind     string                  `json:"kind"`
	Targets  []string                `json:"targets,omitempty"`
	Duration *jsonDuration           `json:"duration,omitempty"`
	Link     *relay.Spec             `json:"link,omitempty"`
	Disk     *DiskSpec               `json:"disk,omitempty"`
	Offsets  map[string]jsonDuration `json:"offsets,omitempty"`
	Rolling  *RollingSpec            `json:"rolling,omitempty"`
}

func (s Step) MarshalJSON() ([]byte, error) {
	j := stepJSON{At: jsonDuration(s.At), Kind: s.Kind, Targets: s.Targets, Link: s.Link, Disk: s.Disk, Rolling: s.Rolling}
	for t, d := range s.Offsets {
		if j.Offsets == nil {
			j.Offsets = map[string]jsonDuration{}
		}
		j.Offsets[t] = jsonDuration(d)
	}
	if s.Duration != 0 {
		d := jsonDuration(s.Duration)
		j.Duration = &d
	}
	return json.Marshal(j)
}

func (s *Step) UnmarshalJSON(b []byte) error {
	var j stepJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = Step{At: time.Duration(j.At), Kind: j.Kind, Targets: j.Targets, Link: j.Link, Disk: j.Disk, Rolling: j.Rolling}
	for t, d := range j.Offsets {
		if s.Offsets == nil {
			s.Offsets = map[string]time.Duration{}
		}
		s.Offsets[t] = time.Duration(d)
	}
	if j.Duration != nil {
		s.Duration = time.Duration(*j.Duration)
	}
	return nil
}
