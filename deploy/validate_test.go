package deploy

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/tidaldb/tidal/buildinfo/gobuild"
)

// tidal is the real tidal-server, built once for the package's tests.
var tidal Binary

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tidal-deploy-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tidal = Binary{Path: filepath.Join(dir, "tidal-server")}
	build := gobuild.Command(context.Background(), "..", gobuild.StampOf(".."), tidal.Path, "./tidal-server")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "deploy: go build ./tidal-server: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// loud prints the checks a report left out on stderr, visible in `make
// test` without -v: a pending check must never pass quietly.
func loud(t *testing.T, r *Report) {
	for _, n := range r.Notes {
		fmt.Fprintf(os.Stderr, "*** %s: NOT CHECKED: %s\n", t.Name(), n)
	}
}

func k8sFiles(t *testing.T) fstest.MapFS {
	t.Helper()
	files := fstest.MapFS{}
	entries, err := os.ReadDir("k8s")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("k8s", e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = &fstest.MapFile{Data: data}
	}
	return files
}

func checkK8s(t *testing.T, fsys fs.FS) *Report {
	t.Helper()
	k, err := LoadK8s(fsys)
	if err != nil {
		return &Report{Problems: []error{err}}
	}
	return CheckK8s(k, tidal)
}

func TestK8sManifests(t *testing.T) {
	r := checkK8s(t, os.DirFS("k8s"))
	loud(t, r)
	if err := r.Err(); err != nil {
		t.Fatalf("deploy/k8s:\n%v", err)
	}
}

func TestComposeFile(t *testing.T) {
	data, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadCompose(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Services) != 3 {
		t.Errorf("expected the 3-node cluster the README promises, found %d services", len(c.Services))
	}
	r := CheckCompose(c, tidal)
	loud(t, r)
	if err := r.Err(); err != nil {
		t.Fatalf("deploy/compose.yaml:\n%v", err)
	}
}

// mutation is one planted defect: file's old text becomes new, and the
// validator must say so naming want.
type mutation struct {
	name, file, old, new, want string
}

