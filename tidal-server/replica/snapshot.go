package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// snapJob is a state snapshot taken by the apply goroutine, on its way to
// the snapshot goroutine that makes it durable: encoded (data), or captured
// (encode: data holds the membership header, encode appends the state).
type snapJob struct {
	index, term uint64
	cs          *raftpb.ConfState
	data        []byte
	encode      func(io.Writer) error
	reply       chan snapshotResult // nil for a periodic snapshot
}

// startSnapshot runs on the apply goroutine, so the state it takes is
// exactly the applied prefix; with a SnapshotCapturer it only captures it,
// and encoding, writing the file, the WAL mark and compacting happen on
// the snapshot goroutine while apply goes on. It returns false once the
// replica is halting. Snapshot framing: u32 len | membership JSON | state
// machine bytes.
func (r *Replica) startSnapshot(reply chan snapshotResult) bool {
	r.appliedMu.Lock()
	index, term := r.applied, r.appliedTerm
	r.appliedMu.Unlock()
	if index == 0 || index <= r.snapIndex.Load() {
		if reply != nil {
			reply <- snapshotResult{index: r.snapIndex.Load(), term: term}
		}
		return true
	}
	r.mu.Lock()
	mem, err := r.members.marshal()
	cs := proto.Clone(r.confState).(*raftpb.ConfState)
	r.mu.Unlock()
	var buf bytes.Buffer
	var encode func(io.Writer) error
	if err == nil {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(mem)))
		buf.Write(n[:])
		buf.Write(mem)
		if c, ok := r.sm.(SnapshotCapturer); ok {
			encode, err = c.CaptureSnapshot()
		}
		if err == nil && encode == nil {
			err = r.sm.Snapshot(&buf)
		}
		if err != nil {
			err = fmt.Errorf("state machine snapshot at %d: %w", index, err)
		}
	}
	if err != nil {
		if reply != nil {
			reply <- snapshotResult{err: err}
		}
		r.halt(err)
		return false
	}
	if reply == nil {
		r.snapBusy.Store(true)
	}
	select {
	case r.snapq <- snapJob{index: index, term: term, cs: cs, data: buf.Bytes(), encode: encode, reply: reply}:
		return true
	case <-r.stopc:
		return false
	}
}

// snapshotLoop encodes captured snapshots and makes them durable, one at
// a time.
func (r *Replica) snapshotLoop() {
	defer r.wg.Done()
	for {
		select {
		case j := <-r.snapq:
			start := time.Now()
			var idx, term uint64
			err := r.encodeSnapshot(&j)
			encoded := time.Now()
			if err == nil {
				idx, term, err = r.persistSnapshot(j)
			}
			// The encoded bytes are raft storage's now (or dropped).
			r.snapEncoding.Store(0)
			if j.reply == nil {
				r.snapBusy.Store(false)
			} else {
				j.reply <- snapshotResult{idx, term, err}
			}
			if err != nil {
				r.halt(err)
				return
			}
			if idx == j.index {
				r.metrics.Snapshots.Inc()
				r.metrics.SnapshotSeconds.Observe(time.Since(start).Seconds())
				r.log.Info("snapshot taken", "index", idx, "term", term, "bytes", len(j.data), "encode_took", encoded.Sub(start), "persist_took", time.Since(encoded))
			}
		case <-r.stopc:
			return
		}
	}
}

// encodeSnapshot encodes a captured snapshot's state after its header.
func (r *Replica) encodeSnapshot(j *snapJob) error {
	if j.encode == nil {
		return nil
	}
	buf := bytes.NewBuffer(j.data)
	// Room for the previous snapshot and an eighth more: states grow, and
	// a buffer doubling its way up copies the snapshot again and again.
	if prev := r.snapBytes.Load(); prev > 0 {
		buf.Grow(int(prev + prev/8))
	}
	paced := &pacedBuffer{Buffer: buf, every: encodePace, pause: encodePause, sleep: time.Sleep, held: &r.snapEncoding}
	if err := j.encode(paced); err != nil {
		r.snapEncoding.Store(0)
		return fmt.Errorf("state machine snapshot at %d: %w", j.index, err)
	}
	j.data, j.encode = buf.Bytes(), nil
	r.snapEncoding.Store(int64(buf.Cap()))
	r.snapBytes.Store(int64(len(j.data)))
	return nil
}

