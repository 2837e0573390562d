package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tidaldb/tidal/harness/procstart"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"

	"github.com/tidaldb/tidal/harness/faultfs"

	gproc "github.com/shirou/gopsutil/v4/process"
)

// OwnerFile names the process that created a run (owner.json): its pid,
// its start time and its host. A run whose owner is still running is
// live, and Prune never removes it. The file stays after the run ends;
// an owner that has exited (or a pid now held by another process) is
// what makes the run prunable.
const OwnerFile = "owner.json"

// Owner is the content of owner.json.
type Owner struct {
	PID int `json:"pid"`
	// Started is the owner's process start time in unix milliseconds, as
	// the OS reports it, for people reading the file; it can move by a
	// second between readers inside a container, so it identifies nothing.
	Started int64 `json:"process_started_ms"`
	// StartTicks is the kernel's record of the owner's start (procstart):
	// a pid reused by a later process has another.
	StartTicks int64  `json:"process_start_ticks,omitempty"`
	Host       string `json:"host"`
}

// currentOwner describes this process.
func currentOwner() Owner {
	o := Owner{PID: os.Getpid()}
	if p, err := gproc.NewProcess(int32(o.PID)); err == nil {
		if t, err := p.CreateTime(); err == nil {
			o.Started = t
		}
	}
	o.StartTicks, _ = procstart.Of(o.PID)
	o.Host, _ = os.Hostname()
	return o
}

// alive reports whether the owner is still running here. An owner on
// another host cannot be checked and counts as alive: removing a run
// someone may still be writing is the mistake Prune must not make.
func (o Owner) alive() bool {
	if host, _ := os.Hostname(); o.Host != "" && o.Host != host {
		return true
	}
	if o.PID <= 0 {
		return false
	}
	return o.Running()
}

// Running reports whether the owner's process still runs on this host:
// its pid exists and, when the owner recorded its start, started then.
// An owner written before start ticks were recorded is compared by its
// wall-clock start, as it was then.
func (o Owner) Running() bool {
	if o.PID <= 0 {
		return false
	}
	if o.StartTicks != 0 {
		t, err := procstart.Of(o.PID)
		return err == nil && t == o.StartTicks
	}
	p, err := gproc.NewProcess(int32(o.PID))
	if err != nil {
		return false // no such process
	}
	t, err := p.CreateTime()
	if err != nil {
		return true // it exists and we cannot tell it apart: keep the run
	}
	return o.Started == 0 || t == o.Started
}

// runName matches a run directory's name: a timestamp in timestampForm,
// with a -N suffix when several runs of a test started in the same
// millisecond.
var runName = regexp.MustCompile(`^(\d{8}T\d{6}\.\d{3}Z)(?:-(\d+))?$`)

// PruneOptions says what Prune keeps.
type PruneOptions struct {
	// Keep is how many of the newest runs of each test are kept. Runs a
	// latest link points to and live runs are kept besides, whatever
	// their age.
	Keep int
	// DryRun reports what would be removed and removes nothing.
	DryRun bool
}

// PrunedRun is one run Prune removed (or, in a dry run, would remove).
type PrunedRun struct {
	Dir   string `json:"dir"`
	Test  string `json:"test"`
	Bytes int64  `json:"bytes"`
}

// KeptRun is a run older than the newest Keep that Prune kept, and why.
type KeptRun struct {
	Dir    string `json:"dir"`
	Reason string `json:"reason"`
}

// PruneResult is what Prune did.
type PruneResult struct {
	Removed []PrunedRun
	// Spared are runs past the newest Keep that were kept: the target of
	// a latest link, or live.
	Spared []KeptRun
	// Kept counts every run left in place (newest Keep, and Spared).
	Kept int
	// Freed is the size of the removed runs' files, in bytes.
	Freed int64
}

