package relay

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// spliceChunk is the most one splice(2) moves; 64 KiB is the default pipe
// capacity, so a drain never finds the pipe full.
const spliceChunk = 64 << 10

// kernelPipe is the in-kernel buffer splice(2) moves bytes through.
type kernelPipe struct{ r, w int }

func (k *kernelPipe) close() {
	if k != nil {
		unix.Close(k.r)
		unix.Close(k.w)
	}
}

// splice moves bytes src -> dst inside the kernel while no fault acts on
// this direction. It drains src into the pipe through guardedRead (so a
// fault change stops it before the next byte is taken), then pumps the
// pipe into dst, as Go's own TCPConn.ReadFrom does; we do it by hand
// because ReadFrom gives no hook between its deadline check and its
// syscall. It returns false when the direction is finished.
func (p *pump) splice() bool {
	if p.pipe == nil {
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			p.c.r.log.Warn("no pipe for splice, copying instead", "err", err)
			p.noSplice = true
			return true
		}
		p.pipe = &kernelPipe{r: fds[0], w: fds[1]}
	}
	for {
		n, stale, err := p.guardedRead(func(fd int) (int, error) {
			n, err := unix.Splice(fd, nil, p.pipe.w, nil, spliceChunk, unix.SPLICE_F_NONBLOCK)
			return int(n), err
		})
		switch {
		case stale || errors.Is(err, os.ErrDeadlineExceeded):
			return true // fault set changed: re-sync
		case errors.Is(err, unix.EINVAL):
			p.noSplice = true // not spliceable; nothing was consumed
			return true
		case err != nil:
			p.fail(err)
			return false
		case n == 0:
			_ = p.dst.CloseWrite()
			return false
		}
		for n > 0 {
			var moved int
			var serr error
			werr := p.dstRaw.Write(func(fd uintptr) bool {
				m, err := unix.Splice(p.pipe.r, nil, int(fd), nil, n, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
				if err == unix.EAGAIN {
					return false
				}
				moved, serr = int(m), err
				return err != unix.EINTR
			})
			if werr == nil {
				werr = serr
			}
			if moved > 0 {
				n -= moved
				p.bytes.Add(uint64(moved))
			}
			if werr != nil {
				p.fail(werr)
				return false
			}
		}
	}
}
