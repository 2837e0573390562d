package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tcp-relay/mesh"
	"github.com/tidaldb/tidal/tcp-relay/relay"
	"github.com/tidaldb/tidal/tidal-server/api"
)

func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

func startAPI(t *testing.T) (*Client, string) {
	s := NewServer(nil)
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); s.Close() })
	return NewClient(hs.URL, nil), hs.URL
}

func apiErr(t *testing.T, err error, status int, field string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("expected an API error %d, found %v", status, err)
	}
	if e.Status != status || (field != "" && e.Field != field) {
		t.Fatalf("expected %d naming field %q, found %v", status, field, e)
	}
}

func TestRelayLifecycleAndFaultThroughAPI(t *testing.T) {
	c, _ := startAPI(t)
	ctx := context.Background()
	if err := c.Healthz(ctx); err != nil {
		t.Fatal(err)
	}
	in, err := c.CreateRelay(ctx, RelayConfig{Name: "db", Listen: "127.0.0.1:0", Upstream: echoServer(t)})
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(in.Listen, ":0") {
		t.Fatalf("expected the bound port in the reply, found %s", in.Listen)
	}
	conn, err := net.Dial("tcp", in.Listen)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	roundTrip := func() error {
		conn.SetDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := conn.Write([]byte("x")); err != nil {
			return err
		}
		_, err := conn.Read(make([]byte, 1))
		return err
	}
	if err := roundTrip(); err != nil {
		t.Fatal(err)
	}
	ch, err := c.AddFault(ctx, "db", relay.Spec{Type: "blackhole"})
	if err != nil {
		t.Fatal(err)
	}
	if ch.Fault == nil || ch.Fault.Name != "blackhole_both" || ch.At.IsZero() {
		t.Fatalf("expected the added fault with its time, found %+v", ch)
	}
	if err := roundTrip(); err == nil {
		t.Fatal("expected the echo blocked by the blackhole added through the API")
	}
	fs, err := c.Faults(ctx, "db")
	if err != nil || len(fs) != 1 {
		t.Fatalf("expected one fault, found %v, %v", fs, err)
	}
	if _, err := c.RemoveFault(ctx, "db", "blackhole_both"); err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		t.Fatalf("expected the held byte after removal: %v", err)
	}
	m, err := c.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`tcprelay_connections_total{relay="db"} 1`, `tcprelay_bytes_total{direction="upstream",relay="db"}`, `tcprelay_faults_active{relay="db"} 0`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics: expected %q in\n%s", want, m)
		}
	}
	rs, err := c.Relays(ctx)
	if err != nil || len(rs) != 1 || rs[0].Name != "db" {
		t.Fatalf("expected relay db listed, found %v, %v", rs, err)
	}
	if err := c.DeleteRelay(ctx, "db"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Relay(ctx, "db")
	apiErr(t, err, 404, "")
}

