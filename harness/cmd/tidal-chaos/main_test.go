package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/tidaldb/tidal/usage"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/tidaldb/tidal/buildinfo"
	"github.com/tidaldb/tidal/harness/report"
)

// checkInvocation does everything tidal-chaos does with args short of
// running the command: find the subcommand, parse its flags, check its
// positional arguments and required flags, and run its PreRunE (where
// every command checks what its flags mean: nemesis names, workload,
// node count). Help examples and README lines go through it, so an
// example that names a fault kind that does not exist fails the build.
func checkInvocation(args []string) error {
	root := newRoot()
	root.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	cmd, rest, err := root.Find(args)
	if err != nil {
		return err
	}
	cmd.InitDefaultHelpFlag()
	if err := cmd.ParseFlags(rest); err != nil {
		return err
	}
	if cmd == root {
		if v, _ := root.Flags().GetBool("version"); v {
			return nil
		}
		return fmt.Errorf("expected a subcommand, found %q", args)
	}
	positional := cmd.Flags().Args()
	if err := cmd.ValidateArgs(positional); err != nil {
		return err
	}
	if err := cmd.ValidateRequiredFlags(); err != nil {
		return err
	}
	if err := cmd.ValidateFlagGroups(); err != nil {
		return err
	}
	if cmd.PreRunE != nil {
		return cmd.PreRunE(cmd, positional)
	}
	return nil
}

// splitExample turns one example line into arguments; the caller has cut
// it at "tidal-chaos ". A trailing "# comment" and a trailing "&" (run in
// the background) are dropped; single quotes group a word as a shell
// would ('wal/*.wal'). Double quotes and expansions would need a shell to
// split, so they are refused rather than half-handled.
func splitExample(line string) ([]string, error) {
	if i := strings.Index(line, " #"); i >= 0 {
		line = line[:i]
	}
	line = strings.TrimSuffix(strings.TrimSpace(line), "&")
	if strings.ContainsAny(line, `"$`+"`") {
		return nil, fmt.Errorf("example %q: expected plain words (no double quotes or shell expansions)", line)
	}
	var args []string
	var word strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				args = append(args, word.String())
				word.Reset()
				inWord = false
			}
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("example %q: unterminated single quote", line)
	}
	if inWord {
		args = append(args, word.String())
	}
	return args, nil
}

// examples returns the example invocations in cmd's --help text.
func examples(cmd *cobra.Command) []string {
	var out []string
	for _, line := range strings.Split(cmd.Example, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "tidal-chaos "); ok {
			out = append(out, rest)
		}
	}
	return out
}

func allCommands(cmd *cobra.Command) []*cobra.Command {
	out := []*cobra.Command{cmd}
	for _, c := range cmd.Commands() {
		out = append(out, allCommands(c)...)
	}
	return out
}

// Regression: the first example of `tidal-chaos run
// --help` named a fault group that does not exist ("partitions"). Every
// example of every command must parse and pass the command's own checks.
func TestEveryHelpExampleIsAValidInvocation(t *testing.T) {
	for _, cmd := range allCommands(newRoot()) {
		if cmd.Name() == "help" || cmd.Name() == "completion" || !cmd.HasParent() {
			continue
		}
		lines := examples(cmd)
		if len(lines) == 0 && cmd.Runnable() {
			t.Errorf("%s: expected at least one example in --help, found none", cmd.CommandPath())
		}
		for _, line := range lines {
			args, err := splitExample(line)
			if err == nil {
				err = checkInvocation(args)
			}
			if err != nil {
				t.Errorf("%s --help example `tidal-chaos %s`: %v", cmd.CommandPath(), line, err)
				continue
			}
			// A group's examples may show its subcommands.
			if found, _, _ := newRoot().Find(args); found == nil ||
				(found.CommandPath() != cmd.CommandPath() && !strings.HasPrefix(found.CommandPath(), cmd.CommandPath()+" ")) {
				t.Errorf("%s --help example `tidal-chaos %s`: expected an example of %s", cmd.CommandPath(), line, cmd.Name())
			}
		}
	}
}

// The README's tidal-chaos lines are held to the same standard: every
// example real.
func TestReadmeTidalChaosLinesAreValidInvocations(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	found := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "./bin/tidal-chaos ")
		if !ok {
			continue
		}
		found++
		args, err := splitExample(rest)
		if err == nil {
			err = checkInvocation(args)
		}
		if err != nil {
			t.Errorf("README.md:%d `./bin/tidal-chaos %s`: %v", n, rest, err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("README.md: expected ./bin/tidal-chaos lines to check, found none")
	}
}

