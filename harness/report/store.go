// Package report keeps the run store of the chaos harness — one directory
// per run holding everything needed to judge it again or replay it — and
// renders what a person reads: report.html and the terminal summary.
//
// Layout (DESIGN.md, "Run store"):
//
//	<root>/latest -> <test>/<timestamp>        newest run of any test
//	<root>/<test>/latest -> <timestamp>        newest run of this test
//	<root>/<test>/<timestamp>/
//	    history.jsonl        the operation history (package history)
//	    results.json         the verdict and every checker's result
//	    report.html          plots and verdicts, self-contained
//	    config.json          the run's CLI configuration, for repro
//	    owner.json           pid of the process that made the run (see Prune)
//	    seed                 the seed of the fault schedule, in decimal
//	    schedule.json        the fault schedule
//	    lag.jsonl            /cluster/status samples, one a line
//	    digests.json         /v1/audit/digest of every node after heal
//	    nodes.json           every node process exit (status, log tail), each
//	                         node after the final heal, unreadable audits
//	    audits/<node>.ndjson /v1/audit/events of every node after heal
//	    nodes/<node>/        node logs and process stats (the cluster writes)
//	    linearizable/        porcupine visualizations of illegal keys
//
// Timestamps are UTC with millisecond precision, e.g. 20261130T175502.591Z,
// so lexical order of run directories is chronological order.
//
// Files the harness writes once, at the end (results, digests, audits,
// schedule, config, seed, report), are written to a temporary file,
// synced and renamed into place: a reader, or a run that crashes, sees
// the old file or the new one, never half of one. The two streams written
// while the run goes on (history.jsonl by history.Recorder, lag.jsonl by
// LagWriter) are appended and may end with a torn line; their readers
// drop it.
package report

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/tidal-server/atomicfile"
)

// File names inside a run directory.
const (
	HistoryFile   = "history.jsonl"
	ResultsFile   = "results.json"
	ReportFile    = "report.html"
	ConfigFile    = "config.json"
	SeedFile      = "seed"
	ScheduleFile  = "schedule.json"
	LagFile       = "lag.jsonl"
	DigestsFile   = "digests.json"
	NodesFile     = "nodes.json"
	auditsDir     = "audits"
	entitiesDir   = "entities"
	nodesDir      = "nodes"
	linearizeDir  = "linearizable"
	latestLink    = "latest"
	timestampForm = "20060102T150405.000Z"
)

// Run is one run's directory in the store.
type Run struct {
	dir     string // absolute, symlinks resolved
	test    string
	started time.Time
}

// NewRun creates <root>/<test>/<timestamp of now>/ and points
// <root>/latest and <root>/<test>/latest at it. test must be a single
// path element (it names a directory). Two runs started in the same
// millisecond get distinct directories (a -1, -2... suffix).
func NewRun(root, test string, now time.Time) (*Run, error) {
	if err := checkTestName(test); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("report: store root %q: %w", root, err)
	}
	testDir := filepath.Join(abs, test)
	if err := os.MkdirAll(testDir, 0o755); err != nil {
		return nil, fmt.Errorf("report: creating the test directory: %w", err)
	}
	now = now.UTC()
	stamp := now.Format(timestampForm)
	name := stamp
	for i := 1; ; i++ {
		err := os.Mkdir(filepath.Join(testDir, name), 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) || i > 1000 {
			return nil, fmt.Errorf("report: creating the run directory: %w", err)
		}
		name = stamp + "-" + strconv.Itoa(i)
	}
	r := &Run{dir: filepath.Join(testDir, name), test: test, started: now.Truncate(time.Millisecond)}
	if err := os.Mkdir(r.NodesDir(), 0o755); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	// Written before latest moves here: Prune keeps a run whose owner
	// is still running.
	if err := r.writeJSON(OwnerFile, currentOwner()); err != nil {
		return nil, err
	}
	if err := pointLatest(testDir, name); err != nil {
		return nil, err
	}
	if err := pointLatest(abs, filepath.Join(test, name)); err != nil {
		return nil, err
	}
	return r, nil
}

