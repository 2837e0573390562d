package process

import (
	"context"
	"fmt"
	"os"

	"github.com/tidaldb/tidal/harness/cluster"
)

// Backend runs cluster nodes as tidal-server processes on this machine.
type Backend struct {
	Binary   string
	Registry *Registry // optional: pid records for the reaper
}

var _ cluster.Backend = (*Backend)(nil)

// NewBackend checks that binary exists and is executable.
func NewBackend(binary string, reg *Registry) (*Backend, error) {
	st, err := os.Stat(binary)
	if err != nil {
		return nil, fmt.Errorf("process backend: server binary: %w (build it with `make build`)", err)
	}
	if st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("process backend: %s is not executable", binary)
	}
	return &Backend{Binary: binary, Registry: reg}, nil
}

// Name implements cluster.Backend.
func (b *Backend) Name() string { return "process" }

// Host implements cluster.Backend.
func (b *Backend) Host() string { return "127.0.0.1" }

// Launch implements cluster.Backend.
func (b *Backend) Launch(spec cluster.NodeSpec) (cluster.Handle, error) {
	bin := b.Binary
	if spec.Binary != "" {
		bin = spec.Binary
	}
	p, err := Start(Spec{Name: spec.Name, Binary: bin, Args: spec.Args, Dir: spec.Dir, LogPath: spec.LogPath}, b.Registry)
	if err != nil {
		return nil, err
	}
	return handle{p}, nil
}

// Close implements cluster.Backend.
func (b *Backend) Close() error { return nil }

type handle struct{ *Process }

func (h handle) Terminate(ctx context.Context) error { return h.Process.Terminate(ctx) }
func (h handle) Stats() (any, error)                 { return h.Process.Stats() }

// Listening implements cluster.ListenerOwner.
func (h handle) Listening(addr string) (bool, error) { return h.Process.Listening(addr) }

// ExitCode implements cluster.ExitReporter.
func (h handle) ExitCode() (int, string, bool) {
	s, ok := h.Process.ExitStatus()
	return s.Code, s.Text, ok
}
