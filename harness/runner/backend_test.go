package runner

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --backend names what runs the nodes; anything else is refused by name,
// and docker without a tcp-relay binary says which file it needs before
// touching the daemon.
func TestStartBackendRefuses(t *testing.T) {
	dir := t.TempDir()
	server := filepath.Join(dir, "tidal-server")
	if err := os.WriteFile(server, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ backend, relay, want string }{
		{"podman", "", `backend: expected process or docker, found "podman"`},
		{BackendDocker, "", filepath.Join(dir, "tcp-relay")},
		{BackendDocker, filepath.Join(dir, "no-relay"), "no-relay"},
	} {
		_, _, err := startBackend(context.Background(), Config{Backend: tc.backend}, server, tc.relay, nil, dir, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("backend %q relay %q: expected an error naming %q, found %v", tc.backend, tc.relay, tc.want, err)
		}
	}
	b, netw, err := startBackend(context.Background(), Config{}, server, "", nil, dir, nil)
	if err != nil || b.Name() != "process" || netw != nil {
		t.Errorf("default backend: expected process without a network builder, found %v, %v", b, err)
	}
}