// The example check can say false: the stale example it was written for
// fails it, and so do the other ways an example goes stale.
func TestInvocationCheckRefusesStaleExamples(t *testing.T) {
	for _, bad := range []string{
		"run --server-bin bin/tidal-server --nemesis partitions,kill-leader --duration 1m", // the old first example
		"run --nemesis majorities-ring",     // needs 4+ nodes on the default 3
		"run --workload counters",           // no such workload
		"run --no-such-flag",                // no such flag
		"run --nodes 4",                     // even
		"analyze",                           // RUN-DIR missing
		"prune",                             // --keep is required
		"prune --keep -1",                   // negative
		"runn --nemesis kill",               // no such command
		"faults extra",                      // takes no arguments
		"run --keep-runs -3 --nemesis kill", // negative
	} {
		if err := checkInvocation(strings.Fields(bad)); err == nil {
			t.Errorf("expected `tidal-chaos %s` to be refused, it passed", bad)
		}
	}
}

// Regression: --nemesis printed its value name as
// "tidal-chaos faults" (pflag takes the first `quoted` word of a usage
// string as the value name). Every flag's value name must be one word.
func TestFlagValueNamesAreOneWord(t *testing.T) {
	for _, cmd := range allCommands(newRoot()) {
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			name, _ := pflag.UnquoteUsage(f)
			if strings.ContainsAny(name, " \t") {
				t.Errorf("%s --%s: expected a one-word value name in --help, found %q", cmd.CommandPath(), f.Name, name)
			}
		})
	}
	run, _, err := newRoot().Find([]string{"run"})
	if err != nil {
		t.Fatal(err)
	}
	if name, _ := pflag.UnquoteUsage(run.Flags().Lookup("nemesis")); name != "kinds" {
		t.Errorf("run --nemesis: expected the value name kinds, found %q", name)
	}
}

// Regression: required flags were not marked. A flag
// cobra requires says "(required)" in --help, and leaving it out is an
// error naming it.
func TestRequiredFlagsAreMarkedInHelp(t *testing.T) {
	required := 0
	for _, cmd := range allCommands(newRoot()) {
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			_, isRequired := f.Annotations[cobra.BashCompOneRequiredFlag]
			marked := strings.Contains(f.Usage, "(required)")
			if isRequired != marked {
				t.Errorf("%s --%s: required %v but --help marks it required: %v", cmd.CommandPath(), f.Name, isRequired, marked)
			}
			if isRequired {
				required++
			}
		})
	}
	if required == 0 {
		t.Fatal("expected at least one required flag (prune --keep), found none")
	}
	var out bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"prune", "--store", t.TempDir()})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), `"keep"`) {
		t.Fatalf("prune without --keep: expected an error naming keep, found %v", err)
	}
}

// Regression: --nodes said "odd: 3 or 5" and took 4.
func TestRunRefusesAnEvenOrTooSmallCluster(t *testing.T) {
	for _, n := range []string{"4", "2", "1", "0", "-3"} {
		err := checkInvocation([]string{"run", "--nodes", n})
		if err == nil || !strings.HasPrefix(err.Error(), "--nodes:") || !strings.Contains(err.Error(), "found "+n) {
			t.Errorf("run --nodes %s: expected an error naming --nodes and the value, found %v", n, err)
		}
	}
	for _, n := range []string{"3", "5", "7"} {
		if err := checkInvocation([]string{"run", "--nodes", n}); err != nil {
			t.Errorf("run --nodes %s: expected it accepted, found %v", n, err)
		}
	}
}

// Regression: tidal-chaos had no --version.
func TestVersionPrintsTheBuildLine(t *testing.T) {
	old := buildinfo.Version
	buildinfo.Version = "v9.9.9"
	defer func() { buildinfo.Version = old }()
	var out bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetArgs([]string{"--version"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if want := buildinfo.Line("tidal-chaos") + "\n"; out.String() != want || !strings.HasPrefix(want, "tidal-chaos v9.9.9 (commit ") {
		t.Fatalf("--version: expected %q, found %q", want, out.String())
	}
}

// A run that misses its binary is refused before a run directory exists.
func TestRunRefusesAMissingServerBinaryBeforeMakingARun(t *testing.T) {
	store := t.TempDir()
	var out bytes.Buffer
	root := newRoot()
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"run", "--server-bin", filepath.Join(store, "no-such-server"), "--store", store, "--nemesis", "none"})
	err := root.Execute()
	if err == nil || !strings.HasPrefix(err.Error(), "--server-bin ") {
		t.Fatalf("expected an error naming --server-bin, found %v", err)
	}
	if entries, _ := os.ReadDir(store); len(entries) != 0 {
		t.Fatalf("expected no run store made for a run that cannot start, found %d entries", len(entries))
	}
}

