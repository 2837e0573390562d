package ingest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

// fakeBackend is the node as the ingest path sees it: writes are
// recorded, and, while gate is set, held until it is closed. Methods the
// path never calls panic through the nil embedded interface.
type fakeBackend struct {
	api.Backend
	mu      sync.Mutex
	written [][]ledger.Event
	index   uint64
	gate    chan struct{} // nil: writes complete at once
	entered chan struct{} // receives one value per write that reached the backend
}

func (f *fakeBackend) Schema() ledger.Schema                    { return ledger.DefaultSchema() }
func (f *fakeBackend) CheckSignals(events []ledger.Event) error { return nil }
func (f *fakeBackend) Status() replica.Status {
	return replica.Status{ID: 1, Leader: 2, Members: []replica.MemberStatus{{Member: replica.Member{ID: 2, ClientAddr: "127.0.0.1:9002"}}}}
}

func (f *fakeBackend) WriteSignals(ctx context.Context, events []ledger.Event) (api.WriteAck, error) {
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return api.WriteAck{}, replica.ErrUnknownOutcome
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	f.written = append(f.written, append([]ledger.Event(nil), events...))
	return api.WriteAck{Index: f.index, Term: 3, Node: 1}, nil
}

func (f *fakeBackend) writes() [][]ledger.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]ledger.Event(nil), f.written...)
}

// serve starts the service over b on a loopback port and returns its
// address; everything stops when the test ends.
func serve(t *testing.T, b api.Backend, aopts api.Options, opts Options) string {
	t.Helper()
	_, in := api.NewWithIngest(b, aopts)
	s := New(in, opts)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return lis.Addr().String()
}

