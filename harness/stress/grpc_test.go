package stress

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// passCodec hands the fake node the raw messages.
type passCodec struct{}

func (passCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (passCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (passCodec) Name() string { return "tidal-ingest" }

// fakeIngest is a node's gRPC ingest stream as far as the generator can
// tell: it counts requests and their events, and acknowledges each.
type fakeIngest struct {
	mu       sync.Mutex
	requests int
	events   int
	tokens   map[string]int
}

func (f *fakeIngest) stream(_ any, ss grpc.ServerStream) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	f.mu.Lock()
	f.tokens[strings.Join(md.Get("authorization"), ",")]++
	f.mu.Unlock()
	for {
		var msg []byte
		if err := ss.RecvMsg(&msg); err != nil {
			return nil
		}
		f.mu.Lock()
		f.requests++
		f.events += int(binary.LittleEndian.Uint32(msg[9:]))
		f.mu.Unlock()
		ans := append([]byte{1}, msg[1:9]...)
		ans = binary.LittleEndian.AppendUint16(ans, 200)
		ans = append(ans, make([]byte, 8+8+8+4)...)
		if err := ss.SendMsg(&ans); err != nil {
			return err
		}
	}
}

// With GRPCTargets, signal writes go on the targets' ingest
// streams (with the token as metadata), reads stay HTTP, and the run
// records the protocol.
func TestGRPCTargetsCarryTheWrites(t *testing.T) {
	f := &fakeIngest{tokens: map[string]int{}}
	gs := grpc.NewServer(grpc.ForceServerCodec(passCodec{}))
	gs.RegisterService(&grpc.ServiceDesc{ServiceName: "tidal.v1.Ingest", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Stream", Handler: f.stream, ServerStreams: true, ClientStreams: true}}}, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	defer gs.Stop()
	var httpMu sync.Mutex
	httpPaths := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		drain(r)
		httpMu.Lock()
		httpPaths[r.Method+" "+strings.SplitN(r.URL.Path, "/", 3)[1]]++
		httpMu.Unlock()
		if r.Method == http.MethodGet {
			fmt.Fprint(w, `{}`)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	res, err := Run(context.Background(), Config{Targets: []string{srv.URL}, GRPCTargets: []string{lis.Addr().String()},
		Mix: MixMixed, Batch: 3, Token: "tok-0123456789abcdef", Seed: 1},
		[]Stage{{Rate: 300, Duration: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	checkBooks(t, res)
	st := res.Stages[0]
	f.mu.Lock()
	defer f.mu.Unlock()
	httpMu.Lock()
	defer httpMu.Unlock()
	if f.requests == 0 || f.events != 3*f.requests || httpPaths["POST v1"] != 0 || httpPaths["GET v1"] == 0 || int64(f.requests+httpPaths["GET v1"]) != st.OK {
		t.Fatalf("expected writes of 3 events on the stream and reads over HTTP, all ok: stream %d requests / %d events, HTTP %v, ok %d",
			f.requests, f.events, httpPaths, st.OK)
	}
	if f.tokens["Bearer tok-0123456789abcdef"] == 0 || len(f.tokens) != 1 {
		t.Fatalf("expected every stream opened with the token, found %v", f.tokens)
	}
	if res.Config.Protocol != "grpc ingest stream" {
		t.Fatalf("expected the protocol recorded, found %q", res.Config.Protocol)
	}
}
