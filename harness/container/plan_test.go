package container

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/mount"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tcp-relay/mesh"
)

// The arguments the cluster builds for the process backend become a
// container's: listeners move to the container's interfaces on the same
// port (both flag forms), those ports are published, the node's directory
// is mounted read-write and other host paths read-only; the advertised
// --peers and the --peer-dial targets are left alone.
func TestPlanNode(t *testing.T) {
	dir := t.TempDir()
	schema := filepath.Join(t.TempDir(), "schema.yaml")
	if err := os.WriteFile(schema, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := cluster.NodeSpec{Name: "n1", Dir: dir, Args: []string{"run", "--id", "1",
		"--client-addr", "127.0.0.1:7071", "--peer-addr=127.0.0.1:7101",
		"--peers", "1=127.0.0.1:7101,2=127.0.0.1:7102", "--peer-dial", "127.0.0.1:7102=tcp-relay:40001",
		"--data-dir", filepath.Join(dir, "data"), "--log-file", filepath.Join(dir, "node.log"),
		"--schema=" + schema, "--certs-dir", "/no/such/dir"}}
	p, err := planNode(spec, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"run", "--id", "1",
		"--client-addr", "0.0.0.0:7071", "--peer-addr=0.0.0.0:7101",
		"--peers", "1=127.0.0.1:7101,2=127.0.0.1:7102", "--peer-dial", "127.0.0.1:7102=tcp-relay:40001",
		"--data-dir", filepath.Join(dir, "data"), "--log-file", filepath.Join(dir, "node.log"),
		"--schema=" + schema, "--certs-dir", "/no/such/dir",
		// Regression: the node published 0.0.0.0:7071 as its
		// client address; it advertises the harness's address.
		"--advertise-client-addr", "127.0.0.1:7071"}
	if !reflect.DeepEqual(p.Args, want) {
		t.Errorf("args:\nexpected %q\nfound    %q", want, p.Args)
	}
	if !reflect.DeepEqual(p.Ports, []int{7071, 7101}) {
		t.Errorf("ports: expected [7071 7101], found %v", p.Ports)
	}
	wantMounts := []mount.Mount{
		{Type: mount.TypeBind, Source: dir, Target: dir},
		{Type: mount.TypeBind, Source: schema, Target: schema, ReadOnly: true},
	}
	if !reflect.DeepEqual(p.Mounts, wantMounts) {
		t.Errorf("mounts:\nexpected %+v\nfound    %+v", wantMounts, p.Mounts)
	}

	// Without certificates the node is told --insecure: its 0.0.0.0 is
	// the container's own namespace, published on 127.0.0.1 only.
	p, err = planNode(cluster.NodeSpec{Name: "n1", Dir: dir, Args: []string{"run", "--client-addr", "127.0.0.1:7071"}}, "127.0.0.1")
	if err != nil || !reflect.DeepEqual(p.Args, []string{"run", "--client-addr", "0.0.0.0:7071", "--insecure", "--advertise-client-addr", "127.0.0.1:7071"}) {
		t.Errorf("no --certs-dir: expected --insecure appended, found %q (%v)", p.Args, err)
	}

	for _, tc := range []struct {
		args []string
		dir  string
		want string
	}{
		{[]string{"--client-addr", "127.0.0.1:0"}, dir, "fixed port"},
		{[]string{"--peer-addr", "10.1.2.3:7000"}, dir, "expected host 127.0.0.1"},
		{[]string{"--client-addr"}, dir, "found nothing"},
		{[]string{"--client-addr", "nonsense"}, dir, "nonsense"},
		{nil, "relative/dir", "absolute path"},
	} {
		_, err := planNode(cluster.NodeSpec{Name: "n1", Dir: tc.dir, Args: tc.args}, "127.0.0.1")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q in %q: expected an error naming %q, found %v", tc.args, tc.dir, tc.want, err)
		}
	}
}

