package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/tidaldb/tidal/tidal-server/wal"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// snapJob is a state snapshot encoded by the apply goroutine, on its way
// to the snapshot goroutine that makes it durable.
type snapJob struct {
	index, term uint64
	cs          *raftpb.ConfState
	data        []byte
	// view, when set, is encoded on the snapshot goroutine after the
	// membership prefix already in data.
	view  SnapshotView
	reply chan snapshotResult // nil for a periodic snapshot
}

// startSnapshot runs on the apply goroutine, so the state it encodes is
// exactly the applied prefix; writing the file, the WAL mark and compacting
// happen on the snapshot goroutine while apply goes on. It returns false
// once the replica is halting. Snapshot framing: u32 len | membership JSON
// | state machine bytes.
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
	var view SnapshotView
	if err == nil {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(mem)))
		buf.Write(n[:])
		buf.Write(mem)
		if vsm, ok := r.sm.(ViewStateMachine); ok {
			// Only the freezing happens here; encoding is the snapshot
			// goroutine's (encodeView).
			if view, err = vsm.SnapshotView(); err != nil {
				err = fmt.Errorf("state machine snapshot view at %d: %w", index, err)
			}
		}
		if err == nil && view == nil {
			if err = r.sm.Snapshot(&buf); err != nil {
				err = fmt.Errorf("state machine snapshot at %d: %w", index, err)
			}
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
	case r.snapq <- snapJob{index: index, term: term, cs: cs, data: buf.Bytes(), view: view, reply: reply}:
		return true
	case <-r.stopc:
		return false
	}
}

// snapshotLoop makes encoded snapshots durable, one at a time.
func (r *Replica) snapshotLoop() {
	defer r.wg.Done()
	for {
		select {
		case j := <-r.snapq:
			start := time.Now()
			var idx, term uint64
			err := encodeView(&j)
			encoded := time.Since(start)
			if err == nil {
				idx, term, err = r.persistSnapshot(j)
			}
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
				r.log.Info("snapshot taken", "index", idx, "term", term, "bytes", len(j.data), "encode_took", encoded, "persist_took", time.Since(start)-encoded)
			}
		case <-r.stopc:
			return
		}
	}
}

// encodePace and encodePause pace the encoding of a view: a pause after
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

// pacedWriter calls sleep(pause) after every `every` bytes written to w.
type pacedWriter struct {
	w     io.Writer
	every int
	pause time.Duration
	sleep func(time.Duration)
	n     int
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += n
	for p.n >= p.every {
		p.n -= p.every
		p.sleep(p.pause)
	}
	return n, err
}

// encodeView appends j.view's encoding to j.data in one allocation of the
// exact final size (a buffer that doubles as it grows copies a large
// state several times, and each large allocation starts a GC cycle).
func encodeView(j *snapJob) error {
	if j.view == nil {
		return nil
	}
	size := j.view.Size()
	buf := bytes.NewBuffer(make([]byte, 0, int64(len(j.data))+size))
	buf.Write(j.data)
	n, err := j.view.WriteTo(&pacedWriter{w: buf, every: encodePace, pause: encodePause, sleep: time.Sleep})
	if err != nil {
		return fmt.Errorf("state machine snapshot at %d: %w", j.index, err)
	}
	if n != size || buf.Len() != len(j.data)+int(size) {
		return fmt.Errorf("state machine snapshot at %d: view wrote %d bytes, said %d", j.index, n, size)
	}
	j.data, j.view = buf.Bytes(), nil
	return nil
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