// storeWithRuns makes n finished runs of test under root, owned by a
// process that has exited (a pid no process has, and a start time of 1).
func storeWithRuns(t *testing.T, root, test string, n int) []*report.Run {
	t.Helper()
	var runs []*report.Run
	for i := range n {
		run, err := report.NewRun(root, test, time.Date(2026, 11, 30, 17, i, 0, 0, time.UTC))
		if err != nil {
			t.Fatal(err)
		}
		host, _ := os.Hostname()
		b, _ := json.Marshal(report.Owner{PID: 1 << 30, Started: 1, Host: host})
		if err := os.WriteFile(run.Path(report.OwnerFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(run.HistoryPath(), make([]byte, 2048), 0o644); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run)
	}
	return runs
}

// Regression: `tidal-chaos prune` prints each run it
// removes with its size and the bytes freed; --dry-run removes nothing.
func TestPruneCommandPrintsWhatItRemovedAndFreed(t *testing.T) {
	store := t.TempDir()
	runs := storeWithRuns(t, store, "ledger", 3)
	execute := func(args ...string) string {
		var out bytes.Buffer
		root := newRoot()
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(args)
		if err := root.Execute(); err != nil {
			t.Fatalf("tidal-chaos %v: %v\n%s", args, err, out.String())
		}
		return out.String()
	}
	dry := execute("prune", "--store", store, "--keep", "1", "--dry-run")
	for _, want := range []string{"would remove " + runs[0].Dir() + " (", "would remove " + runs[1].Dir() + " (", "would free ", "in 2 runs; 1 runs kept"} {
		if !strings.Contains(dry, want) {
			t.Errorf("dry run: expected %q in the output:\n%s", want, dry)
		}
	}
	if _, err := os.Stat(runs[0].Dir()); err != nil {
		t.Fatalf("dry run: expected %s still there: %v", runs[0].Dir(), err)
	}
	got := execute("prune", "--store", store, "--keep", "1")
	for _, want := range []string{"removed " + runs[0].Dir() + " (", "removed " + runs[1].Dir() + " (", "freed ", "in 2 runs; 1 runs kept"} {
		if !strings.Contains(got, want) {
			t.Errorf("expected %q in the output:\n%s", want, got)
		}
	}
	for _, r := range runs[:2] {
		if _, err := os.Stat(r.Dir()); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("expected %s removed, found %v", r.Dir(), err)
		}
	}
}

// Regression: a run ends by capping the store at
// --keep-runs runs per test (default 20); 0 turns it off.
func TestRunCapsTheStoreAtKeepRuns(t *testing.T) {
	run, _, err := newRoot().Find([]string{"run"})
	if err != nil {
		t.Fatal(err)
	}
	if def := run.Flags().Lookup("keep-runs").DefValue; def != "20" {
		t.Fatalf("run --keep-runs: expected the default 20, found %s", def)
	}
	store := t.TempDir()
	runs := storeWithRuns(t, store, "chaos", 4)
	var out, errOut bytes.Buffer
	pruneAfterRun(&out, &errOut, store, 0)
	if out.Len() != 0 {
		t.Fatalf("--keep-runs 0: expected nothing pruned, found %q", out.String())
	}
	pruneAfterRun(&out, &errOut, store, 2)
	if !strings.Contains(out.String(), "removed 2, freed ") || errOut.Len() != 0 {
		t.Fatalf("--keep-runs 2: expected 2 runs removed, found %q (stderr %q)", out.String(), errOut.String())
	}
	for i, r := range runs {
		_, err := os.Stat(r.Dir())
		if kept := err == nil; kept != (i >= 2) {
			t.Errorf("run %d (%s): expected kept %v, found %v", i, r.Dir(), i >= 2, kept)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 3 << 30: "3.0 GiB"} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d): expected %q, found %q", n, want, got)
		}
	}
}

// Regression: usage errors exit alike. tidal-chaos exited 2 (its
// "unknown or error") for an unknown flag where tidal-server exited 1;
// every tidal binary now exits usage.Code for a command line it refuses.
func TestUsageErrorsExitWithTheUsageCode(t *testing.T) {
	for _, args := range [][]string{
		{"run", "--no-such-flag"},
		{"run", "--duration", "soon"},
		{"no-such-command"},
		{"analyze"},
	} {
		root := newRoot()
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		root.SetArgs(args)
		err := root.Execute()
		if got := exitCode(err); got != usage.Code {
			t.Errorf("tidal-chaos %s: exit status %d (%v), expected %d", strings.Join(args, " "), got, err, usage.Code)
		}
	}
}

// --select takes every selection the etcd adapter has, and refuses one it
// does not know, naming it.
func TestEtcdSelect(t *testing.T) {
	t.Run("Regression: --select refused for etcd", func(t *testing.T) {
		for _, sel := range []string{"round-robin", "random", "leader", "bound"} {
			cmd := newRunCommand()
			if err := cmd.ParseFlags([]string{"--db", "etcd", "--select", sel}); err != nil {
				t.Fatal(err)
			}
			if err := cmd.PreRunE(cmd, nil); err != nil {
				t.Errorf("--db etcd --select %s: expected it accepted, found %v", sel, err)
			}
		}
	})
	if err := checkInvocation([]string{"run", "--db", "etcd", "--select", "nearest"}); err == nil || !strings.Contains(err.Error(), `"nearest"`) {
		t.Fatalf("--select nearest: expected an error naming it, found %v", err)
	}
	if err := checkInvocation([]string{"run", "--select", "bound"}); err == nil {
		t.Fatal("--select bound for tidal: expected an error (its workloads have no bound selection), found none")
	}
}
