//go:build !linux

package relay

import "syscall"

// tuneSocket leaves the system's congestion control (see
// congestion_linux.go).
func tuneSocket(_, _ string, _ syscall.RawConn) error { return nil }
