package server

import (
	"context"

	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// smBackend serves the API's reads from a bare StateMachine: the Read
// the nearest handler uses is StateMachine.Read, under its RWMutex, as on
// a node. Methods a nearest query does not call are left to the nil
// embedded Backend (calling one panics).
type smBackend struct {
	api.Backend
	sm *StateMachine
}

func (b smBackend) Schema() ledger.Schema                                { return b.sm.schema }
func (b smBackend) Barrier(ctx context.Context, linearizable bool) error { return nil }
func (b smBackend) Read(fn func(l *ledger.Ledger, v *vectors.Store, applied uint64)) {
	b.sm.Read(fn)
}
