package relay

import (
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dialControl is the upstream dial's net.Dialer Control function: the
// socket options of tuneSocket, then the connect(2) itself, as a raw
// syscall.
//
// On loopback the whole handshake (the listener's SYN processing, the
// SYN-ACK, our ACK) runs inside connect: a fifth of the relay's CPU per
// connection. Made by the net package, the non-blocking connect answered
// EINPROGRESS (the socket only turns established as the call returns),
// so the dialing goroutine parked in the poller and was woken for a
// handshake that had already finished, after a getsockopt(SO_ERROR); and
// it ran as a syscall.Syscall, during which sysmon could take the P away. Connected here, the net package's own
// connect(2) then finds the socket connected (0 or EISCONN, both success
// to it) and goes on without waiting; if the handshake is still under way
// (EINPROGRESS here, EALREADY there), or failed, it waits and reports as
// it always did, context and timeout included.
func dialControl(network, address string, c syscall.RawConn) error {
	if err := tuneSocket(network, address, c); err != nil {
		return err
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil || ap.Addr().Zone() != "" {
		return nil // not a plain address literal: the net package connects
	}
	// The net package names the socket's family in network: tcp4 for an
	// AF_INET socket, tcp6 for AF_INET6 (which takes IPv4 addresses
	// mapped, ::ffff:a.b.c.d).
	var cerr error
	if err := c.Control(func(fd uintptr) { cerr = connectRaw(int(fd), network == "tcp6", ap) }); err != nil {
		return err
	}
	return cerr
}

func connectRaw(fd int, inet6 bool, ap netip.AddrPort) error {
	var (
		ptr  unsafe.Pointer
		size uintptr
		sa4  unix.RawSockaddrInet4
		sa6  unix.RawSockaddrInet6
	)
	port := ap.Port()
	switch {
	case !inet6 && ap.Addr().Unmap().Is4():
		sa4.Family = unix.AF_INET
		sa4.Addr = ap.Addr().Unmap().As4()
		pp := (*[2]byte)(unsafe.Pointer(&sa4.Port))
		pp[0], pp[1] = byte(port>>8), byte(port)
		ptr, size = unsafe.Pointer(&sa4), unsafe.Sizeof(sa4)
	case inet6:
		sa6.Family = unix.AF_INET6
		sa6.Addr = ap.Addr().As16()
		pp := (*[2]byte)(unsafe.Pointer(&sa6.Port))
		pp[0], pp[1] = byte(port>>8), byte(port)
		ptr, size = unsafe.Pointer(&sa6), unsafe.Sizeof(sa6)
	default:
		return nil
	}
	_, _, e := syscall.RawSyscall(syscall.SYS_CONNECT, uintptr(fd), uintptr(ptr), size)
	switch e {
	case 0, syscall.EINPROGRESS, syscall.EINTR:
		// Connected, or under way (an interrupted connect goes on in the
		// background): the net package's connect takes it from here.
		return nil
	}
	return e
}
