package main

import (
	"bytes"
	"context"
	"encoding/json"
	"github.com/tidaldb/tidal/usage"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/tidaldb/tidal/buildinfo"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/server"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// execute runs the CLI in process and returns its output and error.
func execute(args ...string) (string, error) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func walk(cmd *cobra.Command, fn func(*cobra.Command)) {
	fn(cmd)
	for _, c := range cmd.Commands() {
		walk(c, fn)
	}
}

// Regression: `members add --help` promised a
// --promote-within flag that did not exist. Every --flag any help text
// names must be a flag of some command.
func TestHelpNamesOnlyFlagsThatExist(t *testing.T) {
	root := newRootCommand()
	flags := map[string]bool{"help": true, "version": true}
	walk(root, func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { flags[f.Name] = true })
	})
	mention := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	walk(root, func(c *cobra.Command) {
		for _, text := range []string{c.Short, c.Long, c.Example} {
			for _, m := range mention.FindAllStringSubmatch(text, -1) {
				if !flags[m[1]] {
					t.Errorf("%q help mentions --%s, which no command has", c.CommandPath(), m[1])
				}
			}
		}
	})
}

// Regression: required flags were checked by hand and
// not marked, so --help did not say which they were.
func TestRequiredFlagsAreMarked(t *testing.T) {
	root := newRootCommand()
	for path, names := range map[string][]string{
		"members add": {"id", "peer-addr"},
		"backup":      {"out"},
		"restore":     {"from"},
	} {
		cmd, _, err := root.Find(strings.Fields(path))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			f := cmd.Flags().Lookup(name)
			if f == nil {
				t.Fatalf("%s: no --%s", path, name)
			}
			if got := f.Annotations[cobra.BashCompOneRequiredFlag]; len(got) != 1 || got[0] != "true" {
				t.Errorf("%s --%s: expected marked required, annotations %v", path, name, f.Annotations)
			}
			if !strings.Contains(f.Usage, "(required)") {
				t.Errorf("%s --%s: expected the usage to say (required), found %q", path, name, f.Usage)
			}
		}
	}
	_, err := execute("members", "add", "--addr", "127.0.0.1:1", "--id", "4")
	if err == nil || !strings.Contains(err.Error(), `"peer-addr"`) {
		t.Fatalf("members add without --peer-addr: expected cobra's required-flag error, got %v", err)
	}
}

// Regression: tidal-server had no --version.
func TestVersionFlagAndCommand(t *testing.T) {
	want := buildinfo.Line("tidal-server") + "\n"
	for _, args := range [][]string{{"--version"}, {"version"}} {
		out, err := execute(args...)
		if err != nil || out != want {
			t.Errorf("tidal-server %s: expected %q, got %q (%v)", strings.Join(args, " "), want, out, err)
		}
	}
}

// Regression: every exit status of a running node is
// listed in the run command's help (and the root's, which runs it).
func TestRunHelpListsExitStatuses(t *testing.T) {
	for _, args := range [][]string{{"run", "--help"}, {"--help"}} {
		out, err := execute(args...)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"Exit status:", "  0  stopped cleanly", "  1  could not start", "  4  fenced", "  5  removed"} {
			if !strings.Contains(out, want) {
				t.Errorf("tidal-server %s: expected %q in:\n%s", strings.Join(args, " "), want, out)
			}
		}
	}
	if exitFenced == exitRemoved || exitFenced == exitFailed || exitRemoved == exitFailed || exitFenced == exitOK || exitRemoved == exitOK {
		t.Fatal("fenced, removed, failure and success must have distinct exit statuses")
	}
}

