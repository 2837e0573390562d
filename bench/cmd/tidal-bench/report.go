package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/stress"
)

// results is one bench/results/<date>-<commit>.json. Schema changes bump
// Schema; readers skip files whose schema they do not know.
type results struct {
	Schema  int             `json:"schema"`
	Time    time.Time       `json:"time"`
	Quick   bool            `json:"quick,omitempty"` // a smoke run: not comparable with full ones
	Seconds float64         `json:"seconds"`
	Env     env             `json:"env"`
	Cluster *clusterResults `json:"cluster,omitempty"`
	Micro   *microRun       `json:"micro,omitempty"`
}

type env struct {
	Commit    string `json:"commit"`
	Dirty     bool   `json:"dirty"` // tracked files differed from the commit
	GoVersion string `json:"go_version"`
	CPUModel  string `json:"cpu_model"`
	Cores     int    `json:"cores"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	LoadStart string `json:"load_avg_start"` // 1, 5, 15 min
	LoadEnd   string `json:"load_avg_end"`
}

type clusterResults struct {
	Nodes     int                        `json:"nodes"`
	Workloads map[string]*workloadResult `json:"workloads"`
	Lag       *lagResult                 `json:"lag,omitempty"`
}

type workloadResult struct {
	Description string        `json:"description"`
	Flags       []string      `json:"flags"`
	SLOP99      time.Duration `json:"slo_p99_ns"`
	Target      float64       `json:"target"`
	TargetUnit  string        `json:"target_unit"`
	// Knee is the highest stage with at most 1% errors and p99 within
	// SLOP99; MaxSustained the highest with at most 1% errors whatever its
	// p99. ToppedOut: every stage met the SLO, the knee lies higher.
	Knee         *stress.StageResult  `json:"knee,omitempty"`
	MaxSustained *stress.StageResult  `json:"max_sustained,omitempty"`
	ToppedOut    bool                 `json:"topped_out,omitempty"`
	Stages       []stress.StageResult `json:"stages"`
}

type lagResult struct {
	Rate   float64            `json:"rate"` // ops/s offered: 80% of Of
	Of     string             `json:"of"`
	Target time.Duration      `json:"target_p99_ns"`
	Run    stress.StageResult `json:"run"`
	Lag    *stress.LagReport  `json:"lag"`
}

// summary renders the Markdown next to the results file.
func summary(r, prev *results, prevName, benchstatOut string) string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	dirty := ""
	if r.Env.Dirty {
		dirty = " (uncommitted changes)"
	}
	p("# tidal benchmark %s, commit %s%s\n\n", r.Time.Format("2006-01-02 15:04 MST"), r.Env.Commit, dirty)
	cpu := r.Env.CPUModel
	if r.Micro != nil && r.Micro.CPU != "" && r.Micro.CPU != cpu {
		cpu += " (CPUID: " + r.Micro.CPU + ")"
	}
	p("- CPU: %s, %d cores, %s/%s\n- Go: %s\n", cpu, r.Env.Cores, r.Env.OS, r.Env.Arch, r.Env.GoVersion)
	p("- load average (1/5/15 min): %s at start, %s at end — the machine is shared; read figures against it\n", r.Env.LoadStart, r.Env.LoadEnd)
	p("- duration: %.0fs\n", r.Seconds)
	if r.Quick {
		p("- **-quick**: a smoke run with short stages, not a record\n")
	}
	if prev != nil {
		p("- compared with: %s (commit %s, %s)\n", prevName, prev.Env.Commit, prev.Time.Format("2006-01-02 15:04 MST"))
	} else {
		p("- no previous results file: this is the baseline\n")
	}

	if c := r.Cluster; c != nil {
		p("\n## Cluster: %d tidal-server processes on loopback, default fsync\n\n", c.Nodes)
		p("Open-loop load from tidal-stress, round-robin over all nodes, latency from each op's intended start. ")
		p("Knee: the highest stage with ≤ 1%% errors (shed included) and p99 within the SLO. ")
		p("Max sustained: the highest stage with ≤ 1%% errors whatever its p99. ")
		p("In flight: mean concurrency (achieved rate × mean latency), to set against a closed-loop benchmark's client count.\n\n")
		p("| workload | SLO p99 | knee ops/s | knee events/s | p50 | p99 | p999 | max | mean in flight | max sustained events/s (p99, in flight) | target | vs previous |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, w := range workloads {
			wr := c.Workloads[w.Name]
			if wr == nil {
				continue
			}
			knee := "none met the SLO"
			kneeEv, p50, p99, p999, mx, inflight := "-", "-", "-", "-", "-", "-"
			if k := wr.Knee; k != nil {
				knee = fmtRate(k.AchievedRate)
				if wr.ToppedOut {
					knee = "≥ " + knee
				}
				kneeEv = fmtRate(k.AchievedEvents)
				p50, p99, p999, mx = ms(k.Latency.P50), ms(k.Latency.P99), ms(k.Latency.P999), ms(k.Latency.Max)
				inflight = fmt.Sprintf("%.1f", k.MeanInFlight)
			}
			sustained := "-"
			if s := wr.MaxSustained; s != nil {
				sustained = fmt.Sprintf("%s (%s, %.0f)", fmtRate(s.AchievedEvents), ms(s.Latency.P99), s.MeanInFlight)
			}
			target := fmt.Sprintf("≥ %s %s", fmtRate(wr.Target), wr.TargetUnit)
			if v, err := wr.kneeFigure(); err == nil {
				target += fmt.Sprintf(" (%.0f%%)", 100*v/wr.Target)
			}
			vs := "-"
			if prev != nil && prev.Cluster != nil {
				vs = ratio(wr, prev.Cluster.Workloads[w.Name])
			}
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				w.Description, ms(wr.SLOP99), knee, kneeEv, p50, p99, p999, mx, inflight, sustained, target, vs)
		}
		if l := c.Lag; l != nil && l.Lag != nil {
			all := l.Lag.All
			p("\n**Follower lag** at %s ops/s (80%% of the single-event %s), sampled every %s from /cluster/status: ",
				fmtRate(l.Rate), l.Of, l.Lag.Interval)
			p("p99 %s (max %s), %d entries p99 (max %d); target p99 ≤ %s; write p99 during the run %s",
				lagMs(all.TimeP99), lagMs(all.TimeMax), all.EntriesP99, all.EntriesMax, ms(l.Target), ms(l.Run.Latency.P99))
			if prev != nil && prev.Cluster != nil && prev.Cluster.Lag != nil && prev.Cluster.Lag.Lag != nil && prev.Cluster.Lag.Lag.All.TimeP99 > 0 {
				p("; vs previous lag p99 ×%.2f", float64(all.TimeP99)/float64(prev.Cluster.Lag.Lag.All.TimeP99))
			}
			p(".\n")
			for _, f := range l.Lag.Followers {
				p("- node %d: time p50 %s p99 %s max %s; entries p50 %d p99 %d max %d\n",
					f.Node, lagMs(f.TimeP50), lagMs(f.TimeP99), lagMs(f.TimeMax), f.EntriesP50, f.EntriesP99, f.EntriesMax)
			}
		}
		p("\n<details><summary>every stage</summary>\n\n")
		p("| workload | offered ops/s | achieved ops/s | events/s | p50 | p99 | max | dispatch p99 | 503 | 504 | other | timeout | transport | shed | SLO |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, w := range workloads {
			wr := c.Workloads[w.Name]
			if wr == nil {
				continue
			}
			for _, s := range wr.Stages {
				verdict := "ok"
				if !s.Pass {
					verdict = s.Reason
				}
				e := s.Errors
				p("| %s | %s | %s | %s | %s | %s | %s | %s | %d | %d | %d | %d | %d | %d | %s |\n",
					w.Name, fmtRate(s.OfferedRate), fmtRate(s.AchievedRate), fmtRate(s.AchievedEvents),
					ms(s.Latency.P50), ms(s.Latency.P99), ms(s.Latency.Max), ms(s.DispatchDelay.P99),
					e.Unavailable, e.Unknown, e.OtherStatus, e.Timeout, e.Transport, e.Shed, verdict)
			}
		}
		p("\n</details>\n")
	}

	if m := r.Micro; m != nil {
		p("\n## Go micro-benchmarks\n\n`%s` (raw output: `%s`). Medians of the runs; \"vs previous\" is new/old ns/op.\n\n", m.Command, m.Raw)
		for _, f := range m.Failures {
			p("- **failed**: `%s`\n", f)
		}
		prevMedians := map[string]map[string]float64{}
		if prev != nil && prev.Micro != nil {
			for _, pr := range prev.Micro.Results {
				prevMedians[pr.Name] = pr.Medians
			}
		}
		p("\n| benchmark | ns/op | B/op | allocs/op | other | vs previous |\n|---|---|---|---|---|---|\n")
		for _, mr := range m.Results {
			var other []string
			units := make([]string, 0, len(mr.Medians))
			for u := range mr.Medians {
				units = append(units, u)
			}
			slices.Sort(units)
			for _, u := range units {
				if u != "ns/op" && u != "B/op" && u != "allocs/op" {
					other = append(other, fmt.Sprintf("%.4g %s", mr.Medians[u], u))
				}
			}
			vs := "-"
			if old, ok := prevMedians[mr.Name]["ns/op"]; ok && old > 0 {
				vs = fmt.Sprintf("×%.2f", mr.Medians["ns/op"]/old)
			}
			p("| %s | %.4g | %.4g | %.4g | %s | %s |\n", mr.Name, mr.Medians["ns/op"], mr.Medians["B/op"], mr.Medians["allocs/op"], strings.Join(other, ", "), vs)
		}
		if benchstatOut != "" {
			p("\n<details><summary>benchstat %s → this run</summary>\n\n```\n%s```\n\n</details>\n", prevName, benchstatOut)
		}
	}
	return b.String()
}

// ratio compares a workload's knee with the previous run's.
func ratio(cur, old *workloadResult) string {
	if old == nil {
		return "-"
	}
	nv, nerr := cur.kneeFigure()
	ov, oerr := old.kneeFigure()
	switch {
	case nerr != nil && oerr != nil:
		return "no knee either time"
	case nerr != nil:
		return "lost its knee"
	case oerr != nil:
		return "new knee"
	}
	s := fmt.Sprintf("knee ×%.2f", nv/ov)
	if old.Knee.Latency.P99 > 0 {
		s += fmt.Sprintf(", p99 ×%.2f", float64(cur.Knee.Latency.P99)/float64(old.Knee.Latency.P99))
	}
	return s
}

// lagMs is ms for lags, where zero is a figure (caught up), not a blank.
func lagMs(d time.Duration) string {
	if d == 0 {
		return "0 ms"
	}
	return ms(d)
}

// ms prints a duration in milliseconds with a fitting precision.
func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v < 1:
		return fmt.Sprintf("%.2f ms", v)
	case v < 100:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}
