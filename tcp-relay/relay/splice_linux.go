package relay

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// spliceChunk is the most one splice(2) moves, and the pipe size asked
// for (1 MiB is the default pipe-max-size). The pump empties the pipe
// before every drain, so a drain never finds it full whatever its size.
// Measured against 256 KiB: a third less relay CPU per byte (a loaded
// sender leaves ~700 KB per wake-up, so fewer syscalls and wake-ups).
const spliceChunk = 1 << 20

// kernelPipe is the in-kernel buffer splice(2) moves bytes through.
// Empty pipes are reused: creating and sizing one costs several syscalls
// per connection direction, which showed in connections per second.
type kernelPipe struct {
	r, w  int
	dirty bool // may hold bytes: never reuse
}

// pipePool holds empty pipes. Its size is bounded because pipe capacity
// counts against the user's pipe-user-pages-soft (64 MiB by default) even
// while empty: 64 pipes of 1 MiB reach it, after which the kernel refuses
// to grow new pipes (they still work, at 64 KiB or less).
var pipePool = make(chan *kernelPipe, 64)

func getPipe() (*kernelPipe, error) {
	select {
	case k := <-pipePool:
		return k, nil
	default:
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, err
	}
	// A larger pipe moves more per syscall pair; the kernel may refuse
	// (pipe-max-size, per-user limits), and the default works too.
	_, _ = unix.FcntlInt(uintptr(fds[1]), unix.F_SETPIPE_SZ, spliceChunk)
	return &kernelPipe{r: fds[0], w: fds[1]}, nil
}

func (k *kernelPipe) close() {
	if k == nil {
		return
	}
	if !k.dirty {
		select {
		case pipePool <- k:
			return
		default:
		}
	}
	unix.Close(k.r)
	unix.Close(k.w)
}

// splice forwards bulk data src -> dst while no fault acts on this
// direction: through a kernel pipe with splice(2), never entering user
// space. It returns false when the direction is finished, true when the
// fault set changed (or splice is unusable, or the data turned small
// again) and run must look again.
//
// Small messages go through copyLoop (copy.go) instead: for a few bytes a
// copy is cheaper than the pipe's page references, and a connection that
// only ever carries small messages never takes a pipe. A read that fills
// the copy buffer means a bulk transfer and brings the pump here; a splice
// that moves less than a buffer's worth sends it back.
//
// Every read goes through guardedRead (so a fault change stops it before
// the next byte is taken), and bytes read across a change are handed to
// the fault-aware loop instead of being forwarded. We do not use Go's
// TCPConn.ReadFrom because it gives no hook around its syscall.
func (p *pump) splice() bool {
	for {
		if p.pipe == nil {
			k, err := getPipe()
			if err != nil {
				p.c.r.log.Warn("no pipe for splice, copying instead", "err", err)
				p.noSplice = true
				return true
			}
			p.pipe = k
		}
		n, stale, err := p.guardedRead(func(fd int) (int, error) {
			n, err := unix.Splice(fd, nil, p.pipe.w, nil, spliceChunk, unix.SPLICE_F_NONBLOCK)
			return int(n), err
		})
		if errors.Is(err, unix.EINVAL) {
			p.noSplice = true // not spliceable; nothing was consumed
			return true
		}
		if more, ok := p.afterRead(n, stale, err); !ok {
			return more
		}
		if !p.announce() {
			// The splice raced a fault change: these bytes belong to the
			// new set, so take them out of the pipe for the fault-aware
			// loop instead of forwarding them.
			if err := p.unpipe(n); err != nil {
				p.pipe.dirty = true
				p.fail(err)
				return false
			}
			return true
		}
		for left := n; left > 0; {
			var moved int
			var serr error
			werr := p.dstRaw.Write(func(fd uintptr) bool {
				m, err := unix.Splice(p.pipe.r, nil, int(fd), nil, left, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
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
				left -= moved
				p.bytes.Add(uint64(moved))
			}
			if errors.Is(werr, os.ErrDeadlineExceeded) {
				// Kicked: Apply waits for this write. What is still in the
				// pipe meets the new set.
				err := p.unpipe(left)
				p.clearAnnounce()
				if err != nil {
					p.pipe.dirty = true
					p.fail(err)
					return false
				}
				return true
			}
			if werr != nil {
				p.clearAnnounce()
				p.pipe.dirty = true
				p.fail(werr)
				return false
			}
		}
		p.clearAnnounce()
		if n < readSize {
			p.bulk = false
			return true
		}
	}
}

// afterRead handles what a guardedRead on the no-fault path ended with
// other than bytes: ok is true when there are n > 0 bytes to forward,
// otherwise more is what splice must return.
func (p *pump) afterRead(n int, stale bool, err error) (more, ok bool) {
	switch {
	case stale || errors.Is(err, os.ErrDeadlineExceeded):
		return true, false // fault set changed: re-sync
	case err != nil:
		p.fail(err)
		return false, false
	case n == 0:
		p.sawEOF()
		p.closeWrite()
		return false, false
	}
	return true, true
}

// unpipe moves the n bytes in the pipe to the fault-aware loop's queue.
// They are there already, so the non-blocking reads never wait.
func (p *pump) unpipe(n int) error {
	data := make([]byte, n)
	for off := 0; off < n; {
		m, err := unix.Read(p.pipe.r, data[off:])
		if err == unix.EINTR {
			continue
		}
		if err != nil || m == 0 {
			return fmt.Errorf("relay %s: %s: take %d spliced bytes back from the pipe, got %d: %v", p.c.r.cfg.Name, p.dir, n, off, err)
		}
		off += m
	}
	p.hold(data)
	return nil
}