// The relay container dials nodes by alias on the port the cluster
// allocated; the nodes dial peer relays by the relay's alias, the harness
// dials client relays where they are published.
func TestPlanMeshAndRewrite(t *testing.T) {
	nodes := map[string]mesh.Node{
		"n1": {Peer: "127.0.0.1:7101", Client: "127.0.0.1:7071"},
		"n2": {Peer: "127.0.0.1:7102", Client: "127.0.0.1:7072"},
	}
	p, err := planMesh(nodes, []string{"n1", "n2"})
	if err != nil {
		t.Fatal(err)
	}
	wantUp := map[string]mesh.Node{"n1": {Peer: "n1:7101", Client: "n1:7071"}, "n2": {Peer: "n2:7102", Client: "n2:7072"}}
	if !reflect.DeepEqual(p.Upstreams, wantUp) || !reflect.DeepEqual(p.ClientPorts, map[string]int{"n1": relayClientBase, "n2": relayClientBase + 1}) {
		t.Fatalf("plan: found %+v", p)
	}
	info := control.MeshInfo{Nodes: map[string]control.MeshNode{
		"n1": {ClientAddr: "0.0.0.0:9001", Peers: map[string]string{"n2": "0.0.0.0:41000"}},
		"n2": {ClientAddr: "0.0.0.0:9002", Peers: map[string]string{"n1": "0.0.0.0:41001"}},
	}}
	published := map[int]string{9001: "127.0.0.1:32001", 9002: "127.0.0.1:32002", relayControl: "127.0.0.1:32000"}
	if err := p.rewrite(&info, published); err != nil {
		t.Fatal(err)
	}
	if got := info.Nodes["n1"].Peers["n2"]; got != "tcp-relay:41000" {
		t.Errorf("peer relay n1->n2: expected tcp-relay:41000, found %s", got)
	}
	if got := info.Nodes["n2"].ClientAddr; got != "127.0.0.1:32002" {
		t.Errorf("client relay of n2: expected 127.0.0.1:32002, found %s", got)
	}

	// A client relay on another port than planned, or one not published,
	// is an error, not a silently unreachable address.
	bad := control.MeshInfo{Nodes: map[string]control.MeshNode{"n1": {ClientAddr: "0.0.0.0:1234", Peers: map[string]string{}}}}
	if err := p.rewrite(&bad, published); err == nil || !strings.Contains(err.Error(), "expected it on port 9001") {
		t.Errorf("expected a port mismatch error, found %v", err)
	}
	unpublished := control.MeshInfo{Nodes: map[string]control.MeshNode{"n1": {ClientAddr: "0.0.0.0:9001", Peers: map[string]string{}}}}
	if err := p.rewrite(&unpublished, map[int]string{}); err == nil || !strings.Contains(err.Error(), "not published") {
		t.Errorf("expected a not-published error, found %v", err)
	}
	if _, err := planMesh(map[string]mesh.Node{"n 1": {Peer: "a:1", Client: "a:2"}}, []string{"n 1"}); err == nil {
		t.Error("expected a node name Docker cannot alias to be refused")
	}
}

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		code   int64
		oom    bool
		signal string
		ecode  int
		text   string
	}{
		{0, false, "", 0, "exit status 0"},
		{1, false, "", 1, "exit status 1"},
		{137, false, "killed", -1, "signal: killed"},
		{143, false, "terminated", -1, "signal: terminated"},
		{137, true, "killed", -1, "signal: killed (out of memory: the kernel's OOM killer)"},
		{255, false, "", 255, "exit status 255"},
	} {
		st := exitStatus(tc.code, tc.oom)
		if st.Signal != tc.signal || st.Code != tc.ecode || st.Text != tc.text {
			t.Errorf("code %d oom %v: expected {%d %q %q}, found %+v", tc.code, tc.oom, tc.ecode, tc.signal, tc.text, st)
		}
	}
}

