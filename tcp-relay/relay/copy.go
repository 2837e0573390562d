package relay

import (
	"errors"
	"os"
	"syscall"
)

// The small-message path: what a direction runs while no fault covers it
// and it carries messages smaller than a read buffer (requests, replies,
// raft traffic). Its cost is the relay's added round-trip time, so it does
// the least per message that keeps the package invariant:
//
//   - one read(2) and one write(2) per message (raw syscalls on Linux, see
//     copy_linux.go), and one read told EAGAIN before each wait, from a
//     buffer the pump keeps: no splice (its pipe costs more than a copy of
//     a few bytes), no allocation, no mutex, no timer;
//   - the whole loop runs inside one RawConn.Read of the source: no
//     closure, deadline or poller reset per message. It reads until
//     EAGAIN before it waits, as Go's own Read does. (Waiting after a
//     read that returned less than the buffer would save that read, but
//     the poller merges an edge that arrives while it wakes the reader
//     into the wake-up, and a read returns the data before a FIN or RST
//     without reporting them: a FIN or RST behind the last message would
//     never be seen. TestFINBehindDataIsForwarded caught that.)
//   - the write happens inside that callback, on the destination's
//     descriptor, and never waits there: if the destination is full the
//     callback returns and the rest is written outside it. Waiting for the
//     destination while holding the source (a reference that Close waits
//     for) could deadlock with shutdown, which closes the client before the
//     server.
//
// A read that fills the buffer means bulk data: the pump switches to
// splice (splice_linux.go) until a splice moves less than a buffer's worth.

// copyExit says why the small-message loop handed back to run.
type copyExit uint8

const (
	copyWait    copyExit = iota // no exit asked: the callback is waiting for data
	copyStale                   // the fault set changed: re-sync (bytes read are pending)
	copyBulk                    // a read filled the buffer: splice from now on
	copyPartial                 // the destination was full: p.cp.data is left to write
	copyEOF                     // the source sent FIN
	copyFailed                  // I/O error in p.cp.err
)

// copyState is the small-message loop's state between its callbacks; it
// lives in the pump so the callbacks, bound once, allocate nothing.
type copyState struct {
	exit copyExit
	err  error
	data []byte // not yet written
}

// copyLoop forwards small messages until the fault set changes, the
// direction switches to bulk, or it ends. It returns what run's loop body
// returns: false when the direction is finished.
func (p *pump) copyLoop() bool {
	if p.buf == nil {
		p.buf = readBufs.Get().(*[readSize]byte)[:]
	}
	for {
		p.cp = copyState{}
		err := p.srcRaw.Read(p.onReadable)
		switch p.cp.exit {
		case copyBulk, copyStale:
			return true
		case copyEOF:
			p.sawEOF()
			p.closeWrite()
			return false
		case copyFailed:
			p.fail(p.cp.err)
			return false
		case copyPartial:
			// The announcement made before the write still stands: finish
			// the message, off the source's lock.
			if !p.finishWrite() {
				return false
			}
			if p.cp.exit == copyStale {
				return true
			}
			continue
		}
		// Read returned by itself: a kick (deadline) or a closed socket.
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return true
		}
		p.fail(err)
		return false
	}
}

// readable is the source's RawConn.Read callback (bound once, in
// newPump). It returns true to leave the Read, false to wait for the next
// edge.
func (p *pump) readable(fd uintptr) bool {
	for {
		if !p.readOnce(int(fd)) {
			return p.cp.exit != copyWait
		}
	}
}

// readOnce reads and forwards one message. It returns false when the
// callback must return: with p.cp.exit set, or copyWait for EAGAIN.
func (p *pump) readOnce(fd int) bool {
	if !p.current() {
		p.cp.exit = copyStale
		return false
	}
	n, errno := readFD(fd, p.buf)
	switch {
	case errno == syscall.EAGAIN:
		return false
	case errno != 0:
		p.cp.exit, p.cp.err = copyFailed, errno
		return false
	case n == 0:
		p.cp.exit = copyEOF
		return false
	}
	if !p.announce() {
		// The read raced a fault change: the bytes belong to the new set.
		p.hold(append([]byte(nil), p.buf[:n]...))
		p.cp.exit = copyStale
		return false
	}
	p.cp.data = p.buf[:n]
	werr := p.dstRaw.Write(p.onWritable)
	written := n - len(p.cp.data)
	p.bytes.Add(uint64(written))
	switch {
	case werr != nil && errors.Is(werr, os.ErrDeadlineExceeded):
		// Kicked before the write: Apply is waiting for this message.
		p.unwritten()
		p.cp.exit = copyStale
		return false
	case werr != nil:
		p.clearAnnounce()
		p.cp.exit, p.cp.err = copyFailed, werr
		return false
	case p.cp.err != nil:
		p.clearAnnounce()
		p.cp.exit = copyFailed
		return false
	case len(p.cp.data) > 0:
		p.cp.exit = copyPartial // still announced: copyLoop finishes it
		return false
	}
	p.clearAnnounce()
	if n == len(p.buf) {
		p.bulk = true
		p.cp.exit = copyBulk
		return false
	}
	return true
}

// writable writes p.cp.data to the destination without waiting.
func (p *pump) writable(fd uintptr) bool {
	for len(p.cp.data) > 0 {
		m, errno := writeFD(int(fd), p.cp.data)
		switch {
		case errno == syscall.EAGAIN:
			return true // never wait here: see the file comment
		case errno != 0:
			p.cp.err = errno
			return true
		}
		p.cp.data = p.cp.data[m:]
	}
	return true
}

// finishWrite writes the rest of an announced message, waiting for the
// destination as long as the fault set stays; a kick (the set changed)
// leaves the rest to the new set. It returns false when the direction is
// finished.
func (p *pump) finishWrite() bool {
	n, err := p.dst.Write(p.cp.data)
	p.bytes.Add(uint64(n))
	p.cp.data = p.cp.data[n:]
	switch {
	case err == nil:
		p.clearAnnounce()
		p.cp.exit = copyWait
		return true
	case errors.Is(err, os.ErrDeadlineExceeded):
		p.unwritten()
		p.cp.exit = copyStale
		return true
	}
	p.clearAnnounce()
	p.fail(err)
	return false
}

// unwritten hands the unwritten rest of a message to the fault-aware loop
// (which meets the new fault set first) and withdraws the announcement.
func (p *pump) unwritten() {
	if len(p.cp.data) > 0 {
		p.hold(append([]byte(nil), p.cp.data...))
		p.cp.data = nil
	}
	p.clearAnnounce()
}
