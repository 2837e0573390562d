package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

// runCLI runs tidal-server with args and stdin, returning stdout, stderr.
func runCLI(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	root := newRootCommand()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), errOut.String(), err
}

func TestCertsCommands(t *testing.T) {
	dir := t.TempDir()
	caKey := filepath.Join(t.TempDir(), "ca.key")
	steps := [][]string{
		{"certs", "create-ca", "--certs-dir", dir, "--ca-key", caKey},
		{"certs", "create-node", "--certs-dir", dir, "--ca-key", caKey, "--id", "2", "--host", "localhost,127.0.0.1", "--host", "node2.example.com"},
		{"certs", "create-client", "ops", "--role", "admin", "--certs-dir", dir, "--ca-key", caKey, "--lifetime", "720h"},
	}
	for _, args := range steps {
		if out, _, err := runCLI(t, "", args...); err != nil || !strings.Contains(out, "wrote ") {
			t.Fatalf("%s: %q, %v", strings.Join(args, " "), out, err)
		}
	}
	s, err := certs.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if s.Member() != 2 || strings.Join(s.NodeCert().DNSNames, ",") != "localhost,node2.example.com" {
		t.Errorf("node.crt: member %d, DNS %q", s.Member(), s.NodeCert().DNSNames)
	}
	out, _, err := runCLI(t, "", "certs", "list", "--certs-dir", dir)
	if err != nil {
		t.Fatalf("certs list: %v\n%s", err, out)
	}
	for _, want := range []string{"ca.crt", "node.crt", "member 2", "client.ops.crt", "client ops", "admin", "localhost,node2.example.com,127.0.0.1"} {
		if !strings.Contains(out, want) {
			t.Errorf("certs list output lacks %q:\n%s", want, out)
		}
	}

	// Refusals: an existing key without --overwrite, a bad role, a
	// missing required flag.
	if _, _, err := runCLI(t, "", steps[1]...); err == nil || !strings.Contains(err.Error(), "--overwrite") {
		t.Errorf("create-node over an existing node.key: %v; expected a refusal", err)
	}
	if _, _, err := runCLI(t, "", "certs", "create-client", "x", "--role", "root", "--certs-dir", dir, "--ca-key", caKey); err == nil || !strings.Contains(err.Error(), "--role") {
		t.Errorf("create-client --role root: %v; expected a refusal", err)
	}
	if _, _, err := runCLI(t, "", "certs", "create-node", "--certs-dir", dir, "--ca-key", caKey, "--id", "3"); err == nil || !strings.Contains(err.Error(), "host") {
		t.Errorf("create-node without --host: %v; expected a refusal", err)
	}

	// A problem makes list exit with status 3.
	os.Remove(filepath.Join(dir, certs.ClientKeyFile("ops")))
	out, _, err = runCLI(t, "", "certs", "list", "--certs-dir", dir)
	if exitCode(err) != 3 || !strings.Contains(out, "client.ops.key: missing") {
		t.Errorf("certs list with a missing key: exit %d (%v)\n%s\nexpected exit 3 naming the key", exitCode(err), err, out)
	}
}

func TestTokensCommands(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens")
	secret, stderr, err := runCLI(t, "", "tokens", "add", "ci-bot", "--role", "writer", "--file", file)
	if err != nil {
		t.Fatal(err)
	}
	secret = strings.TrimSpace(secret)
	if !strings.Contains(stderr, "added ci-bot (writer) on line 1") {
		t.Errorf("tokens add stderr %q", stderr)
	}
	if _, _, err := runCLI(t, "ops-secret-0123456789\n", "tokens", "add", "ops", "--role", "admin", "--file", file, "--secret-stdin"); err != nil {
		t.Fatal(err)
	}
	set, err := auth.LoadTokens(file)
	if err != nil {
		t.Fatal(err)
	}
	if tok, ok := set.Lookup(secret); !ok || tok.Name != "ci-bot" || tok.Role != auth.Writer {
		t.Errorf("the printed secret looks up as %+v, %v; expected ci-bot writer", tok, ok)
	}
	if tok, ok := set.Lookup("ops-secret-0123456789"); !ok || tok.Role != auth.Admin {
		t.Errorf("the stdin secret looks up as %+v, %v; expected ops admin", tok, ok)
	}

	out, _, err := runCLI(t, "abc-secret-0123456789\r\n", "tokens", "hash")
	if err != nil || strings.TrimSpace(out) != auth.HashSecret("abc-secret-0123456789") {
		t.Errorf("tokens hash = %q, %v; expected %s", out, err, auth.HashSecret("abc-secret-0123456789"))
	}
	for stdin, want := range map[string]string{"": "found none", "short\n": "at least 16", "has a space 0123456789\n": "without spaces"} {
		if _, _, err := runCLI(t, stdin, "tokens", "hash"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("tokens hash of %q: %v; expected an error containing %q", stdin, err, want)
		}
	}
	var ee *exitError
	if _, _, err := runCLI(t, "", "tokens", "add", "ci-bot", "--role", "reader", "--file", file); err == nil || errors.As(err, &ee) || !strings.Contains(err.Error(), "already has a token") {
		t.Errorf("tokens add of an existing name: %v; expected a refusal", err)
	}
}