func TestBadInput(t *testing.T) {
	c, base := startAPI(t)
	ctx := context.Background()
	up := echoServer(t)
	in, err := c.CreateRelay(ctx, RelayConfig{Name: "r", Listen: "127.0.0.1:0", Upstream: up})
	if err != nil {
		t.Fatal(err)
	}
	raw := func(method, path, body string) (int, string) {
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	cases := []struct {
		method, path, body string
		status             int
		field              string
	}{
		{"POST", "/relays", `{"name":`, 400, "body"},
		{"POST", "/relays", ``, 400, "body"},
		{"POST", "/relays", `{"name":"x","listen":"127.0.0.1:0","upstream":"` + up + `","colour":1}`, 400, "colour"},
		{"POST", "/relays", `{"name":5}`, 400, "name"},
		{"POST", "/relays", `{"listen":"127.0.0.1:0","upstream":"` + up + `"}`, 400, "name"},
		{"POST", "/relays", `{"name":"x","upstream":"` + up + `"}`, 400, "listen"},
		{"POST", "/relays", `{"name":"x","listen":"127.0.0.1:0"}`, 400, "upstream"},
		{"POST", "/relays", `{"name":"x","listen":"nope","upstream":"` + up + `"}`, 400, "listen"},
		{"POST", "/relays", `{"name":"a b","listen":"127.0.0.1:0","upstream":"` + up + `"}`, 400, "name"},
		{"POST", "/relays", `{"name":"r","listen":"127.0.0.1:0","upstream":"` + up + `"}`, 409, ""},
		{"POST", "/relays", `{"name":"y","listen":"` + in.Listen + `","upstream":"` + up + `"}`, 409, ""},
		{"GET", "/relays/nope", ``, 404, ""},
		{"DELETE", "/relays/nope", ``, 404, ""},
		{"GET", "/relays/nope/faults", ``, 404, ""},
		{"POST", "/relays/nope/faults", `{"type":"blackhole"}`, 404, ""},
		{"POST", "/relays/r/faults", `{"type":"gremlin"}`, 400, "type"},
		{"POST", "/relays/r/faults", `{"type":"latency","latency_ms":"slow"}`, 400, "latency_ms"},
		{"POST", "/relays/r/faults", `{"type":"latency","direction":"up"}`, 400, "direction"},
		{"POST", "/relays/r/faults", `{"type":"latency","toxicity":2}`, 400, "toxicity"},
		{"POST", "/relays/r/faults", `{"type":"bandwidth"}`, 400, "rate_bytes"},
		{"POST", "/relays/r/faults", `{"type":"bandwidth","rate_bytes":10,"bytes":3}`, 400, "bytes"},
		{"POST", "/relays/r/faults", `{"type":"blackhole","name":"mesh-partition"}`, 400, "name"},
		{"DELETE", "/relays/r/faults/nope", ``, 404, ""},
		{"DELETE", "/relays/nope/faults/x", ``, 404, ""},
		{"GET", "/mesh", ``, 404, ""},
		{"POST", "/mesh/heal", ``, 404, ""},
		{"POST", "/mesh", `{"nodes":{"a":{"peer":"` + up + `","client":"` + up + `"}}}`, 400, "nodes"},
		{"POST", "/mesh", `{"nodes":{"a":{"peer":"` + up + `"},"b":{"peer":"` + up + `","client":"` + up + `"}}}`, 400, "nodes.a.client"},
		{"GET", "/nope", ``, 404, ""},
		{"POST", "/relays", `{"name":"` + strings.Repeat("x", maxBody) + `"}`, 413, "body"},
	}
	// Regression: tcp-relay answered 400 "bad_request"
	// where tidal-server answers "invalid_argument"; both binaries now
	// speak one vocabulary, with "field" always present as the server's is.
	codes := map[int]string{400: api.CodeInvalid, 404: api.CodeNotFound, 409: api.CodeConflict, 413: api.CodeTooLarge}
	for _, tc := range cases {
		status, body := raw(tc.method, tc.path, tc.body)
		short := tc.body
		if len(short) > 80 {
			short = short[:80] + "..."
		}
		if status != tc.status || !strings.Contains(body, `"code": "`+codes[tc.status]+`"`) || !strings.Contains(body, `"message"`) ||
			!strings.Contains(body, `"field": "`+tc.field+`"`) {
			t.Errorf("%s %s %s: expected %d %s naming %q, found %d %s", tc.method, tc.path, short, tc.status, codes[tc.status], tc.field, status, body)
		}
	}
	// The same failures through the Go client.
	_, err = c.AddFault(ctx, "r", relay.Spec{Type: "latency", JitterMS: 5})
	apiErr(t, err, 400, "jitter_ms")
	_, err = c.CreateRelay(ctx, RelayConfig{Name: "z", Listen: in.Listen, Upstream: up})
	apiErr(t, err, 409, "")
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("expected the OS reason in the 409, found %v", err)
	}
}

