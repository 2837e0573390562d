package peer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// waitFor is how long a test waits for a condition on this shared, loaded
// machine before it gives up. Never an assertion about speed.
const waitFor = 2 * time.Minute

// eventually polls cond until it holds or waitFor passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", waitFor, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recorder is an Inbound that keeps what reaches raft.
type recorder struct {
	mu          sync.Mutex
	msgs        []*raftpb.Message
	sizes       []int
	unreachable []uint64
	snapReports map[uint64][]bool
	removedBy   []uint64
	// onReceive, when set, runs at the start of every Receive.
	onReceive func()
}

func newRecorder() *recorder { return &recorder{snapReports: map[uint64][]bool{}} }

func (r *recorder) Receive(_ context.Context, data []byte) error {
	if r.onReceive != nil {
		r.onReceive()
	}
	m := &raftpb.Message{}
	if err := proto.Unmarshal(data, m); err != nil {
		return err
	}
	// Keep the header only: snapshot data would pin memory the tests
	// measure.
	if m.Snapshot != nil {
		m.Snapshot.Data = nil
	}
	r.mu.Lock()
	r.msgs = append(r.msgs, m)
	r.sizes = append(r.sizes, len(data))
	r.mu.Unlock()
	return nil
}

func (r *recorder) ReportUnreachable(id uint64) {
	r.mu.Lock()
	r.unreachable = append(r.unreachable, id)
	r.mu.Unlock()
}

func (r *recorder) ReportSnapshot(id uint64, ok bool) {
	r.mu.Lock()
	r.snapReports[id] = append(r.snapReports[id], ok)
	r.mu.Unlock()
}

// MemberStatus: the tests give the transport its view through
// Options.Membership or the address book, never through the recorder.
func (r *recorder) MemberStatus(uint64) (current, removed bool) { return false, false }

func (r *recorder) ReportRemoved(by uint64) {
	r.mu.Lock()
	r.removedBy = append(r.removedBy, by)
	r.mu.Unlock()
}

func (r *recorder) removalReports() []uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.removedBy...)
}

func (r *recorder) received() []*raftpb.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*raftpb.Message(nil), r.msgs...)
}

func (r *recorder) receivedSizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.sizes...)
}

func (r *recorder) snapshotReports(id uint64) []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bool(nil), r.snapReports[id]...)
}

// members is a fixed membership view: listed ids are current, removed
// ones removed, the rest unknown.
func members(current []uint64, removed ...uint64) func(uint64) MemberStatus {
	return func(id uint64) MemberStatus {
		for _, c := range current {
			if c == id {
				return MemberCurrent
			}
		}
		for _, r := range removed {
			if r == id {
				return MemberRemoved
			}
		}
		return MemberUnknown
	}
}

type node struct {
	id   uint64
	t    *Transport
	in   *recorder
	addr string
}

// startNode runs a transport for id on a real 127.0.0.1 socket, stopped
// in cleanup.
func startNode(t *testing.T, id uint64, opts Options) *node {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if opts.SpoolDir == "" {
		opts.SpoolDir = filepath.Join(t.TempDir(), "spool")
	}
	in := newRecorder()
	tr, err := New(id, in, opts, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		lis.Close()
		t.Fatal(err)
	}
	go tr.Serve(lis)
	t.Cleanup(tr.Stop)
	return &node{id: id, t: tr, in: in, addr: lis.Addr().String()}
}

// pki is a cluster CA in a temporary directory.
type pki struct {
	dir string
}

func newPKI(t testing.TB) pki {
	t.Helper()
	dir := t.TempDir()
	if _, err := certs.CreateCA(certs.CreateOptions{CertsDir: dir}); err != nil {
		t.Fatal(err)
	}
	return pki{dir: dir}
}

// nodeDir makes a certs directory for member id: the CA's ca.crt and a
// node.crt/key signed by the CA.
func (p pki) nodeDir(t testing.TB, id uint64) string {
	t.Helper()
	dir := t.TempDir()
	ca, err := os.ReadFile(filepath.Join(p.dir, certs.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, certs.CACertFile), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	o := certs.CreateOptions{CertsDir: dir, CAKey: filepath.Join(p.dir, certs.CAKeyFile)}
	if _, err := certs.CreateNode(o, id, []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func (p pki) store(t testing.TB, id uint64) *certs.Store {
	t.Helper()
	s, err := certs.Load(p.nodeDir(t, id))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// secured is opts with mutual TLS as member id of p.
func (p pki) secured(t testing.TB, id uint64, opts Options) Options {
	s := p.store(t, id)
	opts.ServerTLS, opts.ClientTLS = s.PeerServerTLS(), s.PeerClientTLS
	return opts
}

// attackerTLS presents the certificate in dir (whatever CA signed it) and
// does not check the server: the server's refusal is what is tested.
func attackerTLS(t *testing.T, dir string) *tls.Config {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}, InsecureSkipVerify: true}
	if dir != "" {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, certs.NodeCertFile), filepath.Join(dir, certs.NodeKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg
}

// rawClient dials addr as an arbitrary client would: TLS with cfg, or
// plaintext when cfg is nil.
func rawClient(t *testing.T, addr string, cfg *tls.Config) *grpc.ClientConn {
	t.Helper()
	creds := insecure.NewCredentials()
	if cfg != nil {
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func marshal(t testing.TB, m *raftpb.Message) []byte { return mustMarshal(t, m) }

func mustMarshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sendMessages sends one batch on a Messages stream and waits for the
// server to acknowledge the stream's end, which it does only after
// handling every message of the batch (delivered or dropped): the
// caller can then look at what happened without waiting on time.
func sendMessages(ctx context.Context, conn *grpc.ClientConn, msgs ...[]byte) error {
	ctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	st, err := conn.NewStream(ctx, messagesDesc, "/"+serviceName+"/"+methodMessages)
	if err != nil {
		return err
	}
	batch := encodeBatch(msgs)
	if err := st.SendMsg(&batch); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	var ack []byte
	return st.RecvMsg(&ack)
}

// expectToldRemoved checks that a stream carrying a removed member's
// message was ended with the answer that tells it so.
func expectToldRemoved(t *testing.T, err error, id uint64) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), fmt.Sprintf("member %d was removed", id)) {
		t.Fatalf("expected the stream ended with FailedPrecondition \"member %d was removed\", found %v", id, err)
	}
}

func heartbeat(from, to, term uint64) *raftpb.Message {
	return &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(term)}
}

func dropped(tr *Transport, reason string) int {
	return int(value(tr.metrics.messagesDropped.WithLabelValues(reason)))
}

// value reads a counter or gauge.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// series counts the label combinations a vector has seen.
func series(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}

type replicaOutbound = replica.Outbound

func itoa(id uint64) string { return strconv.FormatUint(id, 10) }
