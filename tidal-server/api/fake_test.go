package api

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// fakeBackend is a one-node Backend without a log: writes are applied to
// a real ledger and vector store at once, so reads through the handler
// see real aggregates. Tests steer it with the hook fields and count the
// write calls to prove that rejected input never reached it.
type fakeBackend struct {
	schema ledger.Schema

	mu      sync.Mutex
	led     *ledger.Ledger
	vec     *vectors.Store
	index   uint64
	barrier []bool // linearizable flag of every Barrier call
	batches [][]ledger.Event

	// writeCalls counts WriteSignals and PutEmbedding calls; checkCalls
	// CheckSignals calls.
	writeCalls atomic.Int64
	checkCalls atomic.Int64

	// onWrite, when set, runs at the start of WriteSignals and
	// PutEmbedding; a non-nil error is returned instead of writing.
	onWrite func(ctx context.Context) error
	// barrierErr is returned by Barrier when set.
	barrierErr error
	readyErr   error
	adminErr   error
	members    []replica.Member
	removed    []uint64
	transfers  []uint64
	backup     string
	backupErr  error  // returned after writing backup
	onBackup   func() // runs after writing backup
}

func newFake(schema ledger.Schema) *fakeBackend {
	return &fakeBackend{
		schema: schema,
		led:    ledger.New(schema, ledger.Options{}),
		vec:    vectors.New(schema.EmbeddingDim),
	}
}

// testSchema is the default signals with a small embedding dimension, so
// tests can write vectors by hand.
func testSchema() ledger.Schema {
	s := ledger.DefaultSchema()
	s.EmbeddingDim = 4
	return s
}

func (f *fakeBackend) Schema() ledger.Schema { return f.schema }

func (f *fakeBackend) WriteSignals(ctx context.Context, events []ledger.Event) (WriteAck, error) {
	f.writeCalls.Add(1)
	if f.onWrite != nil {
		if err := f.onWrite(ctx); err != nil {
			return WriteAck{}, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	res, err := f.led.Apply(f.index+1, 1, events)
	if err != nil {
		return WriteAck{}, err
	}
	f.batches = append(f.batches, events)
	f.index++
	return WriteAck{Index: f.index, Term: 1, Node: 7, Duplicates: res.Duplicates}, nil
}

func (f *fakeBackend) PutEmbedding(ctx context.Context, entity uint64, id string, vec []float32) (WriteAck, error) {
	f.writeCalls.Add(1)
	if f.onWrite != nil {
		if err := f.onWrite(ctx); err != nil {
			return WriteAck{}, err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.vec.Put(entity, vec); err != nil {
		return WriteAck{}, err
	}
	f.index++
	f.led.SetApplied(f.index)
	return WriteAck{Index: f.index, Term: 1, Node: 7}, nil
}

func (f *fakeBackend) CheckSignals(events []ledger.Event) error {
	f.checkCalls.Add(1)
	return f.led.Check(events)
}

func (f *fakeBackend) Barrier(ctx context.Context, linearizable bool) error {
	f.mu.Lock()
	f.barrier = append(f.barrier, linearizable)
	f.mu.Unlock()
	return f.barrierErr
}

func (f *fakeBackend) Read(fn func(l *ledger.Ledger, v *vectors.Store, applied uint64)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.led, f.vec, f.index)
}

func (f *fakeBackend) Digest() (uint64, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.index, f.led.Digest()
}

func (f *fakeBackend) Status() replica.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return replica.Status{ID: 7, Leader: 7, Term: 1, Commit: f.index, Applied: f.index, Role: "leader",
		Members: []replica.MemberStatus{{Member: replica.Member{ID: 7, PeerAddr: "127.0.0.1:7071", ClientAddr: "127.0.0.1:7070"},
			Role: "leader", Match: f.index, Reachable: true}}}
}

func (f *fakeBackend) Ready() error { return f.readyErr }

func (f *fakeBackend) AddMember(ctx context.Context, m replica.Member) error {
	if f.adminErr != nil {
		return f.adminErr
	}
	f.members = append(f.members, m)
	return nil
}

func (f *fakeBackend) RemoveMember(ctx context.Context, id uint64) error {
	if f.adminErr != nil {
		return f.adminErr
	}
	f.removed = append(f.removed, id)
	return nil
}

func (f *fakeBackend) TransferLeader(ctx context.Context, to uint64) error {
	if f.adminErr != nil {
		return f.adminErr
	}
	f.transfers = append(f.transfers, to)
	return nil
}

func (f *fakeBackend) Snapshot(ctx context.Context) (uint64, uint64, error) {
	if f.adminErr != nil {
		return 0, 0, f.adminErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.index, 1, nil
}

func (f *fakeBackend) Backup(ctx context.Context, w io.Writer) (int64, error) {
	if f.adminErr != nil {
		return 0, f.adminErr
	}
	n, err := io.WriteString(w, f.backup)
	if f.onBackup != nil {
		f.onBackup()
	}
	if err == nil {
		err = f.backupErr
	}
	return int64(n), err
}

// applied reports how many events the ledger folded and the applied index:
// both stay 0 when nothing was written.
func (f *fakeBackend) applied() (events int, index uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	err := f.led.AuditEvents(func(ledger.Location) error { events++; return nil })
	if err != nil {
		panic(err)
	}
	return events, f.index
}

var errBoom = errors.New("boom")
