package relay

import "golang.org/x/sys/unix"

// peerHungUp reports whether the peer of the socket fd has sent its FIN
// or reset the connection, without taking a byte from the stream: poll(2)
// with POLLRDHUP sees a FIN even behind unread data, which a peek cannot.
func peerHungUp(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return false
		}
		return fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	}
}
