package relay

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Keep-alive on the accepted sockets is set once, on the listener, and
// inherited: Linux copies SO_KEEPALIVE and the TCP_KEEPIDLE, TCP_KEEPINTVL
// and TCP_KEEPCNT values of a listening socket to every socket it accepts.
// Go sets the same four options with four setsockopt(2) calls on every
// accepted connection (ListenConfig.KeepAlive 0); the relay asks it not to
// (-1) and keeps Go's probing (15 s idle, 15 s interval, 9 probes), which
// TestAcceptedSocketsKeepGoKeepAlive pins on the accepted sockets.
const listenerKeepAlive = -1

const (
	keepAliveIdle     = 15 * time.Second
	keepAliveInterval = 15 * time.Second
	keepAliveCount    = 9
)

// tuneListener is tuneSocket plus the keep-alive the accepted sockets
// inherit.
func tuneListener(network, address string, c syscall.RawConn) error {
	var err error
	cerr := c.Control(func(fd uintptr) {
		setCongestion(int(fd))
		for _, o := range []struct{ level, opt, v int }{
			{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
			{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(keepAliveIdle / time.Second)},
			{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(keepAliveInterval / time.Second)},
			{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, keepAliveCount},
		} {
			if e := unix.SetsockoptInt(int(fd), o.level, o.opt, o.v); e != nil && err == nil {
				err = e
			}
		}
	})
	if cerr != nil {
		return cerr
	}
	return err
}