// Prune removes all but the newest opts.Keep runs of every test under
// root, never removing a run a latest link points to or a live one (its
// owner process still running, see OwnerFile). root is a store root
// (<root>/<test>/<timestamp>/); store roots nested one level down, such
// as the suites' store/chaos-suite/, are pruned too, and root may also
// be a single test's directory. Directories whose names are not run
// timestamps (pids/, junit/, a suite's spec directories) are left alone.
//
// A failure to remove one run does not stop the others; the errors are
// joined.
func Prune(root string, opts PruneOptions) (PruneResult, error) {
	var res PruneResult
	if opts.Keep < 0 {
		return res, fmt.Errorf("report: prune: expected a number of runs to keep >= 0, found %d", opts.Keep)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return res, fmt.Errorf("report: prune: store root %q: %w", root, err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return res, fmt.Errorf("report: prune: store root: %w", err)
	}
	if !st.IsDir() {
		return res, fmt.Errorf("report: prune: store root %s: expected a directory, found a file", abs)
	}

	// A run killed with its faultfs mounts up left them dead under its
	// nodes/; removing its directory would fail on them. Only dead mounts
	// are touched: a live run's answer and stay.
	if _, err := faultfs.ReapStale(abs); err != nil {
		return res, fmt.Errorf("report: prune: %w", err)
	}

	pinned := map[string]bool{}
	pin := func(dir string) {
		if target, err := filepath.EvalSymlinks(filepath.Join(dir, latestLink)); err == nil {
			pinned[target] = true
		}
	}
	// root may be one test's directory inside a store: its parent's
	// latest can point into it.
	pin(filepath.Dir(abs))
	tests, err := findTestDirs(abs, 0, pin)
	if err != nil {
		return res, err
	}

	var errs []error
	for _, t := range tests {
		for i, run := range t.runs {
			dir := filepath.Join(t.dir, run.name)
			resolved, err := filepath.EvalSymlinks(dir)
			if err != nil {
				resolved = dir
			}
			switch {
			case i < opts.Keep:
				res.Kept++
				continue
			case pinned[resolved]:
				res.Kept++
				res.Spared = append(res.Spared, KeptRun{Dir: dir, Reason: "latest points to it"})
				continue
			}
			if live, why := runIsLive(dir); live {
				res.Kept++
				res.Spared = append(res.Spared, KeptRun{Dir: dir, Reason: why})
				continue
			}
			size, err := dirSize(dir)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !opts.DryRun {
				if err := os.RemoveAll(dir); err != nil {
					errs = append(errs, fmt.Errorf("report: prune: removing %s: %w", dir, err))
					continue
				}
			}
			res.Removed = append(res.Removed, PrunedRun{Dir: dir, Test: filepath.Base(t.dir), Bytes: size})
			res.Freed += size
		}
	}
	return res, errors.Join(errs...)
}

// runIsLive reads a run's owner.json. A run without one (made before
// the file existed) or with an unreadable one is not judged live.
func runIsLive(dir string) (bool, string) {
	b, err := os.ReadFile(filepath.Join(dir, OwnerFile))
	if err != nil {
		return false, ""
	}
	var o Owner
	if json.Unmarshal(b, &o) != nil {
		return false, ""
	}
	if !o.alive() {
		return false, ""
	}
	if host, _ := os.Hostname(); o.Host != "" && o.Host != host {
		return true, fmt.Sprintf("maybe live: its owner, pid %d, ran on host %s, where it cannot be checked", o.PID, o.Host)
	}
	return true, fmt.Sprintf("live: its owner, pid %d, is still running", o.PID)
}

type testDir struct {
	dir  string
	runs []runEntry // newest first
}

type runEntry struct {
	name  string
	stamp string
	n     int // the -N suffix; 0 without one
}

// findTestDirs returns every directory at or below dir (at most two
// levels down) that holds run directories, calling pin on every
// directory it visits so their latest links are honoured. Symlinks are
// not followed: latest is a link, and a link elsewhere is not ours.
func findTestDirs(dir string, depth int, pin func(string)) ([]testDir, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("report: prune: %w", err)
	}
	pin(dir)
	var runs []runEntry
	var subdirs []string
	for _, e := range entries {
		if !e.IsDir() { // symlinks report as not directories
			continue
		}
		if m := runName.FindStringSubmatch(e.Name()); m != nil {
			n, _ := strconv.Atoi(m[2])
			runs = append(runs, runEntry{name: e.Name(), stamp: m[1], n: n})
			continue
		}
		subdirs = append(subdirs, filepath.Join(dir, e.Name()))
	}
	if len(runs) > 0 {
		// Newest first: by timestamp, then by suffix as a number (a
		// lexical sort would put -10 before -2).
		sort.Slice(runs, func(i, j int) bool {
			if runs[i].stamp != runs[j].stamp {
				return runs[i].stamp > runs[j].stamp
			}
			return runs[i].n > runs[j].n
		})
		return []testDir{{dir: dir, runs: runs}}, nil
	}
	if depth >= 2 {
		return nil, nil
	}
	var out []testDir
	for _, sub := range subdirs {
		found, err := findTestDirs(sub, depth+1, pin)
		if err != nil {
			return out, err
		}
		out = append(out, found...)
	}
	return out, nil
}

// dirSize is the total size of the regular files under dir.
func dirSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	if err != nil {
		return total, fmt.Errorf("report: prune: measuring %s: %w", dir, err)
	}
	return total, nil
}
