package shrink

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/nemesis"
	"github.com/tidaldb/tidal/harness/report"
	"github.com/tidaldb/tidal/harness/runner"
	"github.com/tidaldb/tidal/tidal-server/atomicfile"
)

// Files the shrink writes in its directory, besides the replayable
// run's config.json, seed and schedule.json (the minimum).
const (
	ReportFile           = "shrink.json"
	OriginalScheduleFile = "original-schedule.json"
	candidatesDir        = "candidates"
	runsLog              = "runs.log"
	sectionName          = "shrink"
)

// NothingToShrinkError refuses a run that did not fail: there is no
// anomaly to preserve.
type NothingToShrinkError struct {
	Run    string
	Reason string
}

func (e *NothingToShrinkError) Error() string {
	return fmt.Sprintf("nothing to shrink: run %s %s", e.Run, e.Reason)
}

// Stored is a failing run as the store holds it: what a shrink starts
// from.
type Stored struct {
	Run       *report.Run
	Config    runner.Config
	Schedule  nemesis.Schedule
	Results   report.RunResults
	Signature Signature
}

// Primary is the anomaly the shrink preserves.
func (s *Stored) Primary() Anomaly { p, _ := s.Signature.Primary(); return p }

// Open reads the run at dir for a shrink: its verdict, configuration and
// schedule. A run that was not INVALID, or failed with no faults, is a
// *NothingToShrinkError.
func Open(dir string) (*Stored, error) {
	run, err := report.OpenRun(dir)
	if err != nil {
		return nil, err
	}
	name := filepath.Clean(dir)
	s := &Stored{Run: run}
	if s.Results, err = run.ReadResults(); err != nil {
		return nil, fmt.Errorf("%s: expected the run's verdict in %s (tidal-chaos analyze %s writes it): %w", name, report.ResultsFile, name, err)
	}
	if s.Results.Valid != checker.Invalid {
		return nil, &NothingToShrinkError{Run: name, Reason: "was " + verdictWord(s.Results.Valid)}
	}
	s.Signature = SignatureOf(s.Results.Results)
	if err := run.ReadConfig(&s.Config); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", name, report.ConfigFile, err)
	}
	if err := run.ReadSchedule(&s.Schedule); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", name, report.ScheduleFile, err)
	}
	if len(s.Schedule.Steps) == 0 {
		return nil, &NothingToShrinkError{Run: name, Reason: "failed without any fault: its schedule is empty"}
	}
	return s, nil
}

// RunOracle runs candidates as real chaos runs: the stored run's
// configuration and seed, the candidate's schedule and duration.
type RunOracle struct {
	Base     runner.Config
	Schedule nemesis.Schedule // the original: its seed and generation config
	// Store and Test place each run (<Store>/<Test>/<timestamp>/).
	Store, Test string
	Progress    io.Writer // the runner's progress lines; nil: discard
	Logger      *slog.Logger
	// DropData removes the nodes' data directories after a run is judged
	// (its history, results and logs stay): a shrink makes dozens of runs.
	DropData bool
	// After, when set, is called with each finished run.
	After func(*report.Run) error
}

// Config is the run configuration of candidate c.
func (o *RunOracle) Config(c Candidate) runner.Config {
	cfg := o.Base
	cfg.Store, cfg.Test = o.Store, o.Test
	cfg.Duration = runner.Duration(c.Duration)
	cfg.Nemesis = c.Schedule(o.Schedule).Kinds()
	return cfg
}

func (o *RunOracle) Run(ctx context.Context, c Candidate) (Verdict, error) {
	sched := c.Schedule(o.Schedule)
	out, err := runner.Run(ctx, o.Config(c), runner.Options{Progress: o.Progress, Logger: o.Logger, Schedule: &sched})
	if err != nil {
		return Verdict{}, err
	}
	if o.After != nil {
		if err := o.After(out.Run); err != nil {
			return Verdict{}, err
		}
	}
	if o.DropData {
		nodes, _ := os.ReadDir(out.Run.NodesDir())
		for _, n := range nodes {
			os.RemoveAll(filepath.Join(out.Run.NodeDir(n.Name()), "data"))
		}
	}
	return Verdict{Valid: out.Results.Valid, Signature: SignatureOf(out.Results.Results), Dir: out.Run.Dir()}, nil
}

// Config of a shrink of a stored run (Shrink). Zero fields: Search's
// defaults; Confirm 3.
type Config struct {
	Search Options // Oracle, Primary, Progress and Record are set by Shrink
	// Confirm is how many times the minimum is run after the search.
	Confirm int
	// ServerBin, when set, replaces the stored run's binary.
	ServerBin string
	Logger    *slog.Logger
	// Verbose copies every run's progress to Progress, not only to the
	// shrink's runs.log.
	Verbose bool
}

// Outcome is a finished shrink.
type Outcome struct {
	Dir    string // store/<test>-shrink/<timestamp>/: replay it with tidal-chaos repro
	Report *Report
}

