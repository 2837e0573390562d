package api

import (
	"context"
	"errors"
	"io"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// Backend is what the HTTP API needs from a node. package server
// implements it; tests may fake it.
type Backend interface {
	Schema() ledger.Schema
	// WriteSignals stamps, replicates and applies a validated batch.
	WriteSignals(ctx context.Context, events []ledger.Event) (WriteAck, error)
	PutEmbedding(ctx context.Context, entity uint64, id string, vec []float32) (WriteAck, error)
	// CheckSignals is the read-only pre-check before proposing (id reuse).
	CheckSignals(events []ledger.Event) error
	// Barrier makes the next local read linearizable (ReadIndex) when asked.
	Barrier(ctx context.Context, linearizable bool) error
	// Read runs fn against the local applied state.
	Read(fn func(l *ledger.Ledger, v *vectors.Store, applied uint64))
	Digest() (applied uint64, digest string)
	Status() replica.Status
	// Ready returns nil when the node has a leader and has applied within
	// the configured distance of commit.
	Ready() error
	AddMember(ctx context.Context, m replica.Member) error
	RemoveMember(ctx context.Context, id uint64) error
	TransferLeader(ctx context.Context, to uint64) error
	Snapshot(ctx context.Context) (index, term uint64, err error)
	Backup(ctx context.Context, w io.Writer) (int64, error)
}

// WriteAck is where an acknowledged write landed.
type WriteAck struct {
	Index, Term, Node uint64
	Duplicates        int
}

// ErrQueueFull is returned (as 503) when the bounded in-flight write
// queue is full: shedding at the door keeps memory flat under overload.
var ErrQueueFull = errors.New("too many writes in flight on this node")
