package certs

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/auth"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
)

// whoAmI answers health checks and records the member the mutual-TLS
// handshake authenticated, as the peer transport will.
type whoAmI struct {
	grpc_health_v1.UnimplementedHealthServer
	seen chan uint64
}

func (w *whoAmI) Check(ctx context.Context, _ *grpc_health_v1.HealthCheckRequest) (*grpc_health_v1.HealthCheckResponse, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, context.Canceled
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, context.Canceled
	}
	id, err := auth.MemberFromState(&info.State)
	if err != nil {
		return nil, err
	}
	w.seen <- id
	return &grpc_health_v1.HealthCheckResponse{Status: grpc_health_v1.HealthCheckResponse_SERVING}, nil
}

// The peer plane's configurations work as gRPC transport credentials
// (gRPC insists on ALPN h2), and the server learns the caller's member id
// from the connection.
func TestPeerPlaneOverGRPC(t *testing.T) {
	ca := newCA(t)
	n1, n2 := load(t, nodeDir(t, ca, 1)), load(t, nodeDir(t, ca, 2))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(n1.PeerServerTLS())))
	svc := &whoAmI{seen: make(chan uint64, 1)}
	grpc_health_v1.RegisterHealthServer(srv, svc)
	go srv.Serve(ln)
	defer srv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	call := func(cfg credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(cfg))
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{})
		return err
	}
	if err := call(credentials.NewTLS(n2.PeerClientTLS(1))); err != nil {
		t.Fatalf("member 2 calling member 1: %v", err)
	}
	if id := <-svc.seen; id != 2 {
		t.Errorf("server saw member %d; expected 2", id)
	}
	// Dialing for member 3 and finding member 1 fails the call.
	if err := call(credentials.NewTLS(n2.PeerClientTLS(3))); err == nil || !strings.Contains(err.Error(), "expected member 3") {
		t.Errorf("member 2 calling member 3 at member 1's address: %v; expected a refusal", err)
	}
}