// Shrink searches for the smallest schedule that fails as the stored run
// did, writes it to a new directory of the run store
// (<store>/<test>-shrink/<timestamp>/: config.json, seed and
// schedule.json, which tidal-chaos repro replays; shrink.json, every
// candidate tried; candidates/, their runs), then runs the minimum
// cfg.Confirm times as <test>-repro runs whose report.html compares the
// original and the minimal schedule.
func Shrink(ctx context.Context, st *Stored, cfg Config, progress io.Writer) (*Outcome, error) {
	if progress == nil {
		progress = io.Discard
	}
	if cfg.Confirm <= 0 {
		cfg.Confirm = 3
	}
	base := st.Config
	if cfg.ServerBin != "" {
		base.ServerBin = cfg.ServerBin
	}
	store := base.Store
	if store == "" {
		store = "store"
	}
	test := strings.TrimSuffix(strings.TrimSuffix(base.Test, "-repro"), "-shrink")
	if test == "" {
		test = "chaos"
	}
	dir, err := report.NewRun(store, test+"-shrink", time.Now())
	if err != nil {
		return nil, err
	}
	out := &Outcome{Dir: dir.Dir()}
	if err := st.Schedule.WriteFile(dir.Path(OriginalScheduleFile)); err != nil {
		return out, err
	}
	logf, err := os.Create(dir.Path(runsLog))
	if err != nil {
		return out, fmt.Errorf("shrink: %w", err)
	}
	defer logf.Close()
	var runOut io.Writer = logf
	if cfg.Verbose {
		runOut = io.MultiWriter(logf, progress)
	}
	oracle := &RunOracle{Base: base, Schedule: st.Schedule, Store: filepath.Join(dir.Dir(), candidatesDir), Test: test,
		Progress: runOut, Logger: cfg.Logger, DropData: true}

	primary := st.Primary()
	original := FromSchedule(st.Schedule, base.Duration.D())
	fmt.Fprintf(progress, "shrink of %s: %d episodes, %s run, seed %d\n  failed with %s; preserving %s\n  shrink directory %s\n",
		filepath.Clean(st.Run.Dir()), len(original.Episodes), original.Duration, base.Seed, st.Signature, primary, dir.Dir())

	so := cfg.Search
	so.Oracle, so.Primary, so.Progress = oracle, primary, progress
	so.Record = func(r *Report) error { return writeJSON(dir.Path(ReportFile), r) }
	rep, err := Search(ctx, original, so)
	out.Report = rep
	if err != nil {
		return out, err
	}
	if !rep.Reproduced {
		return out, nil
	}
	// The minimum as a replayable run: tidal-chaos repro reads these.
	minCfg := oracle.Config(rep.Minimal)
	minCfg.Store, minCfg.Test = store, test
	if err := dir.WriteConfig(minCfg); err != nil {
		return out, err
	}
	if err := dir.WriteSeed(base.Seed); err != nil {
		return out, err
	}
	if err := dir.WriteSchedule(rep.Minimal.Schedule(st.Schedule)); err != nil {
		return out, err
	}

	section := CompareSection(st.Run.Dir(), rep)
	confirm := &RunOracle{Base: base, Schedule: st.Schedule, Store: store, Test: test + "-repro", Progress: runOut, Logger: cfg.Logger,
		After: func(r *report.Run) error {
			if err := r.WriteSection(sectionName, section); err != nil {
				return err
			}
			rr, err := r.ReadResults()
			if err != nil {
				return err
			}
			return r.WriteReport(rr)
		}}
	fmt.Fprintf(progress, "shrink: running the minimum %d more times\n", cfg.Confirm)
	err = Confirm(ctx, rep, confirm, cfg.Confirm, progress)
	if werr := writeJSON(dir.Path(ReportFile), rep); err == nil {
		err = werr
	}
	return out, err
}

// CompareSection is the table report.html shows of the original and the
// minimal schedule, one row per episode.
func CompareSection(originalDir string, rep *Report) report.Section {
	s := report.Section{
		Title: "Shrunk schedule",
		Text: fmt.Sprintf("This run replays the minimal schedule a shrink of %s found: %d of %d fault episodes, a %s run instead of %s, preserving %s (%d runs, %d candidates, %s).",
			originalDir, len(rep.Minimal.Episodes), len(rep.Original.Episodes), rep.Minimal.Duration, rep.Original.Duration,
			rep.Primary, rep.Runs, len(rep.Trials), rep.Elapsed),
		Columns: []string{"schedule", "episode", "kind", "targets", "at", "duration"},
	}
	add := func(which string, c Candidate) {
		for _, e := range c.Episodes {
			d := "instant"
			if e.Step.Duration > 0 {
				d = e.Step.Duration.String()
			}
			s.Rows = append(s.Rows, []string{which, fmt.Sprint(e.ID), e.Step.Kind, strings.Join(e.Step.Targets, ","), e.Step.At.Round(time.Millisecond).String(), d})
		}
	}
	add("original ("+rep.Original.Duration.String()+" run)", rep.Original)
	add("minimal ("+rep.Minimal.Duration.String()+" run)", rep.Minimal)
	return s
}

// writeJSON replaces path atomically with v as indented JSON.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("shrink: encoding %s: %w", filepath.Base(path), err)
	}
	if err := atomicfile.Write(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("shrink: %w", err)
	}
	return nil
}
