//go:build !linux

package relay

import "syscall"

func readFD(fd int, buf []byte) (int, syscall.Errno) {
	for {
		n, err := syscall.Read(fd, buf)
		if err != syscall.EINTR {
			return n, errno(err)
		}
	}
}

func writeFD(fd int, buf []byte) (int, syscall.Errno) {
	for {
		n, err := syscall.Write(fd, buf)
		if err != syscall.EINTR {
			return n, errno(err)
		}
	}
}

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}

// closeWrite sends the FIN on to the destination.
func (p *pump) closeWrite() { _ = p.dst.CloseWrite() }
