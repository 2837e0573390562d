package ingest

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/auth"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
	"github.com/tidaldb/tidal/tidal-server/ledger"
)

// counter reads one series of a counter vector from reg (0 when absent).
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// writeTokens writes a tokens file of name -> (role, secret).
func writeTokens(t *testing.T, path string, toks map[string][2]string) {
	t.Helper()
	var b strings.Builder
	for name, rs := range toks {
		fmt.Fprintf(&b, "%s %s %s\n", name, rs[0], auth.HashSecret(rs[1]))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// serveService is serve, returning the Service too.
func serveService(t *testing.T, b api.Backend, opts Options) (*Service, string) {
	t.Helper()
	_, in := api.NewWithIngest(b, api.Options{})
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
	return s, lis.Addr().String()
}

// A stream is authenticated at open; Recheck (run on SIGHUP once the
// tokens file is re-read) asks again. A stream whose token was removed
// stops taking requests at once — one sent now is a definite 401 naming
// why — answers the write it had in flight (taken while the token was
// good), and ends; one whose token was lowered to reader ends
// PermissionDenied; one whose token is unchanged carries on, the same
// stream. A new stream with the removed token is refused at open.
func TestRecheckEndsStreamsWhoseCredentialsWentAway(t *testing.T) {
	const (
		s1, s2, s3 = "first-writer-secret-0123", "second-writer-secret-012", "third-writer-secret-0123"
	)
	path := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, path, map[string][2]string{"w1": {"writer", s1}, "w2": {"writer", s2}, "w3": {"writer", s3}})
	toks, err := auth.LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	// Each write waits for a value on gate: the first three are let
	// through at once, the fourth is held.
	b := &fakeBackend{gate: make(chan struct{}, 3), entered: make(chan struct{}, 16)}
	for range 3 {
		b.gate <- struct{}{}
	}
	svc, addr := serveService(t, b, Options{Auth: true, Tokens: toks, Registry: reg})
	removed, lowered, kept := dial(t, addr, client.WithToken(s1)), dial(t, addr, client.WithToken(s2)), dial(t, addr, client.WithToken(s3))
	for i, s := range []*client.IngestStream{removed, lowered, kept} {
		if _, err := s.WriteSignals(ctx(t), []client.Event{{ID: fmt.Sprintf("open-%d", i), Entity: 1, Signal: "view"}}); err != nil {
			t.Fatalf("stream %d before the reload: %v", i, err)
		}
	}
	if n := svc.Recheck(); n != 0 {
		t.Fatalf("Recheck with every token good ended %d streams", n)
	}

	// A write in flight on the stream whose token goes.
	for range 3 {
		<-b.entered
	}
	held := make(chan error, 1)
	go func() {
		_, err := removed.WriteSignals(ctx(t), []client.Event{{ID: "in-flight", Entity: 1, Signal: "view"}})
		held <- err
	}()
	<-b.entered

	writeTokens(t, path, map[string][2]string{"w2": {"reader", s2}, "w3": {"writer", s3}})
	if err := toks.Reload(); err != nil {
		t.Fatal(err)
	}
	if n := svc.Recheck(); n != 2 {
		t.Fatalf("Recheck after removing one writer token and lowering another ended %d streams, expected 2", n)
	}
	// The stream is still answering its write in flight, and takes
	// nothing more.
	_, err = removed.WriteSignals(ctx(t), []client.Event{{ID: "after-removal", Entity: 1, Signal: "view"}})
	if !client.IsUnauthenticated(err) || client.IsIndefinite(err) || !strings.Contains(err.Error(), `token "w1" this stream opened with are no longer valid`) {
		t.Fatalf("a write on the open stream whose token was removed: expected a definite 401 saying the stream's token is no longer valid, found %v", err)
	}
	close(b.gate)
	if err := <-held; err != nil {
		t.Fatalf("the write in flight when the token went: expected its acknowledgement, found %v", err)
	}
	_, err = removed.WriteSignals(ctx(t), []client.Event{{ID: "new-stream", Entity: 1, Signal: "view"}})
	if !client.IsUnauthenticated(err) || client.IsIndefinite(err) {
		t.Fatalf("a new stream with the removed token: expected a definite 401, found %v", err)
	}
	_, err = lowered.WriteSignals(ctx(t), []client.Event{{ID: "lowered", Entity: 1, Signal: "view"}})
	if !client.IsPermissionDenied(err) || client.IsIndefinite(err) {
		t.Fatalf("a write with the token lowered to reader: expected a definite 403, found %v", err)
	}
	if _, err := kept.WriteSignals(ctx(t), []client.Event{{ID: "kept", Entity: 1, Signal: "view"}}); err != nil {
		t.Fatalf("the stream whose token stayed: %v", err)
	}
	for _, w := range b.writes() {
		for _, e := range w {
			if e.ID == "after-removal" || e.ID == "new-stream" || e.ID == "lowered" {
				t.Fatalf("refused write %q reached the write path", e.ID)
			}
		}
	}
	if u, p := counter(t, reg, "tidal_ingest_streams_ended_total", "reason", "unauthenticated"), counter(t, reg, "tidal_ingest_streams_ended_total", "reason", "permission_denied"); u != 1 || p != 1 {
		t.Fatalf("tidal_ingest_streams_ended_total: unauthenticated %v, permission_denied %v; expected 1 and 1 (the kept stream was not ended)", u, p)
	}
}

// A stream opened with a client certificate is ended by Recheck once the
// certificate no longer verifies (VerifyClientCert, the node's CA bundle
// as reloaded).
func TestRecheckEndsStreamsWhoseCertificateNoLongerVerifies(t *testing.T) {
	dir, store := testCerts(t)
	var revoked atomic.Bool
	reg := prometheus.NewRegistry()
	svc, addr := serveService(t, &fakeBackend{}, Options{TLS: store.ServerTLS(), Auth: true, Registry: reg,
		VerifyClientCert: func(chain []*x509.Certificate) error {
			if revoked.Load() {
				return errors.New("certificate not signed by any CA in ca.crt")
			}
			return store.VerifyClient(chain)
		}})
	s := dial(t, addr, clientTLS(t, dir, "writer"))
	if _, err := s.WriteSignals(ctx(t), []client.Event{{ID: "a", Entity: 1, Signal: "view"}}); err != nil {
		t.Fatal(err)
	}
	if n := svc.Recheck(); n != 0 {
		t.Fatalf("Recheck with the certificate good ended %d streams", n)
	}
	revoked.Store(true)
	if n := svc.Recheck(); n != 1 {
		t.Fatalf("Recheck with the certificate no longer verifying ended %d streams, expected 1", n)
	}
	if got := counter(t, reg, "tidal_ingest_streams_ended_total", "reason", "unauthenticated"); got != 1 {
		t.Fatalf("tidal_ingest_streams_ended_total{reason=unauthenticated} = %v, expected 1", got)
	}
}

// slowBackend takes delay over each write, so that a stream ending has
// writes in flight.
type slowBackend struct {
	*fakeBackend
	delay time.Duration
}

func (b *slowBackend) WriteSignals(ctx context.Context, events []ledger.Event) (api.WriteAck, error) {
	time.Sleep(b.delay)
	return b.fakeBackend.WriteSignals(ctx, events)
}

// A stream reaches its age: the node tells the client, keeps taking what
// was already sent for the grace, answers what is in flight and ends.
// The client moves to a new stream without counting a retry (it is given
// none here), so every write is acknowledged, and each reaches the write
// path exactly once: none lost, none doubled by the reconnects.
func TestMaxStreamAgeReconnectsWithoutLossOrDoubles(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := &slowBackend{fakeBackend: &fakeBackend{}, delay: 80 * time.Millisecond}
	_, addr := serveService(t, b, Options{MaxStreamAge: 150 * time.Millisecond, MaxStreamAgeGrace: 50 * time.Millisecond, Registry: reg})
	s := dial(t, addr) // no retries
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	deadline := time.Now().Add(time.Second)
	for w := range 16 {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline) || counter(t, reg, "tidal_ingest_streams_ended_total", "reason", "max_age") < 3; i++ {
				if _, err := s.WriteSignals(ctx(t), []client.Event{{ID: fmt.Sprintf("w%d-%d", w, i), Entity: uint64(w), Signal: "view"}}); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d writes failed across stream ages; first: %v", n, firstErr.Load())
	}
	seen := map[string]int{}
	for _, w := range b.writes() {
		for _, e := range w {
			seen[e.ID]++
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("write %s reached the write path %d times, expected once", id, n)
		}
	}
	if got := counter(t, reg, "tidal_ingest_streams_ended_total", "reason", "max_age"); got < 3 {
		t.Fatalf("tidal_ingest_streams_ended_total{reason=max_age} = %v, expected streams ended by age", got)
	}
	t.Logf("%d writes over %v of streams aged at 150ms", len(seen), counter(t, reg, "tidal_ingest_streams_ended_total", "reason", "max_age"))
}

// testCerts makes a CA, a node certificate for 127.0.0.1 and a writer's
// client certificate, and loads the node's store.
func testCerts(t *testing.T) (string, *certs.Store) {
	t.Helper()
	dir := t.TempDir()
	o := certs.CreateOptions{CertsDir: dir}
	if _, err := certs.CreateCA(o); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateNode(o, 1, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.CreateClient(o, "writer", auth.Writer); err != nil {
		t.Fatal(err)
	}
	store, err := certs.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, store
}

func clientTLS(t *testing.T, dir, name string) client.Option {
	t.Helper()
	cfg, err := certs.ClientTLS(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return client.WithTLS(cfg)
}

// A stream opened with a client certificate ends when the certificate
// expires, SIGHUP or not.
func TestStreamEndsWhenItsCertificateExpires(t *testing.T) {
	dir, store := testCerts(t)
	const life = 5 * time.Second
	if _, err := certs.CreateClient(certs.CreateOptions{CertsDir: dir, Lifetime: life, Overwrite: true}, "shortlived", auth.Writer); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	_, addr := serveService(t, &fakeBackend{}, Options{TLS: store.ServerTLS(), Auth: true, Registry: reg, VerifyClientCert: store.VerifyClient})
	s := dial(t, addr, clientTLS(t, dir, "shortlived"))
	if _, err := s.WriteSignals(ctx(t), []client.Event{{ID: "a", Entity: 1, Signal: "view"}}); err != nil {
		t.Fatalf("a write before the certificate expires: %v", err)
	}
	deadline := time.Now().Add(time.Minute) // a deadlock detector, not a timing bound
	for counter(t, reg, "tidal_ingest_streams_ended_total", "reason", "unauthenticated") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("expected the stream opened with a certificate valid for %v ended once it expired; still open a minute later", life)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
