//go:build !linux

package relay

import "syscall"

// peerHungUp reports whether the peer of the socket fd has sent its FIN
// or reset the connection, without taking a byte from the stream: a
// one-byte peek returns 0 at end of stream. A FIN behind unread bytes is
// not seen here (Linux's POLLRDHUP sees it); such a connection is
// released when the fault lifts, as before.
func peerHungUp(fd int) bool {
	var b [1]byte
	for {
		n, _, err := syscall.Recvfrom(fd, b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		if err == syscall.EINTR {
			continue
		}
		return (n == 0 && err == nil) || isReset(err)
	}
}