// The validator can say no: each planted defect is reported, naming the
// object and field.
func TestK8sValidatorCatches(t *testing.T) {
	for _, m := range []mutation{
		{"even replicas", "statefulset.yaml", "replicas: 3", "replicas: 4", "StatefulSet tidal: spec.replicas: expected an odd number"},
		{"unknown field", "statefulset.yaml", "serviceName: tidal-peers", "serviceNam: tidal-peers", `unknown field "spec.serviceNam"`},
		{"unknown field in a container", "statefulset.yaml", "imagePullPolicy: IfNotPresent", "imagePullPolicyy: IfNotPresent", `unknown field "spec.template.spec.containers[0].imagePullPolicyy"`},
		{"wrong probe path", "statefulset.yaml", "path: /readyz", "path: /ready", "readinessProbe.httpGet.path: expected /readyz"},
		{"probe path that is no route", "statefulset.yaml", "path: /healthz", "path: /health", "livenessProbe.httpGet.path: GET /health: expected 200 from a healthy node, found 404"},
		{"probe on the peer port", "statefulset.yaml", "path: /readyz\n              port: client", "path: /readyz\n              port: peer", "readinessProbe.httpGet.port: expected the client port 7070"},
		{"plain probe of a TLS client plane", "statefulset.yaml", "path: /healthz\n              port: client\n              scheme: HTTPS", "path: /healthz\n              port: client\n              scheme: HTTP", "livenessProbe.httpGet.scheme: expected HTTPS"},
		{"ordered start-up", "statefulset.yaml", "podManagementPolicy: Parallel", "podManagementPolicy: OrderedReady", "spec.podManagementPolicy: expected Parallel"},
		{"ordinals from 0", "statefulset.yaml", "start: 1", "start: 0", "spec.ordinals.start: expected at least 1"},
		{"id not from the ordinal", "statefulset.yaml", "- --id=$(TIDAL_ID)", "- --id=1", "args --id: expected --id=$(VAR)"},
		{"undefined variable", "statefulset.yaml", "- --data-dir=/data", "- --data-dir=$(DATA)", "refers to $(DATA)"},
		{"flag the server lacks", "statefulset.yaml", "--log-format=json", "--log-fmt=json", "tidal-server refuses the arguments: unknown flag: --log-fmt"},
		{"bad flag value", "statefulset.yaml", "--drain-timeout=20s", "--drain-timeout=soon", `invalid argument "soon" for "--drain-timeout"`},
		{"peer missing", "statefulset.yaml", ",3=tidal-3.tidal-peers:7100", "", "args --peers: expected members [1 2 3]"},
		{"peer at another pod's name", "statefulset.yaml", "2=tidal-2.tidal-peers:7100", "2=tidal-3.tidal-peers:7100", "member 2: expected pod tidal-2's stable name"},
		{"container port apart from the flag", "statefulset.yaml", "containerPort: 7100", "containerPort: 7101", `args --peer-addr: expected containerPort "peer" to be 7100`},
		{"listening on loopback", "statefulset.yaml", "--client-addr=0.0.0.0:7070", "--client-addr=127.0.0.1:7070", "args --client-addr: expected to listen on every interface"},
		{"no memory limit", "statefulset.yaml", "              memory: 2Gi\n", "", "resources.limits.memory: expected a limit"},
		{"key mode", "statefulset.yaml", "defaultMode: 0400", "defaultMode: 0440", "secret.defaultMode: expected 0400"},
		{"key the server refuses as kubelet writes it", "statefulset.yaml", "defaultMode: 0400", "defaultMode: 0620", "node.key as kubelet writes it (mode 0660, owner root, group 65532): tidal-server refuses it"},
		{"advertised as another pod", "statefulset.yaml", "--advertise-client-addr=tidal-$(TIDAL_ID).tidal-peers:7070", "--advertise-client-addr=tidal-1.tidal-peers:7070", "pod tidal-2: expected tidal-2.tidal-peers:7070"},
		{"advertised on the peer port", "statefulset.yaml", "--advertise-client-addr=tidal-$(TIDAL_ID).tidal-peers:7070", "--advertise-client-addr=tidal-$(TIDAL_ID).tidal-peers:7100", "pod tidal-1: expected tidal-1.tidal-peers:7070"},
		{"no fsGroup: the key is unreadable", "statefulset.yaml", "        fsGroup: 65532\n", "", "uid 65532 cannot read it"},
		{"a member without its key", "statefulset.yaml", "              - {key: node-3.key, path: 3/node.key}\n", "", "expected path 3/node.key"},
		{"every member the same certificate", "statefulset.yaml", "subPathExpr: $(TIDAL_ID)", "subPath: \"1\"", "subPathExpr: expected $(TIDAL_ID)"},
		{"data on the pod", "statefulset.yaml", "- --data-dir=/data", "- --data-dir=/tmp/data", `expected --data-dir "/tmp/data" mounted from a volumeClaimTemplate`},
		{"headless peers hide not-ready pods", "services.yaml", "publishNotReadyAddresses: true", "publishNotReadyAddresses: false", "spec.publishNotReadyAddresses: expected true"},
		{"no client Service", "services.yaml", "targetPort: client", "targetPort: peer", "expected a Service selecting"},
		{"budget of two", "pdb.yaml", "maxUnavailable: 1", "maxUnavailable: 2", "spec.maxUnavailable: expected 1"},
		{"schema the server refuses", "configmap.yaml", "half_life: 6h", "halflife: 6h", "the server refuses the schema"},
		{"manifest not applied", "kustomization.yaml", "  - pdb.yaml\n", "", "pdb.yaml is not listed"},
		{"generated name would not match", "kustomization.yaml", "disableNameSuffixHash: true", "disableNameSuffixHash: false", "disableNameSuffixHash: expected true"},
	} {
		t.Run(m.name, func(t *testing.T) {
			files := k8sFiles(t)
			f := files[m.file]
			if !strings.Contains(string(f.Data), m.old) {
				t.Fatalf("%s does not contain %q: the mutation is stale", m.file, m.old)
			}
			f.Data = []byte(strings.Replace(string(f.Data), m.old, m.new, 1))
			err := checkK8s(t, files).Err()
			if err == nil || !strings.Contains(err.Error(), m.want) {
				t.Errorf("expected a problem naming %q, found:\n%v", m.want, err)
			}
		})
	}
}