func checkTestName(test string) error {
	switch {
	case test == "", test == ".", test == "..", test == latestLink:
		return fmt.Errorf("report: test name %q: expected a name other than \"\", \".\", \"..\" or %q", test, latestLink)
	case strings.ContainsAny(test, `/\`+"\x00"):
		return fmt.Errorf("report: test name %q: expected a single path element, found a separator", test)
	}
	return nil
}

// pointLatest makes dir/latest a symlink to target (relative to dir),
// replacing any previous link atomically: readers following latest see
// the old run or the new one, never no link at all.
func pointLatest(dir, target string) error {
	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d.%d", latestLink, os.Getpid(), time.Now().UnixNano()))
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("report: linking %s: %w", latestLink, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, latestLink)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("report: replacing %s: %w", filepath.Join(dir, latestLink), err)
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// OpenRun opens an existing run directory (for analyze and repro). dir
// may be a symlink such as <root>/latest; the Run keeps the resolved
// directory, so it stays on this run when latest moves on.
func OpenRun(dir string) (*Run, error) {
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("report: opening run %s: %w", dir, err)
	}
	if resolved, err = filepath.Abs(resolved); err != nil {
		return nil, fmt.Errorf("report: opening run %s: %w", dir, err)
	}
	st, err := os.Stat(resolved)
	if err != nil {
		return nil, fmt.Errorf("report: opening run %s: %w", dir, err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("report: opening run %s: expected a run directory, found a file", dir)
	}
	// Every run directory NewRun made has nodes/; older or hand-made ones
	// at least a history or results. Anything else is a wrong path.
	looksLikeRun := false
	for _, name := range []string{HistoryFile, ResultsFile, nodesDir} {
		if _, err := os.Stat(filepath.Join(resolved, name)); err == nil {
			looksLikeRun = true
			break
		}
	}
	if !looksLikeRun {
		return nil, fmt.Errorf("report: opening run %s: expected %s, %s or %s/ in it, found none", dir, HistoryFile, ResultsFile, nodesDir)
	}
	r := &Run{dir: resolved, test: filepath.Base(filepath.Dir(resolved))}
	base := filepath.Base(resolved)
	if i := strings.IndexByte(base, '-'); i >= 0 {
		base = base[:i]
	}
	if t, err := time.Parse(timestampForm, base); err == nil {
		r.started = t
	} else if res, err := r.ReadResults(); err == nil {
		r.started = res.Started
	}
	return r, nil
}

// Dir is the run's directory (absolute).
func (r *Run) Dir() string { return r.dir }

// Test is the name of the test the run belongs to.
func (r *Run) Test() string { return r.test }

// Started is when the run was created (zero if an opened run's directory
// name is not a timestamp and it has no results.json).
func (r *Run) Started() time.Time { return r.started }

func (r *Run) String() string { return r.dir }

// Path is the path of name inside the run directory.
func (r *Run) Path(name string) string { return filepath.Join(r.dir, name) }

// HistoryPath is where history.Create should write the history.
func (r *Run) HistoryPath() string { return r.Path(HistoryFile) }

// NodesDir is the directory under which the cluster keeps one directory
// per node (logs, process stats, data).
func (r *Run) NodesDir() string { return r.Path(nodesDir) }

// NodeDir is the directory of one node.
func (r *Run) NodeDir(node string) string { return filepath.Join(r.NodesDir(), node) }

// LinearizableDir is where checker.Linearizable should write its
// visualizations, so the report can link them.
func (r *Run) LinearizableDir() string { return r.Path(linearizeDir) }

// AuditPath is where the audit of node is kept.
func (r *Run) AuditPath(node string) string {
	return filepath.Join(r.dir, auditsDir, node+".ndjson")
}

// ReadHistory reads history.jsonl.
func (r *Run) ReadHistory() ([]history.Op, error) { return history.Read(r.HistoryPath()) }

// RunResults is the content of results.json.
type RunResults struct {
	// Valid is the composition of Results (checker.Compose); WriteResults
	// enforces it, so the headline never disagrees with its parts. A run
	// that could not be checked records why as a Result of its own with
	// Valid Unknown.
	Valid   checker.Validity `json:"valid"`
	Test    string           `json:"test"`
	Started time.Time        `json:"started"`
	Ended   time.Time        `json:"ended"`
	Seed    int64            `json:"seed"`
	Config  json.RawMessage  `json:"config,omitempty"`
	Results []checker.Result `json:"results"`
}

// NewResults fills RunResults from the run and its checker results: the
// test, start and seed and config as stored in the run (missing ones are
// left zero), ended as given.
func (r *Run) NewResults(res checker.Results, ended time.Time) RunResults {
	rr := RunResults{Valid: checker.Compose(res.Results...), Test: r.test, Started: r.started, Ended: ended.UTC(), Results: res.Results}
	if seed, err := r.ReadSeed(); err == nil {
		rr.Seed = seed
	}
	if b, err := os.ReadFile(r.Path(ConfigFile)); err == nil && json.Valid(b) {
		rr.Config = json.RawMessage(b)
	}
	return rr
}

// Checker returns the results as checker.Results.
func (rr RunResults) Checker() checker.Results {
	return checker.Results{Valid: rr.Valid, Results: rr.Results}
}

// WriteResults writes results.json atomically, with Valid recomputed
// from the results.
func (r *Run) WriteResults(rr RunResults) error {
	rr.Valid = checker.Compose(rr.Results...)
	if rr.Results == nil {
		rr.Results = []checker.Result{}
	}
	return r.writeJSON(ResultsFile, rr)
}

// ReadResults reads results.json. Checker details come back as generic
// JSON (map[string]any); the renderers decode them by checker name.
func (r *Run) ReadResults() (RunResults, error) {
	var rr RunResults
	err := r.readJSON(ResultsFile, &rr)
	return rr, err
}

// WriteConfig stores the run's configuration (any JSON-encodable value).
func (r *Run) WriteConfig(cfg any) error { return r.writeJSON(ConfigFile, cfg) }

// ReadConfig decodes config.json into cfg.
func (r *Run) ReadConfig(cfg any) error { return r.readJSON(ConfigFile, cfg) }

// WriteSchedule stores the fault schedule (the nemesis owns its shape).
func (r *Run) WriteSchedule(schedule any) error { return r.writeJSON(ScheduleFile, schedule) }

// ReadSchedule decodes schedule.json into schedule.
func (r *Run) ReadSchedule(schedule any) error { return r.readJSON(ScheduleFile, schedule) }

// WriteSeed stores the seed, in decimal, so `cat seed` is enough to
// replay by hand.
func (r *Run) WriteSeed(seed int64) error {
	return writeFileAtomic(r.Path(SeedFile), []byte(strconv.FormatInt(seed, 10)+"\n"))
}

// ReadSeed reads the seed file.
func (r *Run) ReadSeed() (int64, error) {
	b, err := os.ReadFile(r.Path(SeedFile))
	if err != nil {
		return 0, fmt.Errorf("report: %w", err)
	}
	seed, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("report: %s: expected a decimal int64 seed, found %q", r.Path(SeedFile), bytes.TrimSpace(b))
	}
	return seed, nil
}

// WriteDigests stores every node's audit digest.
func (r *Run) WriteDigests(digests map[string]checker.DigestSample) error {
	return r.writeJSON(DigestsFile, digests)
}

// ReadDigests reads digests.json.
func (r *Run) ReadDigests() (map[string]checker.DigestSample, error) {
	var d map[string]checker.DigestSample
	err := r.readJSON(DigestsFile, &d)
	return d, err
}

// WriteNodeEvidence stores what the runner saw of the node processes
// (nodes.json): their exits, their state after the final heal, and why
// an audit or digest could not be read.
func (r *Run) WriteNodeEvidence(ev checker.NodeEvidence) error {
	return r.writeJSON(NodesFile, ev)
}

// ReadNodeEvidence reads nodes.json. A run stored before exit tracking
// has none, and the error says so: the nodes checker is then unknown.
//
// Its Disks are read from each node's faultfs.json (written when the
// cluster's mounts come down), when the run had faultfs.
func (r *Run) ReadNodeEvidence() (checker.NodeEvidence, error) {
	var ev checker.NodeEvidence
	err := r.readJSON(NodesFile, &ev)
	ev.Disks = r.ReadDiskTotals()
	return ev, err
}

// ReadDiskTotals reads the fault counters of every nodes/<n>/faultfs.json:
// what faultfs did to each node's disk over the whole run. Nil when the
// run had no faultfs mounts; a file that does not parse is left out.
func (r *Run) ReadDiskTotals() map[string]checker.DiskEffect {
	paths, _ := filepath.Glob(filepath.Join(r.NodesDir(), "*", "faultfs.json"))
	if len(paths) == 0 {
		return nil
	}
	out := map[string]checker.DiskEffect{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		var st struct {
			Faults checker.DiskEffect `json:"faults"`
		}
		if json.Unmarshal(b, &st) == nil {
			out[filepath.Base(filepath.Dir(p))] = st.Faults
		}
	}
	return out
}

// WriteAudit stores a node's /v1/audit/events body as read from body
// (atomically: an interrupted copy leaves no audit, rather than a short
// one that would look like lost writes).
func (r *Run) WriteAudit(node string, body io.Reader) error {
	if err := checkTestName(node); err != nil {
		return fmt.Errorf("report: audit of node %q: expected a plain node name", node)
	}
	if err := os.MkdirAll(filepath.Join(r.dir, auditsDir), 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return writeAtomic(r.AuditPath(node), func(w io.Writer) error {
		_, err := io.Copy(w, body)
		return err
	})
}

// WriteEntityCounts writes entities/<node>.json: the node's applied event
// counts per entity and signal, read after the run (checker.EntityCounts).
func (r *Run) WriteEntityCounts(node string, counts checker.EntityCounts) error {
	if err := checkTestName(node); err != nil {
		return fmt.Errorf("report: entity counts of node %q: expected a plain node name", node)
	}
	if err := os.MkdirAll(filepath.Join(r.dir, entitiesDir), 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return writeAtomic(filepath.Join(r.dir, entitiesDir, node+".json"), func(w io.Writer) error {
		return json.NewEncoder(w).Encode(counts)
	})
}

// ReadEntityCounts reads every entities/<node>.json, by node name. A run
// stored without them (or a DB that has none) reads as nil, not an error.
func (r *Run) ReadEntityCounts() (map[string]checker.EntityCounts, error) {
	paths, err := filepath.Glob(filepath.Join(r.dir, entitiesDir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if len(paths) == 0 {
		return nil, nil
	}
	out := make(map[string]checker.EntityCounts, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		var c checker.EntityCounts
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("report: %s: expected {entity: {signal: count}}: %w", p, err)
		}
		out[strings.TrimSuffix(filepath.Base(p), ".json")] = c
	}
	return out, nil
}

// ReadAudits reads every audits/<node>.ndjson, by node name. No audits
// directory is no audits, not an error.
func (r *Run) ReadAudits() (map[string][]checker.AuditEntry, error) {
	paths, err := filepath.Glob(filepath.Join(r.dir, auditsDir, "*.ndjson"))
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	out := make(map[string][]checker.AuditEntry, len(paths))
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		entries, err := checker.ReadAudit(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("report: %s: %w", p, err)
		}
		out[strings.TrimSuffix(filepath.Base(p), ".ndjson")] = entries
	}
	return out, nil
}

// WriteLag writes samples as lag.jsonl in one go (see LagWriter for
// writing them as they are taken).
func (r *Run) WriteLag(samples []checker.LagSample) error {
	return writeAtomic(r.Path(LagFile), func(w io.Writer) error {
		enc := json.NewEncoder(w)
		for i := range samples {
			if err := enc.Encode(&samples[i]); err != nil {
				return err
			}
		}
		return nil
	})
}

// ReadLag reads lag.jsonl. A missing file is no samples. A final line
// without its newline that does not parse is the tail of a crashed run
// and is dropped; any other bad line is an error naming it.
func (r *Run) ReadLag() ([]checker.LagSample, error) {
	f, err := os.Open(r.Path(LagFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	var out []checker.LagSample
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		torn := errors.Is(err, io.EOF)
		if err != nil && !torn {
			return out, fmt.Errorf("report: %s:%d: %w", r.Path(LagFile), line, err)
		}
		if t := bytes.TrimSpace(b); len(t) > 0 {
			var s checker.LagSample
			if jerr := json.Unmarshal(t, &s); jerr != nil {
				if torn {
					return out, nil
				}
				return out, fmt.Errorf("report: %s:%d: expected a lag sample: %w", r.Path(LagFile), line, jerr)
			}
			out = append(out, s)
		}
		if torn {
			return out, nil
		}
	}
}

// LagWriter appends lag samples to lag.jsonl while a run goes on. It is
// safe for concurrent use (one poller per node). Lines reach the file at
// every Flush and at Close; a crash loses at most the unflushed ones and
// may leave a torn last line, which ReadLag drops.
type LagWriter struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
	err error // first write error; sticky
}

// LagWriter opens lag.jsonl for appending.
func (r *Run) LagWriter() (*LagWriter, error) {
	f, err := os.OpenFile(r.Path(LagFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	w := bufio.NewWriterSize(f, 32<<10)
	return &LagWriter{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

// Append buffers one sample. The first error is returned by this and
// every later call.
func (lw *LagWriter) Append(s checker.LagSample) error {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err == nil && lw.f == nil {
		lw.err = errors.New("report: lag writer: append after close")
	}
	if lw.err == nil {
		if err := lw.enc.Encode(&s); err != nil {
			lw.err = fmt.Errorf("report: writing %s: %w", lw.f.Name(), err)
		}
	}
	return lw.err
}

// Flush writes buffered samples to the file (no fsync: a sample lost to
// a machine crash costs a point on a plot, not a verdict's soundness).
func (lw *LagWriter) Flush() error {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.err == nil && lw.f != nil {
		if err := lw.w.Flush(); err != nil {
			lw.err = fmt.Errorf("report: writing %s: %w", lw.f.Name(), err)
		}
	}
	return lw.err
}

// Close flushes, syncs and closes the file. Closing twice is a no-op.
func (lw *LagWriter) Close() error {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.f == nil {
		return lw.err
	}
	if lw.err == nil {
		if err := lw.w.Flush(); err != nil {
			lw.err = fmt.Errorf("report: writing %s: %w", lw.f.Name(), err)
		} else if err := lw.f.Sync(); err != nil {
			lw.err = fmt.Errorf("report: syncing %s: %w", lw.f.Name(), err)
		}
	}
	if err := lw.f.Close(); err != nil && lw.err == nil {
		lw.err = fmt.Errorf("report: closing %s: %w", lw.f.Name(), err)
	}
	lw.f = nil
	return lw.err
}

// NodeFiles lists the files each node left in nodes/<node>/ (logs,
// stats), as paths relative to the run directory, by node. The node's
// data directory and any other subdirectories are not listed.
func (r *Run) NodeFiles() (map[string][]string, error) {
	nodes, err := os.ReadDir(r.NodesDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	out := map[string][]string{}
	for _, n := range nodes {
		if !n.IsDir() {
			continue
		}
		files, err := os.ReadDir(r.NodeDir(n.Name()))
		if err != nil {
			return nil, fmt.Errorf("report: %w", err)
		}
		var names []string
		for _, f := range files {
			if f.Type().IsRegular() {
				names = append(names, filepath.ToSlash(filepath.Join(nodesDir, n.Name(), f.Name())))
			}
		}
		sort.Strings(names)
		out[n.Name()] = names
	}
	return out, nil
}

func (r *Run) writeJSON(name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("report: encoding %s: %w", name, err)
	}
	return writeFileAtomic(r.Path(name), append(b, '\n'))
}

func (r *Run) readJSON(name string, v any) error {
	b, err := os.ReadFile(r.Path(name))
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("report: %s: expected %T as JSON: %w", r.Path(name), v, err)
	}
	return nil
}

// writeFileAtomic and writeAtomic replace a run file so that a crash of the
// harness leaves the old file or the new one, never a torn one.
func writeFileAtomic(path string, data []byte) error {
	if err := atomicfile.Write(path, data, 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

func writeAtomic(path string, write func(io.Writer) error) error {
	if err := atomicfile.WriteFunc(path, 0o644, write); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}
