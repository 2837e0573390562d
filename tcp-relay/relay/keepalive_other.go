//go:build !linux

package relay

import "syscall"

// Elsewhere Go sets keep-alive on every accepted socket (see
// keepalive_linux.go).
const listenerKeepAlive = 0

func tuneListener(network, address string, c syscall.RawConn) error {
	return tuneSocket(network, address, c)
}