// A sample as a cgroup v1 daemon (this machine's) answers it.
func TestStatsOf(t *testing.T) {
	const sample = `{"read":"2026-01-01T00:00:10Z","pids_stats":{"current":12},
	"blkio_stats":{"io_service_bytes_recursive":[{"major":8,"minor":0,"op":"Read","value":4096},{"major":8,"minor":0,"op":"Write","value":8192},{"major":8,"minor":0,"op":"Total","value":12288}]},
	"cpu_stats":{"cpu_usage":{"total_usage":2500000000}},
	"memory_stats":{"usage":50000000,"limit":1000000000,"stats":{"rss":30000000,"total_inactive_file":10000000}},
	"networks":{"eth0":{"rx_bytes":100,"tx_bytes":200},"eth1":{"rx_bytes":1,"tx_bytes":2}}}`
	var raw container.StatsResponse
	if err := json.Unmarshal([]byte(sample), &raw); err != nil {
		t.Fatal(err)
	}
	got := statsOf(raw, 42, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	want := Stats{PID: 42, RSSBytes: 30000000, MemoryBytes: 40000000, MemoryLimitBytes: 1000000000, CPUPercent: 25, CPUSeconds: 2.5,
		BlockReadBytes: 4096, BlockWriteBytes: 8192, NetRxBytes: 101, NetTxBytes: 202, Tasks: 12}
	if got != want {
		t.Errorf("expected %+v\nfound    %+v", want, got)
	}
	// cgroup v2 names anonymous memory "anon" and the cache "inactive_file".
	raw.MemoryStats.Stats = map[string]uint64{"anon": 7, "inactive_file": 20000000}
	if got := statsOf(raw, 42, time.Time{}); got.RSSBytes != 7 || got.MemoryBytes != 30000000 || got.CPUPercent != 0 {
		t.Errorf("cgroup v2 sample: found %+v", got)
	}
}

// The recipe is what the deploy docs promise: FROM scratch, the non-root
// numeric user, the data volume owned by it, nothing pulled.
func TestDockerfile(t *testing.T) {
	df := ServerImage.Dockerfile()
	for _, want := range []string{"FROM scratch\n", "USER 65532:65532\n", "COPY --chown=65532:65532 data /data\n", `VOLUME ["/data"]`,
		`ENTRYPOINT ["/usr/local/bin/tidal-server"]`, "EXPOSE 7070\n", "EXPOSE 7100\n"} {
		if !strings.Contains(df, want) {
			t.Errorf("server Dockerfile: expected %q in\n%s", want, df)
		}
	}
	if strings.Count(df, "FROM") != 1 || strings.Contains(df, "RUN") {
		t.Errorf("expected one FROM scratch and no RUN (nothing to run it with), found\n%s", df)
	}
	if rf := RelayImage.Dockerfile(); strings.Contains(rf, "VOLUME") || !strings.Contains(rf, `CMD ["--control","0.0.0.0:8474"]`) {
		t.Errorf("relay Dockerfile: expected no volume and the control API on every interface, found\n%s", rf)
	}
}

// Equal inputs give equal contexts (so equal content tags: no rebuild); a
// changed binary gives another tag.
func TestContextAndContentTag(t *testing.T) {
	a1, err := ServerImage.Context([]byte("binary-1"))
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := ServerImage.Context([]byte("binary-1"))
	b, _ := ServerImage.Context([]byte("binary-2"))
	if !bytes.Equal(a1, a2) || ServerImage.ContentTag(a1) != ServerImage.ContentTag(a2) {
		t.Error("expected the same binary to give the same context and tag")
	}
	if ServerImage.ContentTag(a1) == ServerImage.ContentTag(b) {
		t.Error("expected a changed binary to change the content tag")
	}
	if tag := ServerImage.ContentTag(a1); !strings.HasPrefix(tag, "bin-") || len(tag) != 20 {
		t.Errorf("expected bin-<16 hex>, found %s", tag)
	}
	names := map[string]int64{}
	tr := tar.NewReader(bytes.NewReader(a1))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = h.Mode
	}
	for name, mode := range map[string]int64{"Dockerfile": 0o644, "passwd": 0o644, "group": 0o644, "tidal-server": 0o755, "data/": 0o750, "tmp/": 0o1777} {
		if names[name] != mode {
			t.Errorf("context: expected %s with mode %#o, found %#o (entries %v)", name, mode, names[name], names)
		}
	}
}

func TestVersionTag(t *testing.T) {
	for in, want := range map[string]string{"v1.2.3": "v1.2.3", "f6b6225-dirty": "f6b6225-dirty", "heads/main+x": "heads-main-x", "": "dev", "..": "dev", "-x": "x"} {
		if got := VersionTag(in); got != want {
			t.Errorf("VersionTag(%q): expected %q, found %q", in, want, got)
		}
	}
	if got := VersionTag(strings.Repeat("a", 200)); len(got) != 128 {
		t.Errorf("expected a 128-character tag, found %d", len(got))
	}
}

