package relay

import (
	"syscall"
	"unsafe"
)

// readFD and writeFD are read(2) and write(2) on a non-blocking socket,
// made as raw syscalls: without the runtime's entersyscall/exitsyscall,
// which (when the process had been idle, as a relay between two messages
// is) wake the runtime's sysmon thread with a futex on every call. That
// wake-up and sysmon's own run were 14% of the relay's CPU on the 1-byte
// round trip, and a thread woken on a 2-core machine competes with the
// one carrying the message. A raw syscall keeps the P for its duration,
// which is harmless here: the descriptors are non-blocking, so the call
// never waits.
func readFD(fd int, buf []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(len(buf)))
		if e != syscall.EINTR {
			return int(n), e
		}
	}
}

func writeFD(fd int, buf []byte) (int, syscall.Errno) {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(buf))), uintptr(len(buf)))
		if e != syscall.EINTR {
			return int(n), e
		}
	}
}

// closeWrite sends the FIN on to the destination: shutdown(2) SHUT_WR,
// as TCPConn.CloseWrite does, but as a raw syscall, for the reason
// readFD and writeFD are: no entersyscall/exitsyscall around a call that
// on loopback runs the peer's FIN processing inside it (15% of the
// relay's CPU per connection), during which sysmon could take the P
// away. The socket is non-blocking, so the call never waits. (Measured
// with the raw connect and the inherited keep-alive: a few percent of
// relay CPU per connection, bench/results/history-2026-12.md.)
func (p *pump) closeWrite() {
	_ = p.dstRaw.Control(func(fd uintptr) {
		syscall.RawSyscall(syscall.SYS_SHUTDOWN, fd, syscall.SHUT_WR, 0)
	})
}
