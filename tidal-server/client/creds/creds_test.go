package creds

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
)

func parse(t *testing.T, def string, args ...string) (*Flags, error) {
	t.Helper()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	var f Flags
	f.Register(fs, def)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	_, err := f.Resolve()
	return &f, err
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	o := certs.CreateOptions{CertsDir: dir}
	if _, err := certs.CreateCA(o); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateClient(o, "writer", auth.Writer); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(tokenFile, []byte("  secret-token-123456789 \nsecond line\n"), 0o600)
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o600)

	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	var f Flags
	f.Register(fs, "writer")
	fs.Parse([]string{"--certs-dir", dir})
	c, err := f.Resolve()
	if err != nil || c.TLS == nil || len(c.TLS.Certificates) != 1 || c.Token != "" {
		t.Fatalf("--certs-dir alone: expected the CA and client.writer.crt, got %+v, %v", c, err)
	}

	fs = pflag.NewFlagSet("t", pflag.ContinueOnError)
	f = Flags{}
	f.Register(fs, "writer")
	fs.Parse([]string{"--certs-dir", dir, "--token-file", tokenFile})
	c, err = f.Resolve()
	if err != nil || c.TLS == nil || len(c.TLS.Certificates) != 0 || c.Token != "secret-token-123456789" {
		t.Fatalf("--certs-dir and --token-file: expected the CA, no certificate, the trimmed first line as token; got %+v, %v", c, err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--token", "a", "--token-file", tokenFile}, "found both"},
		{[]string{"--cert-name", "writer"}, "needs --certs-dir"},
		{[]string{"--certs-dir", dir, "--cert-name", "admin"}, "client.admin.crt"},
		{[]string{"--token-file", empty}, "found none"},
		{[]string{"--certs-dir", t.TempDir()}, "ca.crt"},
	} {
		if _, err := parse(t, "writer", tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: expected an error mentioning %q, got %v", tc.args, tc.want, err)
		}
	}
}
