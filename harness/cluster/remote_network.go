package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tcp-relay/mesh"
	"github.com/tidaldb/tidal/tcp-relay/relay"
)

// Network is the relay mesh every peer and client link crosses, as the
// cluster and the nemesis use it. *mesh.Mesh (in-process relays) and
// RemoteNetwork (a standalone tcp-relay behind its control API) both
// provide it; a change returns once it acts on existing connections.
type Network interface {
	Nodes() []string
	// PeerAddr is where from dials to reach to's peer listener.
	PeerAddr(from, to string) (string, error)
	// ClientAddr is where clients dial node.
	ClientAddr(node string) (string, error)
	Partition(groups ...[]string) (mesh.Change, error)
	Isolate(node string) (mesh.Change, error)
	OneWay(from, to string) (mesh.Change, error)
	Bridge(order ...string) (mesh.Change, error)
	MajoritiesRing(order ...string) (mesh.Change, error)
	Heal() (mesh.Change, error)
	AddLinkFault(from, to string, f relay.Fault) (mesh.Change, error)
	RemoveLinkFault(from, to, name string) (mesh.Change, error)
	// Reset removes every fault and heals. A remote reset can fail (the
	// relay's control API unreachable, or answering 500); then faults may
	// remain, and the error says so.
	Reset() (mesh.Change, error)
	Close() error
}

var (
	_ Network = (*mesh.Mesh)(nil)
	_ Network = (*RemoteNetwork)(nil)
)

// remoteCallTimeout bounds one control API call. The relay is on
// loopback; a call that takes this long means the relay process is wedged.
const remoteCallTimeout = 10 * time.Second

// RemoteNetwork drives a mesh that already exists in a tcp-relay process,
// through its control API. It starts nothing: the caller runs the process
// and creates the mesh (POST /mesh), then hands over the reply. Addresses
// are fixed at creation, so they are answered from that reply.
type RemoteNetwork struct {
	api  *control.Client
	info control.MeshInfo
	log  *slog.Logger
}

// NewRemoteNetwork wraps the mesh described by info, served at api.
func NewRemoteNetwork(api *control.Client, info control.MeshInfo, log *slog.Logger) *RemoteNetwork {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RemoteNetwork{api: api, info: info, log: log}
}

// Nodes returns the mesh's node names, sorted.
func (r *RemoteNetwork) Nodes() []string {
	var out []string
	for n := range r.info.Nodes {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (r *RemoteNetwork) PeerAddr(from, to string) (string, error) {
	if a, ok := r.info.Nodes[from].Peers[to]; ok {
		return a, nil
	}
	return "", fmt.Errorf("remote mesh: no peer relay %s->%s (nodes %v): %w", from, to, r.Nodes(), mesh.ErrUnknownNode)
}

func (r *RemoteNetwork) ClientAddr(node string) (string, error) {
	if n, ok := r.info.Nodes[node]; ok {
		return n.ClientAddr, nil
	}
	return "", fmt.Errorf("remote mesh: no client relay for %s (nodes %v): %w", node, r.Nodes(), mesh.ErrUnknownNode)
}

func (r *RemoteNetwork) partition(req control.PartitionRequest) (mesh.Change, error) {
	return call(func(ctx context.Context) (mesh.Change, error) { return r.api.Partition(ctx, req) })
}

func (r *RemoteNetwork) Partition(groups ...[]string) (mesh.Change, error) {
	return r.partition(control.PartitionRequest{Kind: "groups", Groups: groups})
}

func (r *RemoteNetwork) Isolate(node string) (mesh.Change, error) {
	return r.partition(control.PartitionRequest{Kind: "isolate", Node: node})
}

func (r *RemoteNetwork) OneWay(from, to string) (mesh.Change, error) {
	return r.partition(control.PartitionRequest{Kind: "oneway", From: from, To: to})
}

func (r *RemoteNetwork) Bridge(order ...string) (mesh.Change, error) {
	return r.partition(control.PartitionRequest{Kind: "bridge", Order: order})
}

func (r *RemoteNetwork) MajoritiesRing(order ...string) (mesh.Change, error) {
	return r.partition(control.PartitionRequest{Kind: "majorities-ring", Order: order})
}

func (r *RemoteNetwork) Heal() (mesh.Change, error) {
	return call(r.api.Heal)
}

func (r *RemoteNetwork) AddLinkFault(from, to string, f relay.Fault) (mesh.Change, error) {
	return call(func(ctx context.Context) (mesh.Change, error) {
		return r.api.AddMeshFault(ctx, control.MeshFaultRequest{From: from, To: to, Fault: f.Spec()})
	})
}

func (r *RemoteNetwork) RemoveLinkFault(from, to, name string) (mesh.Change, error) {
	return call(func(ctx context.Context) (mesh.Change, error) { return r.api.RemoveMeshFault(ctx, from, to, name) })
}

func (r *RemoteNetwork) Reset() (mesh.Change, error) {
	ch, err := call(func(ctx context.Context) (mesh.Change, error) {
		fc, err := r.api.Reset(ctx)
		return mesh.Change{Op: "reset", At: fc.At}, err
	})
	if err != nil {
		return mesh.Change{}, fmt.Errorf("remote mesh: reset: %w; faults may remain", err)
	}
	return ch, nil
}

// Close deletes the mesh and its relays in the tcp-relay process.
func (r *RemoteNetwork) Close() error {
	_, err := call(func(ctx context.Context) (struct{}, error) { return struct{}{}, r.api.DeleteMesh(ctx) })
	return err
}

func call[T any](f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(context.Background(), remoteCallTimeout)
	defer cancel()
	v, err := f(ctx)
	if notSent(err) {
		return v, fmt.Errorf("%w: %w", ErrNotSent, err)
	}
	return v, sentinel(err)
}

// ErrNotSent says a control request never reached the relay: no
// connection to its control API could be made, so the change it asked
// for certainly did not happen (the nemesis records such a fault as
// failed, not as of unknown outcome). A request that was sent and then
// failed — a timeout, a 500 — may have acted, and is not ErrNotSent.
var ErrNotSent = errors.New("remote mesh: control request not sent")

// notSent reports whether err is a failure to connect: the request was
// never written.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// sentinel restores the mesh and relay errors the API flattened into
// status codes, so callers' errors.Is checks (a rejected shape is "not
// applied"; a missing fault is already healed) read the same in and out of
// process. The API message carries the original error's text.
func sentinel(err error) error {
	var e *control.Error
	if !errors.As(err, &e) {
		return err
	}
	for _, s := range []error{mesh.ErrUnknownNode, mesh.ErrBadShape, relay.ErrNoFault, relay.ErrFaultExists} {
		if strings.Contains(e.Message, s.Error()) {
			return fmt.Errorf("%w: %w", s, err)
		}
	}
	return err
}