func dial(t *testing.T, addr string, opts ...client.Option) *client.IngestStream {
	t.Helper()
	s, err := client.NewIngestStream(addr, append([]client.Option{client.WithRetries(0), client.WithTimeout(time.Minute)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// Many writes in flight on one stream are each answered with their own
// acknowledgement, and reach the node's write path stamped and intact.
func TestStreamAcknowledgesEveryWrite(t *testing.T) {
	b := &fakeBackend{}
	s := dial(t, serve(t, b, api.Options{}, Options{}))
	const n = 50
	var wg sync.WaitGroup
	acks := make([]client.Ack, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			acks[i], errs[i] = s.WriteSignals(ctx(t), []client.Event{
				{ID: "w" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Entity: uint64(i + 1), Signal: "view"},
				{ID: "x" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Entity: uint64(i + 1), Signal: "like", Weight: 2.5, TS: ledger.MinTS + 1000},
			})
		})
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("write %d: %v", i, errs[i])
		}
		if acks[i].Term != 3 || acks[i].Node != 1 || acks[i].Seq == 0 || seen[acks[i].Seq] {
			t.Fatalf("write %d: ack %+v: expected term 3, node 1 and an index of its own", i, acks[i])
		}
		seen[acks[i].Seq] = true
	}
	w := b.writes()
	if len(w) != n {
		t.Fatalf("backend saw %d writes, expected %d", len(w), n)
	}
	for _, events := range w {
		if len(events) != 2 || events[0].Weight != 1 || events[0].TS == 0 || events[1].Weight != 2.5 || events[1].TS != ledger.MinTS+1000 || events[1].Signal != "like" {
			t.Fatalf("events reached the node as %+v: expected the default weight 1 and a stamped ts on the first, weight 2.5 and the given ts on the second", events)
		}
	}
}

// An invalid event is refused whole with 400 naming the field, in the
// HTTP API's terms, and nothing reaches the write path.
func TestInvalidEventNamesTheField(t *testing.T) {
	b := &fakeBackend{}
	s := dial(t, serve(t, b, api.Options{}, Options{}))
	for _, tc := range []struct {
		events []client.Event
		field  string
	}{
		{[]client.Event{{ID: "a", Entity: 1, Signal: "view"}, {ID: "b", Entity: 1, Signal: "view", Weight: -1}}, "events[1].weight"},
		{[]client.Event{{ID: "a", Entity: 1, Signal: "nope"}}, "events[0].signal"},
		{[]client.Event{{ID: "has space", Entity: 1, Signal: "view"}}, "events[0].id"},
		{[]client.Event{{ID: "a", Entity: 1, Signal: "view", TS: 42}}, "events[0].ts"},
		{nil, "events"},
	} {
		_, err := s.WriteSignals(ctx(t), tc.events)
		var ae *client.APIError
		if !errors.As(err, &ae) || !client.IsInvalid(err) || ae.Status != 400 || ae.Field != tc.field {
			t.Fatalf("events %+v: expected 400 invalid_argument naming %s, found %v", tc.events, tc.field, err)
		}
		if client.IsIndefinite(err) {
			t.Fatalf("a 400 is definite: %v", err)
		}
	}
	if w := b.writes(); len(w) != 0 {
		t.Fatalf("invalid batches reached the write path: %v", w)
	}
	// The stream survives refusals: a valid write still goes through.
	if _, err := s.WriteSignals(ctx(t), []client.Event{{ID: "ok", Entity: 1, Signal: "view"}}); err != nil {
		t.Fatal(err)
	}
}

// More events than --max-batch is 413, as over HTTP.
func TestBatchOverTheLimitIsTooLarge(t *testing.T) {
	s := dial(t, serve(t, &fakeBackend{}, api.Options{MaxBatch: 2}, Options{}))
	_, err := s.WriteSignals(ctx(t), []client.Event{{ID: "a", Entity: 1, Signal: "view"}, {ID: "b", Entity: 1, Signal: "view"}, {ID: "c", Entity: 1, Signal: "view"}})
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 413 || ae.Code != client.CodeTooLarge {
		t.Fatalf("expected 413 too_large, found %v", err)
	}
}

// A request over --max-body-bytes is 413 naming the request, as a body
// over it is over HTTP, and the stream carries on.
func TestRequestOverTheByteLimitIsTooLarge(t *testing.T) {
	b := &fakeBackend{}
	s := dial(t, serve(t, b, api.Options{MaxBodyBytes: 1024}, Options{}))
	var big []client.Event
	for i := range 20 {
		big = append(big, client.Event{ID: fmt.Sprintf("%0100d", i), Entity: 1, Signal: "view"})
	}
	_, err := s.WriteSignals(ctx(t), big)
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Status != 413 || ae.Code != client.CodeTooLarge || ae.Field != "request" || client.IsIndefinite(err) {
		t.Fatalf("a 2 KB request over a 1 KB limit: expected a definite 413 naming the request, found %v", err)
	}
	if _, err := s.WriteSignals(ctx(t), big[:1]); err != nil {
		t.Fatalf("the stream after a 413: %v", err)
	}
	if w := b.writes(); len(w) != 1 {
		t.Fatalf("expected only the small write applied, found %d", len(w))
	}
}

// Past MaxStreams a new stream is refused at open: the write on it is a
// definite 503, and the open streams carry on.
func TestStreamsPastTheNodeBoundAreRefused(t *testing.T) {
	addr := serve(t, &fakeBackend{}, api.Options{}, Options{MaxStreams: 1})
	first := dial(t, addr)
	if _, err := first.WriteSignals(ctx(t), []client.Event{{ID: "a", Entity: 1, Signal: "view"}}); err != nil {
		t.Fatal(err)
	}
	_, err := dial(t, addr).WriteSignals(ctx(t), []client.Event{{ID: "b", Entity: 1, Signal: "view"}})
	if !client.IsUnavailable(err) || client.IsIndefinite(err) {
		t.Fatalf("a second stream on a node bounded at 1: expected a definite 503, found %v", err)
	}
	if _, err := first.WriteSignals(ctx(t), []client.Event{{ID: "c", Entity: 1, Signal: "view"}}); err != nil {
		t.Fatalf("the open stream after a refusal: %v", err)
	}
}

func tokens(t *testing.T) *auth.Tokens {
	t.Helper()
	mk := func(name string, role auth.Role, secret string, line int) auth.Token {
		return auth.Token{Name: name, Role: role, Hash: sha256.Sum256([]byte(secret)), Line: line}
	}
	return auth.NewTokens([]auth.Token{mk("w", auth.Writer, "writer-secret-0123456789", 1), mk("r", auth.Reader, "reader-secret-0123456789", 2)})
}

// A stream without credentials is refused (401), one whose role is below
// writer too (403), before any request is taken; a writer's goes through.
func TestStreamNeedsAWriter(t *testing.T) {
	b := &fakeBackend{}
	addr := serve(t, b, api.Options{}, Options{Auth: true, Tokens: tokens(t)})
	ev := []client.Event{{ID: "a", Entity: 1, Signal: "view"}}

	_, err := dial(t, addr).WriteSignals(ctx(t), ev)
	if !client.IsUnauthenticated(err) || client.IsIndefinite(err) {
		t.Fatalf("no credentials: expected a definite 401, found %v", err)
	}
	_, err = dial(t, addr, client.WithToken("not-a-token-at-all-000")).WriteSignals(ctx(t), ev)
	if !client.IsUnauthenticated(err) {
		t.Fatalf("unknown token: expected 401, found %v", err)
	}
	_, err = dial(t, addr, client.WithToken("reader-secret-0123456789")).WriteSignals(ctx(t), ev)
	if !client.IsPermissionDenied(err) || client.IsIndefinite(err) {
		t.Fatalf("reader token: expected a definite 403, found %v", err)
	}
	if w := b.writes(); len(w) != 0 {
		t.Fatalf("refused streams reached the write path: %v", w)
	}
	if _, err := dial(t, addr, client.WithToken("writer-secret-0123456789")).WriteSignals(ctx(t), ev); err != nil {
		t.Fatalf("writer token: %v", err)
	}
}

// Over TLS with the node's certificates, a client certificate carries the
// role: writer passes, reader is refused, none is refused.
func TestStreamOverTLSWithClientCertificates(t *testing.T) {
	dir := t.TempDir()
	o := certs.CreateOptions{CertsDir: dir}
	if _, err := certs.CreateCA(o); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateNode(o, 1, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []auth.Role{auth.Reader, auth.Writer} {
		if _, err := certs.CreateClient(o, r.String(), r); err != nil {
			t.Fatal(err)
		}
	}
	store, err := certs.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, &fakeBackend{}, api.Options{}, Options{TLS: store.ServerTLS(), Auth: true})
	tlsFor := func(name string) client.Option {
		cfg, err := certs.ClientTLS(filepath.Clean(dir), name)
		if err != nil {
			t.Fatal(err)
		}
		return client.WithTLS(cfg)
	}
	ev := []client.Event{{ID: "a", Entity: 1, Signal: "view"}}
	if _, err := dial(t, addr, tlsFor("writer")).WriteSignals(ctx(t), ev); err != nil {
		t.Fatalf("writer certificate: %v", err)
	}
	if _, err := dial(t, addr, tlsFor("reader")).WriteSignals(ctx(t), ev); !client.IsPermissionDenied(err) {
		t.Fatalf("reader certificate: expected 403, found %v", err)
	}
	if _, err := dial(t, addr, tlsFor("")).WriteSignals(ctx(t), ev); !client.IsUnauthenticated(err) {
		t.Fatalf("no certificate: expected 401, found %v", err)
	}
	if _, err := dial(t, addr).WriteSignals(ctx(t), ev); err == nil {
		t.Fatal("a plaintext client reached a TLS ingest address")
	}
}

// Backpressure: past the per-stream bound a request is answered 503 with
// retry-after at once (not queued), and past the node-wide bound of
// writes in flight (--max-inflight-writes, shared with HTTP) too; the
// held writes complete once the node moves again.
func TestBackpressureShedsWithRetryableErrors(t *testing.T) {
	b := &fakeBackend{gate: make(chan struct{}), entered: make(chan struct{}, 16)}
	addr := serve(t, b, api.Options{MaxInflightWrites: 3}, Options{MaxInflightPerStream: 2})
	s := dial(t, addr)
	ev := func(id string) []client.Event { return []client.Event{{ID: id, Entity: 1, Signal: "view"}} }

	held := make(chan error, 3)
	for _, id := range []string{"h1", "h2"} {
		go func() { _, err := s.WriteSignals(ctx(t), ev(id)); held <- err }()
	}
	<-b.entered
	<-b.entered // both are waiting in the write path

	_, err := s.WriteSignals(ctx(t), ev("over-stream"))
	var ae *client.APIError
	if !errors.As(err, &ae) || !client.IsUnavailable(err) || ae.RetryAfter != time.Second || client.IsIndefinite(err) {
		t.Fatalf("third request on a stream bounded at 2: expected a definite 503 with retry-after 1s, found %v", err)
	}
	if ae.Message == "" || !containsLeader(ae.Message) {
		t.Fatalf("expected a leader hint in the 503, found %q", ae.Message)
	}

	// A second stream may take one more (node-wide bound 3) ...
	s2 := dial(t, addr)
	go func() { _, err := s2.WriteSignals(ctx(t), ev("h3")); held <- err }()
	<-b.entered
	// ... and the next one on it is shed by the node-wide bound.
	_, err = s2.WriteSignals(ctx(t), ev("over-node"))
	if !client.IsUnavailable(err) || client.IsIndefinite(err) {
		t.Fatalf("past --max-inflight-writes: expected a definite 503, found %v", err)
	}

	close(b.gate)
	for range 3 {
		if err := <-held; err != nil {
			t.Fatalf("held write: %v", err)
		}
	}
	if w := b.writes(); len(w) != 3 {
		t.Fatalf("expected the 3 held writes applied and no shed one, found %d", len(w))
	}
}

func containsLeader(msg string) bool {
	return len(msg) > 0 && (contains(msg, "leader: 127.0.0.1:9002"))
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// Shutdown answers what is in flight before the stream ends: a write held
// in the write path when the drain starts is acknowledged once the node
// moves, and Shutdown returns without cutting the stream.
func TestShutdownAnswersWritesInFlight(t *testing.T) {
	b := &fakeBackend{gate: make(chan struct{}), entered: make(chan struct{}, 4)}
	_, in := api.NewWithIngest(b, api.Options{})
	svc := New(in, Options{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go svc.Serve(lis)
	s := dial(t, lis.Addr().String())
	held := make(chan error, 2)
	for _, id := range []string{"d1", "d2"} {
		go func() {
			_, err := s.WriteSignals(ctx(t), []client.Event{{ID: id, Entity: 1, Signal: "view"}})
			held <- err
		}()
	}
	<-b.entered
	<-b.entered
	stopped := make(chan struct{})
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		svc.Shutdown(sctx)
		close(stopped)
	}()
	<-svc.drain // the drain has begun with both writes held
	close(b.gate)
	for range 2 {
		if err := <-held; err != nil {
			t.Fatalf("a write in flight at shutdown: expected its answer, found %v", err)
		}
	}
	<-stopped
	if sctx.Err() != nil {
		t.Fatal("Shutdown waited out its deadline: the stream was cut, not drained")
	}
	// The node no longer takes writes; a new one fails without having
	// been applied.
	_, err = s.WriteSignals(ctx(t), []client.Event{{ID: "late", Entity: 1, Signal: "view"}})
	if err == nil {
		t.Fatal("a write after shutdown was acknowledged")
	}
	if w := b.writes(); len(w) != 2 {
		t.Fatalf("expected the 2 held writes applied, found %d", len(w))
	}
}