func TestMeshRoutes(t *testing.T) {
	c, _ := startAPI(t)
	ctx := context.Background()
	nodes := map[string]mesh.Node{}
	for _, n := range []string{"a", "b", "c"} {
		up := echoServer(t)
		nodes[n] = mesh.Node{Peer: up, Client: up}
	}
	in, err := c.CreateMesh(ctx, MeshConfig{Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Nodes) != 3 || in.Nodes["a"].Peers["b"] == "" || in.Nodes["a"].ClientAddr == "" {
		t.Fatalf("expected addresses for 3 nodes, found %+v", in)
	}
	_, err = c.CreateMesh(ctx, MeshConfig{Nodes: nodes})
	apiErr(t, err, 409, "")
	_, err = c.Partition(ctx, PartitionRequest{Kind: "sideways"})
	apiErr(t, err, 400, "kind")
	_, err = c.Partition(ctx, PartitionRequest{Kind: "isolate"})
	apiErr(t, err, 400, "node")
	_, err = c.Partition(ctx, PartitionRequest{Kind: "isolate", Node: "z"})
	apiErr(t, err, 404, "")
	_, err = c.Partition(ctx, PartitionRequest{Kind: "groups", Groups: [][]string{{"a"}}})
	apiErr(t, err, 400, "groups")
	_, err = c.Partition(ctx, PartitionRequest{Kind: "majorities-ring"})
	apiErr(t, err, 400, "kind")

	ch, err := c.Partition(ctx, PartitionRequest{Kind: "isolate", Node: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := ch.Grudge["a"]; len(got) != 2 || ch.At.IsZero() {
		t.Fatalf("expected a cut from b and c, with a time, found %+v", ch)
	}
	conn, err := net.Dial("tcp", in.Nodes["a"].Peers["b"])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("x"))
	conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Fatal("expected a->b cut while a is isolated")
	}
	r, err := c.Relay(ctx, mesh.PeerRelayName("a", "b"))
	if err != nil || !r.Mesh || len(r.Faults) != 1 {
		t.Fatalf("expected mesh relay peer:a:b with the partition fault, found %+v, %v", r, err)
	}
	apiErr(t, c.DeleteRelay(ctx, r.Name), 409, "")
	if _, err := c.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		t.Fatalf("expected the held byte after heal: %v", err)
	}
	_, err = c.AddMeshFault(ctx, MeshFaultRequest{From: "a", Fault: relay.Spec{Type: "blackhole"}})
	apiErr(t, err, 400, "to")
	_, err = c.AddMeshFault(ctx, MeshFaultRequest{Fault: relay.Spec{Type: "latency", LatencyMS: -1}})
	apiErr(t, err, 400, "fault.latency_ms")
	if _, err := c.AddMeshFault(ctx, MeshFaultRequest{Fault: relay.Spec{Name: "slow", Type: "latency", LatencyMS: 5}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveMeshFault(ctx, "a", "b", "slow"); err != nil {
		t.Fatal(err)
	}
	_, err = c.RemoveMeshFault(ctx, "a", "b", "slow")
	apiErr(t, err, 404, "")
	if _, err := c.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	m, err := c.Mesh(ctx)
	if err != nil || len(m.Grudge) != 0 || len(m.History) < 3 {
		t.Fatalf("expected a healed mesh with history, found %+v, %v", m, err)
	}
	if err := c.DeleteMesh(ctx); err != nil {
		t.Fatal(err)
	}
	if rs, _ := c.Relays(ctx); len(rs) != 0 {
		t.Fatalf("expected no relays after deleting the mesh, found %d", len(rs))
	}
}

// TestErrorCodesAreTidalServers pins the shared vocabulary: every code
// tcp-relay can answer is tidal-server's code for the same condition,
// constant for constant.
func TestErrorCodesAreTidalServers(t *testing.T) {
	for ours, theirs := range map[string]string{
		CodeInvalid: api.CodeInvalid, CodeNotFound: api.CodeNotFound, CodeConflict: api.CodeConflict,
		CodeTooLarge: api.CodeTooLarge, CodeUnavailable: api.CodeUnavailable, CodeInternal: api.CodeInternal,
	} {
		if ours != theirs {
			t.Errorf("expected tcp-relay's code %q to be tidal-server's %q", ours, theirs)
		}
	}
	// A body that is not our JSON (a proxy's page) maps by status the way
	// tidal-server's client maps it.
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "bad gateway page", http.StatusBadRequest)
	}))
	defer hs.Close()
	_, err := NewClient(hs.URL, nil).Relays(context.Background())
	var e *Error
	if !errors.As(err, &e) || e.Code != api.CodeInvalid || e.Status != 400 {
		t.Errorf("expected a 400 invalid_argument from a non-JSON error body, found %v", err)
	}
}

// TestResetAfterCloseFails: Reset on a server whose relays were closed
// under it reports it instead of answering success.
func TestResetAfterCloseFails(t *testing.T) {
	s := NewServer(nil)
	up := echoServer(t)
	if _, err := s.AddRelay(RelayConfig{Name: "r", Listen: "127.0.0.1:0", Upstream: up}); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	r := s.relays["r"]
	s.mu.Unlock()
	r.Close()
	if _, err := s.Reset(); !errors.Is(err, relay.ErrClosed) {
		t.Errorf("expected Reset to report the closed relay, found %v", err)
	}
	if e := classify(fmt.Errorf("x: %w", relay.ErrClosed)); e.Status != http.StatusServiceUnavailable || e.Code != api.CodeUnavailable {
		t.Errorf("expected a closed relay to be 503 unavailable, found %v", e)
	}
	s.Close()
}

// The container backend creates the mesh of a relay container with every
// relay on the container's interfaces and the client relays on ports it
// published beforehand: host and client_ports travel through the API.
func TestMeshHostAndClientPorts(t *testing.T) {
	c, _ := startAPI(t)
	ctx := context.Background()
	nodes := map[string]mesh.Node{}
	for _, n := range []string{"a", "b"} {
		up := echoServer(t)
		nodes[n] = mesh.Node{Peer: up, Client: up}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	in, err := c.CreateMesh(ctx, MeshConfig{Nodes: nodes, Host: "127.0.0.2", ClientPorts: map[string]int{"b": port}})
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("127.0.0.2:%d", port); in.Nodes["b"].ClientAddr != want {
		t.Errorf("client relay of b: expected %s, found %s", want, in.Nodes["b"].ClientAddr)
	}
	if h, _, _ := net.SplitHostPort(in.Nodes["a"].Peers["b"]); h != "127.0.0.2" {
		t.Errorf("peer relay a->b: expected host 127.0.0.2, found %s", in.Nodes["a"].Peers["b"])
	}
	if err := c.DeleteMesh(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateMesh(ctx, MeshConfig{Nodes: nodes, ClientPorts: map[string]int{"z": port}})
	apiErr(t, err, 404, "")
}