func TestComposeValidatorCatches(t *testing.T) {
	orig, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	third := string(orig)[strings.Index(string(orig), "  tidal-3:"):strings.Index(string(orig), "volumes:\n  tidal-1-data")]
	for _, m := range []mutation{
		{"even nodes", "", third, "", "compose.yaml: services: expected an odd number of nodes (a quorum tolerates (n-1)/2 failures), found 2"},
		{"unknown field", "", "    hostname: tidal-1", "    hostnam: tidal-1", "field hostnam not found"},
		{"unknown top-level field", "", "\nservices:\n", "\nservics:\n", "field servics: not a Compose top-level field"},
		{"published on every interface", "", `"127.0.0.1:7072:7070"`, `"7072:7070"`, "services.tidal-2.ports: \"7072:7070\": expected 127.0.0.1:HOST:CONTAINER"},
		{"published port not the client port", "", `"127.0.0.1:7071:7070"`, `"127.0.0.1:7071:7100"`, "expected the container side to be the client port 7070"},
		{"duplicate id", "", "      - --id=3", "      - --id=2", "member 2 is also tidal-2"},
		{"peer at another service", "", "2=tidal-2:7100,3=tidal-3:7100\n      - --data-dir=/data\n      - --certs-dir=/certs\n      - --log-format=json\n    ports: [\"127.0.0.1:7071", "2=tidal-3:7100,3=tidal-3:7100\n      - --data-dir=/data\n      - --certs-dir=/certs\n      - --log-format=json\n    ports: [\"127.0.0.1:7071", "expected the same list on every node"},
		{"flag the server lacks", "", "--log-format=json\n    ports: [\"127.0.0.1:7073", "--log-fmt=json\n    ports: [\"127.0.0.1:7073", "services.tidal-3.command: tidal-server refuses the arguments: unknown flag: --log-fmt"},
		{"shared data volume", "", "tidal-2-data:/data", "tidal-1-data:/data", "volume tidal-1-data also holds tidal-1's data"},
		{"writable certificates", "", "./certs/tidal-1:/certs:ro", "./certs/tidal-1:/certs", "expected the certificates mounted read-only"},
		{"advertising the container's address", "", "--advertise-client-addr=127.0.0.1:7072", "--advertise-client-addr=0.0.0.0:7070", "services.tidal-2.command --advertise-client-addr: expected 127.0.0.1:7072 (the published client port)"},
		{"advertising another node's port", "", "--advertise-client-addr=127.0.0.1:7073", "--advertise-client-addr=127.0.0.1:7071", "services.tidal-3.command --advertise-client-addr: expected 127.0.0.1:7073"},
		{"data in the container", "", "tidal-3-data:/data", "tidal-3-data:/var/data", "expected a named volume at --data-dir"},
	} {
		t.Run(m.name, func(t *testing.T) {
			if !strings.Contains(string(orig), m.old) {
				t.Fatalf("compose.yaml does not contain %q: the mutation is stale", m.old)
			}
			data := strings.Replace(string(orig), m.old, m.new, 1)
			var err error
			c, lerr := LoadCompose([]byte(data))
			if lerr != nil {
				err = lerr
			} else {
				err = CheckCompose(c, tidal).Err()
			}
			if err == nil || !strings.Contains(err.Error(), m.want) {
				t.Errorf("expected a problem naming %q, found:\n%v", m.want, err)
			}
		})
	}
}

// accepting is a server that has every pending feature.
type accepting struct{ Binary }

func (accepting) CheckRun([]string) error { return nil }

// A pending flag is noted, never silently dropped; once the server
// accepts it, the entry in Pending is an error until it is removed.
func TestPendingFlags(t *testing.T) {
	if len(Pending) == 0 {
		t.Skip("nothing pending")
	}
	data, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadCompose(data)
	if err != nil {
		t.Fatal(err)
	}
	for flag := range Pending {
		if !strings.Contains(string(data), "--"+flag) {
			continue
		}
		r := CheckCompose(c, tidal)
		if err := tidal.CheckRun([]string{"run", "--" + flag + "=x"}); err != nil && !strings.Contains(strings.Join(r.Notes, "\n"), "--"+flag+" left out of the parse check") {
			t.Errorf("--%s: the server refuses it, expected a note saying the check left it out, found notes %q", flag, r.Notes)
		}
		r = CheckCompose(c, accepting{tidal})
		if err := r.Err(); err == nil || !strings.Contains(err.Error(), "accepts --"+flag+" now: remove it from deploy.Pending") {
			t.Errorf("--%s: expected a server that accepts it to make the entry an error, found %v", flag, err)
		}
	}
}
