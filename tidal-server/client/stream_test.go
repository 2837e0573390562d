package client

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcstatus "google.golang.org/grpc/status"
)

// fakeIngestNode serves tidal.v1.Ingest/Stream with handler, speaking the
// wire format by hand (independently of stream.go's encoder).
func fakeIngestNode(t *testing.T, handler func(ss grpc.ServerStream) error) string {
	t.Helper()
	gs := grpc.NewServer(grpc.ForceServerCodec(ingestCodec{}))
	gs.RegisterService(&grpc.ServiceDesc{ServiceName: "tidal.v1.Ingest", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Stream", ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error { return handler(ss) }}}}, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

func refusalAnswer(req []byte, status uint16, retryAfter uint16, code, field, msg string) []byte {
	b := append([]byte{1}, req[1:9]...)
	b = binary.LittleEndian.AppendUint16(b, status)
	b = binary.LittleEndian.AppendUint16(b, retryAfter)
	b = binary.LittleEndian.AppendUint64(b, 2)
	for _, s := range []string{code, field} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(msg)))
	b = append(b, msg...)
	b = binary.LittleEndian.AppendUint16(b, 0)
	return b
}

func streamTo(t *testing.T, addr string, opts ...Option) *IngestStream {
	t.Helper()
	s, err := NewIngestStream(addr, append([]Option{WithRetries(0), WithTimeout(time.Minute)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var oneEvent = []Event{{ID: "a", Entity: 1, Signal: "view"}}

// What a caller is told about each way a stream write can end — in the
// HTTP client's terms, so a history checker files it the same way.
func TestIngestStreamOutcomes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// 503 with retry-after: definite, the retry-after and code kept.
	addr := fakeIngestNode(t, func(ss grpc.ServerStream) error {
		for {
			var req []byte
			if err := ss.RecvMsg(&req); err != nil {
				return nil
			}
			ans := refusalAnswer(req, 503, 2, CodeUnavailable, "", "shed")
			if err := ss.SendMsg(&ans); err != nil {
				return err
			}
		}
	})
	_, err := streamTo(t, addr).WriteSignals(ctx, oneEvent)
	var ae *APIError
	if !errors.As(err, &ae) || !IsUnavailable(err) || ae.RetryAfter != 2*time.Second || IsIndefinite(err) {
		t.Fatalf("503: expected a definite unavailable error with retry-after 2s, found %v", err)
	}

	// The stream ends after the request was read, without an answer: the
	// write may have been applied.
	addr = fakeIngestNode(t, func(ss grpc.ServerStream) error {
		var req []byte
		ss.RecvMsg(&req)
		return grpcstatus.Error(codes.Internal, "node went away")
	})
	_, err = streamTo(t, addr).WriteSignals(ctx, oneEvent)
	if err == nil || !IsIndefinite(err) {
		t.Fatalf("stream cut after the request: expected an indefinite outcome, found %v", err)
	}

	// Refused at open (credentials): definite, as the HTTP API's 401.
	addr = fakeIngestNode(t, func(ss grpc.ServerStream) error {
		ss.SetTrailer(metadata.Pairs(refusedAtOpenTrailer, "1"))
		return grpcstatus.Error(codes.Unauthenticated, "credentials required")
	})
	_, err = streamTo(t, addr).WriteSignals(ctx, oneEvent)
	if !IsUnauthenticated(err) || IsIndefinite(err) {
		t.Fatalf("refused at open: expected a definite 401, found %v", err)
	}

	// Too many streams, refused at open: a definite 503.
	addr = fakeIngestNode(t, func(ss grpc.ServerStream) error {
		ss.SetTrailer(metadata.Pairs(refusedAtOpenTrailer, "1"))
		return grpcstatus.Error(codes.ResourceExhausted, "too many streams")
	})
	_, err = streamTo(t, addr).WriteSignals(ctx, oneEvent)
	if !IsUnavailable(err) || IsIndefinite(err) {
		t.Fatalf("refused at open, too many streams: expected a definite 503, found %v", err)
	}

	// The same code after the request was read, without the mark (gRPC's
	// own message limit ends a stream so): the write may have been taken.
	addr = fakeIngestNode(t, func(ss grpc.ServerStream) error {
		var req []byte
		ss.RecvMsg(&req)
		return grpcstatus.Error(codes.ResourceExhausted, "message larger than max")
	})
	_, err = streamTo(t, addr).WriteSignals(ctx, oneEvent)
	if err == nil || !IsIndefinite(err) {
		t.Fatalf("ResourceExhausted after the request was read: expected an indefinite outcome, found %v", err)
	}

	// Nobody listening: nothing was sent.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	_, err = streamTo(t, dead).WriteSignals(ctx, oneEvent)
	if err == nil || IsIndefinite(err) {
		t.Fatalf("no node: expected a definite failure, found %v", err)
	}

	// A 504 is retried (same events, a new request id); the retry's
	// answer is what the caller gets.
	attempts := 0
	addr = fakeIngestNode(t, func(ss grpc.ServerStream) error {
		for {
			var req []byte
			if err := ss.RecvMsg(&req); err != nil {
				return nil
			}
			attempts++
			var ans []byte
			if attempts == 1 {
				ans = refusalAnswer(req, 504, 0, CodeTimeout, "", "outcome unknown")
			} else {
				ans = append([]byte{1}, req[1:9]...)
				ans = binary.LittleEndian.AppendUint16(ans, 200)
				for _, v := range []uint64{9, 3, 2} {
					ans = binary.LittleEndian.AppendUint64(ans, v)
				}
				ans = binary.LittleEndian.AppendUint32(ans, 1)
			}
			if err := ss.SendMsg(&ans); err != nil {
				return err
			}
		}
	})
	ack, err := streamTo(t, addr, WithRetries(1), WithBackoff(time.Millisecond, time.Millisecond)).WriteSignals(ctx, oneEvent)
	if err != nil || ack.Seq != 9 || ack.Term != 3 || ack.Node != 2 || ack.Duplicates != 1 || ack.Attempts != 2 {
		t.Fatalf("504 then ok: expected the second attempt's ack (seq 9, term 3, node 2, 1 duplicate, 2 attempts), found %+v, %v", ack, err)
	}
}
