package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"sync"
	"time"

	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/bugs"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// node implements api.Backend over a replica and the state machine.
type node struct {
	id          uint64
	schema      ledger.Schema
	sm          *StateMachine
	r           *replica.Replica
	readyWithin uint64

	// digestPace paces the digests served (see Digest).
	digestPace struct {
		mu   sync.Mutex
		next time.Time // under mu: when the next digest may start
	}
}

// minDigestGap is the least time between the end of one served digest
// and the start of the next: at most about 100 a second per node, far
// more than any auditor needs, whatever each costs.
const minDigestGap = 10 * time.Millisecond

var _ api.Backend = (*node)(nil)

func (n *node) Schema() ledger.Schema { return n.schema }

func (n *node) CheckSignals(events []ledger.Event) error {
	var err error
	n.sm.Read(func(l *ledger.Ledger, _ *vectors.Store, _ uint64) { err = l.Check(events) })
	return err
}

// WriteSignals replicates a validated, stamped batch.
func (n *node) WriteSignals(ctx context.Context, events []ledger.Event) (api.WriteAck, error) {
	for i := range events {
		if events[i].TS == 0 {
			return api.WriteAck{}, fmt.Errorf("events[%d] reached the log unstamped", i)
		}
	}
	a, err := n.r.Propose(ctx, encodeSignals(events))
	if err != nil {
		return api.WriteAck{}, err
	}
	res, _ := a.Result.(SignalsResult)
	if res.Err != nil {
		return api.WriteAck{}, res.Err
	}
	return api.WriteAck{Index: a.Index, Term: a.Term, Node: n.id, Duplicates: res.Duplicates}, nil
}

func (n *node) PutEmbedding(ctx context.Context, entity uint64, id string, vec []float32) (api.WriteAck, error) {
	a, err := n.r.Propose(ctx, encodeEmbedding(embeddingPut{ID: id, Entity: entity, Vector: vec}))
	if err != nil {
		return api.WriteAck{}, err
	}
	res, _ := a.Result.(EmbeddingResult)
	if res.Err != nil {
		return api.WriteAck{}, res.Err
	}
	dup := 0
	if res.Duplicate {
		dup = 1
	}
	return api.WriteAck{Index: a.Index, Term: a.Term, Node: n.id, Duplicates: dup}, nil
}

func (n *node) Barrier(ctx context.Context, linearizable bool) error {
	if !linearizable || bugs.Active(bugs.LocalLinearizableReads) {
		return nil
	}
	_, err := n.r.ReadIndex(ctx)
	return err
}

func (n *node) Read(fn func(l *ledger.Ledger, v *vectors.Store, applied uint64)) { n.sm.Read(fn) }

// Digest serves the state machine's digest, paced: one at a time, and the
// next starts no sooner than the last one's duration, and at least
// minDigestGap, after it ended. The lock is no longer what a digest costs
// apply (StateMachine.Digest hashes outside it); the CPU is, so clients
// looping on the digest keep at most half of one core busy, and far less
// when digests are cheap (remembered parts): then the gap bounds how many
// requests a second a loop makes. A lone call is never delayed.
func (n *node) Digest() (uint64, string) {
	p := &n.digestPace
	p.mu.Lock()
	defer p.mu.Unlock()
	if wait := time.Until(p.next); wait > 0 {
		time.Sleep(wait)
	}
	start := time.Now()
	applied, d := n.sm.Digest()
	p.next = time.Now().Add(max(time.Since(start), minDigestGap))
	return applied, d
}

func (n *node) Status() replica.Status { return n.r.Status() }

func (n *node) Ready() error {
	if err := n.r.Err(); err != nil {
		return err
	}
	st := n.r.Status()
	if st.Leader == 0 {
		return fmt.Errorf("no leader known (term %d)", st.Term)
	}
	if st.Commit > st.Applied+n.readyWithin {
		return fmt.Errorf("applied index %d is %d behind commit %d (ready within %d)", st.Applied, st.Commit-st.Applied, st.Commit, n.readyWithin)
	}
	return nil
}

func (n *node) AddMember(ctx context.Context, m replica.Member) error { return n.r.AddMember(ctx, m) }
func (n *node) RemoveMember(ctx context.Context, id uint64) error     { return n.r.RemoveMember(ctx, id) }
func (n *node) TransferLeader(ctx context.Context, to uint64) error {
	return n.r.TransferLeader(ctx, to)
}
func (n *node) Snapshot(ctx context.Context) (uint64, uint64, error) { return n.r.Snapshot(ctx) }

// A backup is
//
//	"TIDALBAK" | u32 crc32c(state) | u64 len(state) | state
//
// where state is the state machine's snapshot (which records its applied
// index). `tidal-server restore` turns it into a new single-node data dir.
const backupMagic = "TIDALBAK"

func (n *node) Backup(ctx context.Context, w io.Writer) (int64, error) {
	var buf bytes.Buffer
	if err := n.sm.Snapshot(&buf); err != nil {
		return 0, err
	}
	return writeBackup(w, buf.Bytes())
}

func writeBackup(w io.Writer, state []byte) (int64, error) {
	head := make([]byte, 8+4+8)
	copy(head, backupMagic)
	binary.LittleEndian.PutUint32(head[8:], crc32.Checksum(state, crc32.MakeTable(crc32.Castagnoli)))
	binary.LittleEndian.PutUint64(head[12:], uint64(len(state)))
	n1, err := w.Write(head)
	if err != nil {
		return int64(n1), err
	}
	n2, err := w.Write(state)
	return int64(n1 + n2), err
}

// ReadBackup checks a backup's framing and checksum and returns the state
// snapshot inside it.
func ReadBackup(data []byte) ([]byte, error) {
	if len(data) < 20 || string(data[:8]) != backupMagic {
		return nil, fmt.Errorf("not a tidal backup: expected magic %q at offset 0", backupMagic)
	}
	want := binary.LittleEndian.Uint32(data[8:])
	size := binary.LittleEndian.Uint64(data[12:])
	state := data[20:]
	if uint64(len(state)) != size {
		return nil, fmt.Errorf("backup truncated: header says %d bytes of state, found %d", size, len(state))
	}
	if got := crc32.Checksum(state, crc32.MakeTable(crc32.Castagnoli)); got != want {
		return nil, fmt.Errorf("backup checksum mismatch: header %08x, data %08x", want, got)
	}
	return state, nil
}
