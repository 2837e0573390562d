package certs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
)

func TestListDescribesEachCertificateAndItsProblems(t *testing.T) {
	ca := newCA(t)
	other := newCA(t)
	dir := nodeDir(t, ca, 4)
	o := CreateOptions{CertsDir: dir, CAKey: filepath.Join(ca.CertsDir, CAKeyFile)}
	if _, err := CreateClient(o, "alice", auth.Admin); err != nil {
		t.Fatal(err)
	}
	old := o
	old.Lifetime, old.Now = time.Hour, func() time.Time { return time.Now().Add(-48 * time.Hour) }
	if _, err := CreateClient(old, "old", auth.Reader); err != nil {
		t.Fatal(err)
	}
	// A client certificate of another cluster's CA.
	if _, err := CreateClient(CreateOptions{CertsDir: other.CertsDir}, "stranger", auth.Writer); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ClientCertFile("stranger"), ClientKeyFile("stranger")} {
		copyFile(t, filepath.Join(other.CertsDir, f), filepath.Join(dir, f))
	}
	// bob's certificate without its key.
	if _, err := CreateClient(o, "bob", auth.Writer); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, ClientKeyFile("bob")))

	entries, err := List(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	byFile := map[string]Entry{}
	for _, e := range entries {
		byFile[e.File] = e
	}
	want := []struct {
		file, kind, identity, role, problem string
	}{
		{CACertFile, "ca", "CN=tidal CA,O=tidal", "", ""},
		{NodeCertFile, "node", "member 4", "", ""},
		{ClientCertFile("alice"), "client", "client alice", "admin", ""},
		{ClientCertFile("old"), "client", "client old", "reader", "expired"},
		{ClientCertFile("stranger"), "client", "client stranger", "writer", "not signed by any CA in ca.crt"},
		{ClientCertFile("bob"), "client", "client bob", "writer", "client.bob.key: missing"},
	}
	if len(entries) != len(want) {
		t.Errorf("List: %d entries; expected %d: %+v", len(entries), len(want), entries)
	}
	for _, w := range want {
		e, ok := byFile[w.file]
		if !ok {
			t.Errorf("List: no entry for %s", w.file)
			continue
		}
		if e.Kind != w.kind || e.Identity != w.identity || e.Role != w.role {
			t.Errorf("%s: %s %q %q; expected %s %q %q", w.file, e.Kind, e.Identity, e.Role, w.kind, w.identity, w.role)
		}
		problems := strings.Join(e.Problems, "; ")
		if w.problem == "" && problems != "" || !strings.Contains(problems, w.problem) {
			t.Errorf("%s: problems %q; expected %q", w.file, problems, w.problem)
		}
	}
	if e := byFile[NodeCertFile]; strings.Join(e.Hosts, ",") != "localhost,127.0.0.1" {
		t.Errorf("node.crt hosts %q; expected localhost,127.0.0.1", e.Hosts)
	}
}