// A dynamically linked binary would fail in a FROM scratch image with a
// bare "no such file or directory": the build refuses it first.
func TestCheckStatic(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to stand for a dynamic binary")
	}
	sh, _ = filepath.EvalSymlinks(sh)
	if err := CheckStatic(sh); err == nil || !strings.Contains(err.Error(), "linked against") {
		t.Errorf("%s: expected a dynamic binary to be refused naming its interpreter, found %v", sh, err)
	}
	notELF := filepath.Join(t.TempDir(), "script")
	os.WriteFile(notELF, []byte("#!/bin/sh\n"), 0o755)
	if err := CheckStatic(notELF); err == nil || !strings.Contains(err.Error(), "static Linux executable") {
		t.Errorf("expected a script to be refused, found %v", err)
	}
	if bins != nil {
		if err := CheckStatic(bins.TidalServer); err != nil {
			t.Errorf("the CGO_ENABLED=0 tidal-server: expected static, found %v", err)
		}
	}
}

func TestOwnerAndGone(t *testing.T) {
	me, err := currentOwner()
	if err != nil {
		t.Fatal(err)
	}
	o, err := parseOwner(me)
	if err != nil || o.PID != os.Getpid() {
		t.Fatalf("round trip of %q: found %+v, %v", me, o, err)
	}
	host := o.Host
	if gone(me, host) {
		t.Error("expected this process's run not to be gone")
	}
	if gone(me, "another-host") {
		t.Error("expected a run of another host never to be judged gone")
	}
	restarted := owner{Host: host, PID: o.PID, Start: o.Start - 1}.String()
	if !gone(restarted, host) {
		t.Error("expected a reused pid (other start time) to mean the run is gone")
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	if !gone(owner{Host: host, PID: dead.Process.Pid, Start: 1}.String(), host) {
		t.Error("expected an exited owner to mean the run is gone")
	}
	for _, bad := range []string{"", "host/1", "host/x/1", "host/1/x", "host/0/1"} {
		if gone(bad, host) {
			t.Errorf("owner %q: expected a label this package did not write never to be judged gone", bad)
		}
	}
}

// Clock faults on the docker backend: the node's --test-clock-offset-file
// reaches the container unchanged, through a directory mount the harness
// writes on the host. In the node's directory (what the cluster passes)
// the node directory's read-write mount carries it; elsewhere its
// directory is mounted read-only — never the file, whose bind mount would
// pin the inode the harness later renames a new file over.
func TestPlanClockOffsetFile(t *testing.T) {
	dir := t.TempDir()
	inDir := cluster.ClockOffsetFile(dir)
	p, err := planNode(cluster.NodeSpec{Name: "n1", Dir: dir, Args: []string{"run", "--test-clock-offset-file", inDir}}, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"run", "--test-clock-offset-file", inDir}; !reflect.DeepEqual(p.Args, want) {
		t.Errorf("args: expected %q, found %q", want, p.Args)
	}
	if want := []mount.Mount{{Type: mount.TypeBind, Source: dir, Target: dir}}; !reflect.DeepEqual(p.Mounts, want) {
		t.Errorf("offset file in the node directory: expected only that directory mounted (read-write), found %+v", p.Mounts)
	}

	other := t.TempDir()
	outside := filepath.Join(other, "clock-offset")
	// The file exists, as one the harness wrote before the start would:
	// its directory is still what is mounted.
	if err := os.WriteFile(outside, []byte("0s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"run", "--test-clock-offset-file", outside}, {"run", "--test-clock-offset-file=" + outside}} {
		p, err := planNode(cluster.NodeSpec{Name: "n1", Dir: dir, Args: args}, "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		want := []mount.Mount{{Type: mount.TypeBind, Source: dir, Target: dir}, {Type: mount.TypeBind, Source: other, Target: other, ReadOnly: true}}
		if !reflect.DeepEqual(p.Mounts, want) {
			t.Errorf("%q: expected the offset file's directory mounted read-only, found %+v", args, p.Mounts)
		}
		if !reflect.DeepEqual(p.Args, args) {
			t.Errorf("args: expected %q unchanged, found %q", args, p.Args)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--test-clock-offset-file", "relative"}, "absolute path"},
		{[]string{"--test-clock-offset-file", "/no/such/dir/clock-offset"}, "directory to exist"},
		{[]string{"--test-clock-offset-file"}, "found nothing"},
	} {
		if _, err := planNode(cluster.NodeSpec{Name: "n1", Dir: dir, Args: tc.args}, "127.0.0.1"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: expected an error naming %q, found %v", tc.args, tc.want, err)
		}
	}
}