// encodePace and encodePause pace the encoding of a snapshot: a pause after
// every encodePace bytes. Without them the encoder keeps a P busy for
// seconds; with GOMAXPROCS 2 and a GC cycle's dedicated mark worker on
// the other P, nothing then runs the timers on the worker's P — the Ready
// loop's ticker among them — until the cycle ends (golang/go#45632): the
// execution trace of a 131 MB snapshot showed the Ready loop waiting
// 1.9 s and 4.8 s for a 100 ms tick, each time exactly one GC mark phase,
// and followers starting elections. A sleeping encoder leaves its P idle,
// and an idle P runs other Ps' overdue timers.
const (
	encodePace  = 4 << 20
	encodePause = time.Millisecond
)

// pacedBuffer is a bytes.Buffer that calls sleep(pause) after every
// `every` bytes written to it. It keeps the buffer's Bytes and Len, so a
// state machine may patch what it wrote (server.encodeInto does).
type pacedBuffer struct {
	*bytes.Buffer
	every int
	pause time.Duration
	sleep func(time.Duration)
	n     int
	// held, when set, is told the buffer's capacity at every pause: the
	// memory an encoding in progress holds (Replica.SnapshotMemory).
	held *atomic.Int64
}

func (p *pacedBuffer) Write(b []byte) (int, error) {
	n, err := p.Buffer.Write(b)
	p.wrote(n)
	return n, err
}

func (p *pacedBuffer) WriteString(s string) (int, error) {
	n, err := p.Buffer.WriteString(s)
	p.wrote(n)
	return n, err
}

func (p *pacedBuffer) WriteByte(c byte) error {
	err := p.Buffer.WriteByte(c)
	p.wrote(1)
	return err
}

func (p *pacedBuffer) wrote(n int) {
	p.n += n
	for p.n >= p.every {
		p.n -= p.every
		if p.held != nil {
			p.held.Store(int64(p.Buffer.Cap()))
		}
		p.sleep(p.pause)
	}
}

// persistSnapshot writes the snapshot file (fsynced), then the WAL mark,
// then compacts raft's memory log and the WAL below it.
func (r *Replica) persistSnapshot(j snapJob) (uint64, uint64, error) {
	index, term := j.index, j.term
	r.snapMu.Lock()
	defer r.snapMu.Unlock()
	if index <= r.snapIndex.Load() {
		// A snapshot received from the leader overtook this one.
		return r.snapIndex.Load(), term, nil
	}
	snap, err := r.storage.CreateSnapshot(index, j.cs, j.data)
	if errors.Is(err, raft.ErrSnapOutOfDate) {
		return r.snapIndex.Load(), term, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("create snapshot at %d: %w", index, err)
	}
	r.snapHeld.Store(int64(cap(j.data)))
	if err := r.snaps.save(snap); err != nil {
		return 0, 0, err
	}
	if err := r.wal.Save(context.Background(), wal.Batch{Snapshot: &wal.SnapshotMark{Index: index, Term: term}}, true); err != nil {
		return 0, 0, fmt.Errorf("record snapshot mark: %w", err)
	}
	if index > r.cfg.SnapshotCatchUp {
		if err := r.storage.Compact(index - r.cfg.SnapshotCatchUp); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return 0, 0, fmt.Errorf("compact raft log: %w", err)
		}
	}
	// Entries at or below the snapshot are never read back from the WAL:
	// a restart starts from this snapshot.
	if err := r.wal.Compact(index + 1); err != nil {
		return 0, 0, fmt.Errorf("compact WAL below %d: %w", index+1, err)
	}
	r.snapIndex.Store(index)
	return index, term, nil
}

func (r *Replica) restoreSnapshot(snap *raftpb.Snapshot) error {
	data := snap.GetData()
	if len(data) < 4 {
		return fmt.Errorf("snapshot at index %d: %d bytes, too short for its header", snap.GetMetadata().GetIndex(), len(data))
	}
	n := binary.BigEndian.Uint32(data)
	if uint64(n)+4 > uint64(len(data)) {
		return fmt.Errorf("snapshot at index %d: membership length %d exceeds %d bytes", snap.GetMetadata().GetIndex(), n, len(data))
	}
	mem, err := unmarshalMembership(data[4 : 4+n])
	if err != nil {
		return err
	}
	if err := r.sm.Restore(bytes.NewReader(data[4+n:])); err != nil {
		return fmt.Errorf("restore state machine from snapshot %d: %w", snap.GetMetadata().GetIndex(), err)
	}
	r.mu.Lock()
	r.members = mem
	r.confState = proto.Clone(snap.GetMetadata().GetConfState()).(*raftpb.ConfState)
	r.mu.Unlock()
	for _, m := range mem.Members {
		r.setPeer(m.ID, m.PeerAddr)
	}
	md := snap.GetMetadata()
	r.setApplied(md.GetIndex(), md.GetTerm())
	return nil
}