// committedWAL writes a data dir whose WAL holds entries 1..60 over small
// segments, each batch with a HardState whose commit trails it.
func committedWAL(t *testing.T) string {
	t.Helper()
	dataDir := t.TempDir()
	w, _, err := wal.Open(filepath.Join(dataDir, "wal"), wal.Options{SegmentSize: 2048, NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 60; i += 3 {
		var es []wal.Entry
		for j := i; j < i+3; j++ {
			es = append(es, wal.Entry{Index: j, Term: 1, Data: []byte("entry-payload")})
		}
		if err := w.Save(context.Background(), wal.Batch{Entries: es, HardState: &wal.HardState{Term: 1, Commit: i - 1}}, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return dataDir
}

// flipByte damages the WAL's second segment at offset 100.
func flipByte(t *testing.T, dataDir string) {
	t.Helper()
	path := filepath.Join(dataDir, "wal", "0000000000000001.wal")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	data[100] ^= 0xff
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Regression: `wal verify` printed the damage and exited
// 0; README and its help promise 3.
func TestWALVerifyExitsThreeOnDamage(t *testing.T) {
	dataDir := committedWAL(t)
	if out, err := execute("wal", "verify", "--data-dir", dataDir); err != nil || !strings.Contains(out, "ok: no damage") {
		t.Fatalf("clean WAL: expected exit 0 and ok, got %v:\n%s", err, out)
	}
	flipByte(t, dataDir)
	out, err := execute("wal", "verify", "--data-dir", dataDir)
	if exitCode(err) != exitDamage || !strings.Contains(out, "damaged") || !strings.Contains(out, "0000000000000001.wal") {
		t.Fatalf("damaged WAL: expected exit %d naming the segment, got %v (exit %d):\n%s", exitDamage, err, exitCode(err), out)
	}
}

// Regression: `wal repair` cut below the commit index the
// node had recorded, leaving a member that panicked on every start. It now
// refuses, prints the way out and changes nothing.
func TestWALRepairRefusesBelowTheCommitIndex(t *testing.T) {
	dataDir := committedWAL(t)
	flipByte(t, dataDir)
	before, _ := os.ReadFile(filepath.Join(dataDir, "wal", "0000000000000002.wal"))
	out, err := execute("wal", "repair", "--data-dir", dataDir)
	if exitCode(err) != exitDamage {
		t.Fatalf("expected exit %d, got %v (exit %d):\n%s", exitDamage, err, exitCode(err), out)
	}
	for _, want := range []string{"refused", "below the commit index", "members remove", "rm -rf " + dataDir, "--join"} {
		if !strings.Contains(out, want) {
			t.Errorf("expected %q in the refusal:\n%s", want, out)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(dataDir, "wal", "0000000000000002.wal")); !bytes.Equal(before, after) {
		t.Fatal("a refused repair changed the WAL")
	}
	// No membership stored (no conf changes): the only copy, so the
	// operator may accept the loss.
	out, err = execute("wal", "repair", "--data-dir", dataDir, "--allow-committed-loss")
	if err != nil || !strings.Contains(out, "dropped:") {
		t.Fatalf("--allow-committed-loss on a one-node data dir: expected a repair, got %v:\n%s", err, out)
	}
}

// Regression: asked on a follower, status showed MATCH 0
// and unreachable for the leader (a follower knows no progress). It now
// shows the leader's own view, or "-" when the leader cannot be asked.
func TestStatusOnAFollowerShowsTheLeadersView(t *testing.T) {
	leader := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(client.Status{Node: 2, Leader: 2, Role: "leader", Commit: 50, Members: []client.MemberStatus{
			{ID: 1, Role: "follower", Match: 48, Lag: 2, Reachable: true},
			{ID: 2, Role: "leader", Match: 50, Reachable: true},
		}})
	}))
	defer leader.Close()
	leaderAddr := strings.TrimPrefix(leader.URL, "http://")
	follower := &client.Status{Node: 1, Leader: 2, Role: "follower", Commit: 50, Members: []client.MemberStatus{
		{ID: 1, Role: "follower", PeerAddr: "127.0.0.1:7101", ClientAddr: "127.0.0.1:7071"},
		{ID: 2, Role: "leader", PeerAddr: "127.0.0.1:7102", ClientAddr: leaderAddr},
	}}

	progress, note := leaderProgress(context.Background(), follower, nil)
	var out bytes.Buffer
	if err := printStatus(&out, follower, progress, note); err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^2\s+leader\s+\S+\s+` + regexp.QuoteMeta(leaderAddr) + `\s+50\s+0\s+true$`)
	if !row.MatchString(out.String()) || !strings.Contains(out.String(), "as leader 2") {
		t.Fatalf("expected the leader's row with match 50, reachable, from the leader's view:\n%s", out.String())
	}

	leader.Close()
	progress, note = leaderProgress(context.Background(), follower, nil)
	out.Reset()
	printStatus(&out, follower, progress, note)
	unknown := regexp.MustCompile(`(?m)^2\s+leader\s+\S+\s+\S+\s+-\s+-\s+-$`)
	if progress != nil || !unknown.MatchString(out.String()) {
		t.Fatalf("leader unreachable: expected match, lag and reachable shown as -, got:\n%s", out.String())
	}
}

// Every security and http.Server flag given on the command line wins over
// the --config file, as every other flag does.
func TestSecurityFlagsOverrideTheConfigFile(t *testing.T) {
	cmd := newRunCommand()
	args := []string{"--certs-dir", "c", "--insecure", "--tokens", "t", "--open-probes=false",
		"--http-read-header-timeout", "1s", "--http-read-timeout", "2s", "--http-write-timeout", "3s",
		"--http-idle-timeout", "4s", "--http-stream-timeout", "5s", "--max-conns", "6", "--http2-max-streams", "7"}
	if err := cmd.Flags().Parse(args); err != nil {
		t.Fatal(err)
	}
	var flags server.Config
	flags.CertsDir, flags.Insecure, flags.TokensPath, flags.OpenProbes = "c", true, "t", false
	flags.HTTPReadHeaderTimeout, flags.HTTPReadTimeout, flags.HTTPWriteTimeout = time.Second, 2*time.Second, 3*time.Second
	flags.HTTPIdleTimeout, flags.HTTPStreamTimeout, flags.MaxConns, flags.HTTP2MaxStreams = 4*time.Second, 5*time.Second, 6, 7
	got := mergeConfig(server.DefaultConfig(), flags, cmd.Flags())
	if got.CertsDir != "c" || !got.Insecure || got.TokensPath != "t" || got.OpenProbes ||
		got.HTTPReadHeaderTimeout != time.Second || got.HTTPReadTimeout != 2*time.Second || got.HTTPWriteTimeout != 3*time.Second ||
		got.HTTPIdleTimeout != 4*time.Second || got.HTTPStreamTimeout != 5*time.Second || got.MaxConns != 6 || got.HTTP2MaxStreams != 7 {
		t.Fatalf("flags set on the command line did not all win over the file: %+v", got)
	}
	if !server.DefaultConfig().OpenProbes {
		t.Fatal("--open-probes must default to true (an absent config key keeps it)")
	}
}

// Run hands the peer transport a spool under the data dir
// and --max-snapshot-bytes (from the flag, or the --config file, whose
// absent key keeps the transport's default of 1 GiB).
func TestPeerOptionsFromTheRunFlags(t *testing.T) {
	cmd := newRunCommand()
	if err := cmd.Flags().Parse([]string{"--data-dir", "d1", "--max-snapshot-bytes", "67108864"}); err != nil {
		t.Fatal(err)
	}
	var flags server.Config
	flags.DataDir, flags.MaxSnapshotBytes = "d1", 64<<20
	cfg := mergeConfig(server.DefaultConfig(), flags, cmd.Flags())
	o, err := peerOptions(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if o.SpoolDir != filepath.Join("d1", "snap-spool") || o.MaxSnapshotBytes != 64<<20 {
		t.Errorf("peer options: spool %q, max snapshot %d; expected d1/snap-spool and %d", o.SpoolDir, o.MaxSnapshotBytes, 64<<20)
	}
	if o.Membership != nil {
		t.Error("run must leave Membership to peer.Factory (the server's replicated table), found one set")
	}
	if o.ServerTLS != nil || cfg.PeerTLS {
		t.Error("without certificates the peer plane must be plaintext")
	}
	if def := newRunCommand().Flags().Lookup("max-snapshot-bytes").DefValue; def != "1073741824" {
		t.Errorf("--max-snapshot-bytes defaults to %s, expected 1 GiB", def)
	}

	file := filepath.Join(t.TempDir(), "tidal.yaml")
	if err := os.WriteFile(file, []byte("max_snapshot_bytes: 1048576\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fromFile, err := loadConfigFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if fromFile.MaxSnapshotBytes != 1<<20 {
		t.Errorf("max_snapshot_bytes from the config file: %d, expected %d", fromFile.MaxSnapshotBytes, 1<<20)
	}

	cfg.MaxSnapshotBytes = -1
	if _, err := peerOptions(&cfg); err == nil || !strings.Contains(err.Error(), "--max-snapshot-bytes") {
		t.Errorf("a negative --max-snapshot-bytes: %v, expected an error naming the flag", err)
	}
}

// Regression: usage errors exit alike. tidal-server exited 1 for an
// unknown flag (the status of a failed start) where tidal-chaos exited 2;
// every tidal binary now exits usage.Code for a command line it refuses.
func TestUsageErrorsExitWithTheUsageCode(t *testing.T) {
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"run", "--snapshot-every", "many"},
		{"no-such-command"},
		{"wal", "verify", "--no-such-flag"},
	} {
		_, err := execute(args...)
		if err == nil {
			t.Fatalf("tidal-server %s: expected a usage error, got none", strings.Join(args, " "))
		}
		if got := exitCode(err); got != usage.Code {
			t.Errorf("tidal-server %s: exit status %d (%v), expected %d", strings.Join(args, " "), got, err, usage.Code)
		}
	}
}

// status prints the answering node's memory: RSS with its multiple of the
// vector bytes, the vector store's payload and overhead, the snapshot
// bytes held and the --max-memory bound ("off" at 0); a node that reports
// no memory prints no memory line.
func TestStatusPrintsMemory(t *testing.T) {
	st := &client.Status{Node: 1, Leader: 1, Role: "leader", Memory: &client.Memory{
		RSS: 3 << 30, GoHeap: 2 << 30, VectorBytes: 1 << 30, IndexOverhead: 5 << 20,
		SnapshotBytesHeld: 1 << 30, MaxMemory: 8 << 30}}
	var out bytes.Buffer
	if err := printStatus(&out, st, st, ""); err != nil {
		t.Fatal(err)
	}
	want := "memory   rss 3 GiB (3.00x of vectors)   go heap 2 GiB   vectors 1 GiB   index overhead 5 MiB   snapshots held 1 GiB   max-memory 8 GiB"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("expected %q in:\n%s", want, out.String())
	}
	st.Memory.MaxMemory, st.Memory.VectorBytes = 0, 0
	out.Reset()
	printStatus(&out, st, st, "")
	if !strings.Contains(out.String(), "(- of vectors)") || !strings.Contains(out.String(), "max-memory off") {
		t.Fatalf("no vectors and no bound: expected \"(- of vectors)\" and \"max-memory off\" in:\n%s", out.String())
	}
	st.Memory = nil
	out.Reset()
	printStatus(&out, st, st, "")
	if strings.Contains(out.String(), "memory") {
		t.Fatalf("a node that reports no memory: expected no memory line, found:\n%s", out.String())
	}
}

func TestParseByteSize(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1073741824": 1 << 30, "8GiB": 8 << 30, "512 MiB": 512 << 20,
		"2GB": 2e9, "1.5gib": 3 << 29, "100b": 100, "64KiB": 64 << 10} {
		if got, err := parseByteSize(in); err != nil || got != want {
			t.Errorf("parseByteSize(%q): expected %d, found %d, %v", in, want, got, err)
		}
	}
	for _, in := range []string{"", "GiB", "-1GiB", "8 parsecs", "NaN"} {
		if _, err := parseByteSize(in); err == nil || !strings.Contains(err.Error(), "expected a size in bytes") {
			t.Errorf("parseByteSize(%q): expected an error naming what a size looks like, found %v", in, err)
		}
	}
	cmd := newRunCommand()
	if err := cmd.Flags().Parse([]string{"--max-memory", "6GiB"}); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("max-memory").Value.String(); got != "6GiB" {
		t.Fatalf("--max-memory 6GiB: expected the flag to read back 6GiB, found %q", got)
	}
}
