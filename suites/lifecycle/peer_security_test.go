package lifecycle

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The peer plane under attack, on real processes: a
// 3-node cluster made as README's "A secure cluster" makes it (the
// tidal-server certs CLI, one certs directory per node, the CA key kept
// apart), and a forger that speaks the peer plane's gRPC with a raw
// client built here: service tidal.peer.Raft, method Messages, batches of
// u32 count | count × (u32 length | marshalled raftpb.Message), big-endian
// (see tidal-server/peer).

// peerCluster is three tidal-server processes started by hand, so a spec
// can give one node flags of its own and knows every pid.
type peerCluster struct {
	dir     string
	caKey   string
	clients string // ca.crt, client.admin.crt/key, client.writer.crt/key
	secured bool
	flags   []string
	members []*peerMember
	admin   map[uint64]*client.Client
	writer  map[uint64]*client.Client
}

type peerMember struct {
	id         uint64
	clientAddr string
	peerAddr   string
	dir        string // certs/, data/, node.log
	proc       *node
	flags      []string // this node's own flags, after the cluster's
	// unready: the node is expected to fail /readyz (its clock is off),
	// so settling does not wait for it to be ready.
	unready bool
}

func (m *peerMember) certs() string   { return filepath.Join(m.dir, "certs") }
func (m *peerMember) data() string    { return filepath.Join(m.dir, "data") }
func (m *peerMember) logFile() string { return filepath.Join(m.dir, "node.log") }
func (m *peerMember) pid() int        { return m.proc.cmd.Process.Pid }

// peerSpecFlags widen the election timeout to 2s: the specs assert that
// term and leader do not move, and on this loaded machine a 500ms timeout
// sometimes elapses on its own.
var peerSpecFlags = []string{"--tick-interval=100ms", "--election-ticks=20"}

// newPeerCluster makes the certificates with the CLI and starts three
// nodes; secured false runs plaintext on loopback (the control case).
// extra maps a member id to flags of its own.
func newPeerCluster(name string, secured bool, flags []string, extra map[uint64][]string) *peerCluster {
	dir := specDir(name)
	c := &peerCluster{dir: dir, caKey: filepath.Join(dir, "ca.key"), clients: filepath.Join(dir, "certs"), secured: secured,
		flags: append(append([]string{}, peerSpecFlags...), flags...), admin: map[uint64]*client.Client{}, writer: map[uint64]*client.Client{}}
	addrs := freeAddrs(6)
	var peers []string
	for i := range 3 {
		own := extra[uint64(i+1)]
		m := &peerMember{id: uint64(i + 1), clientAddr: addrs[2*i], peerAddr: addrs[2*i+1], dir: filepath.Join(dir, fmt.Sprintf("n%d", i+1)),
			flags: own, unready: strings.Contains(strings.Join(own, " "), "--test-clock-offset")}
		c.members = append(c.members, m)
		peers = append(peers, fmt.Sprintf("%d=%s", m.id, m.peerAddr))
	}
	c.flags = append(c.flags, "--peers", strings.Join(peers, ","))
	if secured {
		cli := func(args ...string) {
			out, code := tidalServer(args...)
			Expect(code).To(Equal(0), "tidal-server %s:\n%s", strings.Join(args, " "), out)
		}
		cli("certs", "create-ca", "--certs-dir", c.clients, "--ca-key", c.caKey)
		for _, m := range c.members {
			c.nodeCerts(m.certs(), m.id)
		}
		for _, role := range []string{"admin", "writer"} {
			cli("certs", "create-client", role, "--role", role, "--certs-dir", c.clients, "--ca-key", c.caKey)
		}
	}
	for _, m := range c.members {
		c.start(m, m.flags...)
	}
	c.waitSettled()
	return c
}

// nodeCerts makes dir hold ca.crt and a node certificate for member id
// signed by the cluster's CA (what an operator, or a thief of the CA key,
// would make with the CLI).
func (c *peerCluster) nodeCerts(dir string, id uint64) string {
	Expect(os.MkdirAll(dir, 0o700)).To(Succeed())
	ca, err := os.ReadFile(filepath.Join(c.clients, certs.CACertFile))
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(dir, certs.CACertFile), ca, 0o644)).To(Succeed())
	out, code := tidalServer("certs", "create-node", "--id", fmt.Sprint(id), "--host", "127.0.0.1,localhost", "--certs-dir", dir, "--ca-key", c.caKey)
	Expect(code).To(Equal(0), out)
	return dir
}

// start runs member m with the cluster's flags and then own.
func (c *peerCluster) start(m *peerMember, own ...string) {
	m.flags = own
	m.unready = strings.Contains(strings.Join(own, " "), "--test-clock-offset")
	args := runArgs(int(m.id), m.clientAddr, m.peerAddr, m.data(), append(append([]string{"--log-file", m.logFile()}, c.flags...), own...)...)
	if c.secured {
		args = append(args, "--certs-dir", m.certs())
	}
	m.proc = startNode(-1, args...)
	var opts []client.Option
	wopts := []client.Option{client.WithRetries(0), client.WithTimeout(10 * time.Second)}
	if c.secured {
		admin, err := certs.ClientTLS(c.clients, "admin")
		Expect(err).NotTo(HaveOccurred())
		writer, err := certs.ClientTLS(c.clients, "writer")
		Expect(err).NotTo(HaveOccurred())
		opts = append(opts, client.WithTLS(admin))
		wopts = append(wopts, client.WithTLS(writer))
	}
	c.admin[m.id] = client.New(m.clientAddr, append(opts, client.WithRetries(2), client.WithTimeout(10*time.Second))...)
	c.writer[m.id] = client.New(m.clientAddr, wopts...)
	DeferCleanup(c.admin[m.id].CloseIdleConnections)
	DeferCleanup(c.writer[m.id].CloseIdleConnections)
}

// stop stops m with SIGTERM and waits for a clean exit.
func (c *peerCluster) stop(m *peerMember) { m.proc.stop() }

func (c *peerCluster) member(id uint64) *peerMember { return c.members[id-1] }

// running are the members whose process has not exited.
func (c *peerCluster) running() []*peerMember {
	var out []*peerMember
	for _, m := range c.members {
		select {
		case <-m.proc.exited:
		default:
			out = append(out, m)
		}
	}
	return out
}

// nodeState is what must not move under a forger: a node's term, leader,
// commit and applied index, and the digest of its state.
type nodeState struct {
	Term, Leader, Commit, Applied uint64
	Digest                        string
}

func (c *peerCluster) state(m *peerMember) nodeState {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.admin[m.id].Status(ctx)
	Expect(err).NotTo(HaveOccurred(), "status of member %d", m.id)
	d, err := c.admin[m.id].Digest(ctx)
	Expect(err).NotTo(HaveOccurred(), "digest of member %d", m.id)
	return nodeState{Term: st.Term, Leader: st.Leader, Commit: st.Commit, Applied: d.AppliedIndex, Digest: d.Digest}
}

// waitSettled waits until every running node is ready and they agree (one
// leader and term, commit = applied, one digest at one index, every
// member's client address published: the cluster writes nothing of its
// own from then on) and returns that state.
func (c *peerCluster) waitSettled() nodeState {
	var agreed nodeState
	Eventually(func(g Gomega) {
		var first *nodeState
		for _, m := range c.running() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := c.admin[m.id].Ready(ctx)
			st, serr := c.admin[m.id].Status(ctx)
			cancel()
			if !m.unready {
				g.Expect(err).NotTo(HaveOccurred(), "member %d ready", m.id)
			}
			g.Expect(serr).NotTo(HaveOccurred())
			for _, mem := range st.Members {
				g.Expect(mem.ClientAddr).NotTo(BeEmpty(), "member %d's client address published", mem.ID)
			}
			s := c.state(m)
			g.Expect(s.Leader).NotTo(BeZero())
			g.Expect(s.Applied).To(Equal(s.Commit), "member %d applied everything it knows committed", m.id)
			if first == nil {
				first = &s
				continue
			}
			g.Expect(s).To(Equal(*first), "member %d agrees with the others", m.id)
		}
		agreed = *first
	}).WithTimeout(90 * time.Second).WithPolling(250 * time.Millisecond).Should(Succeed())
	return agreed
}

// expectUnchanged checks that every running node still holds the state
// before.
func (c *peerCluster) expectUnchanged(before nodeState) {
	for _, m := range c.running() {
		Expect(c.state(m)).To(Equal(before), "member %d's term, leader, commit, applied index and digest moved", m.id)
	}
}

// expectWorks writes through every running node, then checks that every
// write w ever saw acknowledged is on every running node exactly once and
// that they agree on one digest.
func (c *peerCluster) expectWorks(w *fixture.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, m := range c.running() {
		before := len(w.Acked())
		Eventually(func() int {
			w.WriteOne(ctx, fmt.Sprint(m.id), c.writer[m.id])
			return len(w.Acked())
		}).WithTimeout(60*time.Second).WithPolling(100*time.Millisecond).Should(BeNumerically(">", before), "a write through member %d: %s", m.id, w.Summary())
	}
	c.waitSettled()
	for _, m := range c.running() {
		rep, err := w.Check(ctx, fmt.Sprint(m.id), c.admin[m.id])
		Expect(err).NotTo(HaveOccurred())
		Expect(rep.OK()).To(BeTrue(), rep.String())
		Expect(rep.Present).To(BeNumerically(">=", len(w.Acked())), rep.String())
	}
}

// metric reads one sample of member m's /metrics ("name" or
// `name{label="value"}`); 0 when the series does not exist yet.
func (c *peerCluster) metric(m *peerMember, series string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	text, err := c.admin[m.id].Metrics(ctx)
	Expect(err).NotTo(HaveOccurred())
	for _, line := range strings.Split(string(text), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			Expect(err).NotTo(HaveOccurred(), line)
			return f
		}
	}
	return 0
}

func dropsOf(reason string) string {
	return fmt.Sprintf(`tidal_peer_messages_dropped_total{reason=%q}`, reason)
}

// forger speaks the peer plane with whatever credentials it holds.
type forger struct {
	conn *grpc.ClientConn
}

// newForger dials addr presenting the node certificate in certsDir ("":
// none), or in plaintext when plaintext is set. It checks nothing of the
// server: the server's refusal is what the specs test.
func newForger(addr, certsDir string, plaintext bool) *forger {
	creds := insecure.NewCredentials()
	if !plaintext {
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, NextProtos: []string{"h2"}, InsecureSkipVerify: true}
		if certsDir != "" {
			pair, err := tls.LoadX509KeyPair(filepath.Join(certsDir, certs.NodeCertFile), filepath.Join(certsDir, certs.NodeKeyFile))
			Expect(err).NotTo(HaveOccurred())
			cfg.Certificates = []tls.Certificate{pair}
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(conn.Close)
	return &forger{conn: conn}
}

const raftService = "/tidal.peer.Raft/"

// send sends msgs as one batch on a Messages stream and waits for the
// server's acknowledgement of the stream's end, which it gives only once
// it handled (delivered or dropped) every message.
func (f *forger) send(msgs ...*raftpb.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := f.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, raftService+"Messages")
	if err != nil {
		return err
	}
	batch := binary.BigEndian.AppendUint32(nil, uint32(len(msgs)))
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		Expect(err).NotTo(HaveOccurred())
		batch = binary.BigEndian.AppendUint32(batch, uint32(len(b)))
		batch = append(batch, b...)
	}
	if err := st.SendMsg(&batch); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	var ack []byte
	return st.RecvMsg(&ack)
}

// rawCodec passes bytes through, as the peer plane's codec does.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append((*v.(*[]byte))[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "tidal-raw" }

func heartbeatMsg(from, to, term uint64) *raftpb.Message {
	return &raftpb.Message{Type: raftpb.MsgHeartbeat.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(term)}
}

// appendMsg is a MsgApp from `from` to `to` at term carrying one entry at
// index+1 that writes the event id, and committing it: what a leader
// sends. The entry is framed as tidal-server frames a proposal
// (replica.go: version 1 | origin u64 | request u64, big-endian; then
// command.go's signals command, little-endian), so a node that admitted
// the message would apply the event.
func appendMsg(from, to, term, index uint64, id string) *raftpb.Message {
	data := []byte{1}
	data = binary.BigEndian.AppendUint64(data, from)
	data = binary.BigEndian.AppendUint64(data, 1<<62)
	data = append(data, 1) // kindSignals
	data = binary.LittleEndian.AppendUint32(data, 1)
	data = binary.LittleEndian.AppendUint16(data, uint16(len(id)))
	data = append(data, id...)
	data = binary.LittleEndian.AppendUint64(data, 7) // entity
	data = binary.LittleEndian.AppendUint16(data, uint16(len("view")))
	data = append(data, "view"...)
	data = binary.LittleEndian.AppendUint64(data, math.Float64bits(1))
	data = binary.LittleEndian.AppendUint64(data, uint64(time.Now().UnixMilli()))
	entry := &raftpb.Entry{Type: raftpb.EntryNormal.Enum(), Term: proto.Uint64(term), Index: proto.Uint64(index + 1), Data: data}
	return &raftpb.Message{Type: raftpb.MsgApp.Enum(), From: proto.Uint64(from), To: proto.Uint64(to), Term: proto.Uint64(term),
		LogTerm: proto.Uint64(term), Index: proto.Uint64(index), Commit: proto.Uint64(index + 1), Entries: []*raftpb.Entry{entry}}
}

// expectAbsent checks that no node knows the event id.
func (c *peerCluster) expectAbsent(id string) {
	for _, m := range c.running() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := c.admin[m.id].EventLocation(ctx, id)
		cancel()
		Expect(client.IsNotFound(err)).To(BeTrue(), "the forged event %s on member %d: %v (expected not found)", id, m.id, err)
	}
}

// roles picks, in a settled cluster, the leader, a follower whose
// certificate the forger holds, and the follower it attacks.
func (c *peerCluster) roles(s nodeState) (leader, impostor, target *peerMember) {
	leader = c.member(s.Leader)
	for _, m := range c.members {
		switch {
		case m == leader:
		case impostor == nil:
			impostor = m
		default:
			target = m
		}
	}
	return leader, impostor, target
}

// logLines counts the lines of member m's log matching re.
func logLines(m *peerMember, re *regexp.Regexp) int {
	f, err := os.Open(m.logFile())
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if re.MatchString(sc.Text()) {
			n++
		}
	}
	return n
}

// vmRSS reads a process's resident set from /proc/<pid>/status.
func vmRSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no VmRSS line", pid)
}

var _ = Describe("the peer plane of a secured cluster under a forger", Label("lifecycle"), func() {
	// The handshake refuses a client without a
	// certificate, with one from another CA, or in plaintext; their
	// forged heartbeat at term 1000 and forged append reach no raft.
	It("refuses peers without a certificate, with another CA's, and in plaintext; nothing moves", func() {
		c := newPeerCluster("peer-handshake", true, nil, nil)
		w := fixture.NewWriter("handshake")
		c.expectWorks(w)
		before := c.waitSettled()
		leader, _, _ := c.roles(before)

		otherCA := filepath.Join(c.dir, "other-ca")
		out, code := tidalServer("certs", "create-ca", "--certs-dir", otherCA)
		Expect(code).To(Equal(0), out)
		out, code = tidalServer("certs", "create-node", "--id", fmt.Sprint(leader.id), "--host", "127.0.0.1", "--certs-dir", otherCA)
		Expect(code).To(Equal(0), out)

		for _, attempt := range []struct {
			name      string
			certs     string
			plaintext bool
		}{{"no certificate", "", false}, {"member " + fmt.Sprint(leader.id) + "'s id from another CA", otherCA, false}, {"plaintext", "", true}} {
			for _, m := range c.members {
				failures := c.metric(m, "tidal_peer_handshake_failures_total")
				f := newForger(m.peerAddr, attempt.certs, attempt.plaintext)
				err := f.send(heartbeatMsg(leader.id, m.id, 1000), appendMsg(leader.id, m.id, before.Term, before.Commit, "forged-handshake"))
				Expect(err).To(HaveOccurred(), "%s to member %d: the stream was accepted", attempt.name, m.id)
				Expect(status.Code(err)).To(Equal(codes.Unavailable), "%s to member %d: %v", attempt.name, m.id, err)
				Eventually(func() float64 { return c.metric(m, "tidal_peer_handshake_failures_total") }).WithTimeout(30*time.Second).
					Should(BeNumerically(">", failures), "%s: member %d's tidal_peer_handshake_failures_total", attempt.name, m.id)
				GinkgoWriter.Printf("%s -> member %d: %v\n", attempt.name, m.id, err)
			}
		}
		c.expectUnchanged(before)
		c.expectAbsent("forged-handshake")
		c.expectWorks(w)
	})

	// Member 2's valid certificate claiming to be the
	// leader: its append (term = current term, at the last index,
	// committing the entry it carries) is dropped as sender_mismatch and
	// never applied. The control spec below shows the same message applied
	// where the plane proves nothing.
	It("drops an append whose From is not the member its certificate proves, and never applies it", func() {
		c := newPeerCluster("peer-impostor", true, nil, nil)
		w := fixture.NewWriter("impostor")
		c.expectWorks(w)
		before := c.waitSettled()
		leader, impostor, target := c.roles(before)
		By(fmt.Sprintf("member %d's certificate sending member %d's append to member %d", impostor.id, leader.id, target.id))
		mismatch := c.metric(target, dropsOf("sender_mismatch"))
		f := newForger(target.peerAddr, impostor.certs(), false)
		Expect(f.send(appendMsg(leader.id, target.id, before.Term, before.Commit, "forged-impostor"))).To(Succeed())
		Expect(c.metric(target, dropsOf("sender_mismatch"))).To(Equal(mismatch+1), "member %d's sender_mismatch drops", target.id)
		c.expectUnchanged(before)
		c.expectAbsent("forged-impostor")
		c.expectWorks(w)
		c.expectAbsent("forged-impostor")
	})

	// The control for the spec above: the forged append is well formed,
	// so where nothing proves who sends (plaintext, loopback only), the
	// follower applies it. What refuses it above is the identity check.
	It("(control) applies the same forged append on a plaintext cluster, where From is taken at its word", func() {
		c := newPeerCluster("peer-impostor-plaintext", false, nil, nil)
		before := c.waitSettled()
		leader, _, target := c.roles(before)
		f := newForger(target.peerAddr, "", true)
		Expect(f.send(appendMsg(leader.id, target.id, before.Term, before.Commit, "forged-plaintext"))).To(Succeed())
		Eventually(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := c.admin[target.id].EventLocation(ctx, "forged-plaintext")
			return err
		}).WithTimeout(30*time.Second).Should(Succeed(), "the forged append was not applied on member %d: the forgery itself is wrong, so the secured spec proves nothing", target.id)
	})

	// A certificate the cluster's CA issued for id 9,
	// never a member, floods every node with heartbeats and appends at
	// term 1000 for 10s: nothing moves, writes keep committing, the drops
	// are counted as not_member and logged a few times, not per message.
	It("ignores a non-member's flood at term 1000: leader and term stay, writes commit, a few log lines", func() {
		c := newPeerCluster("peer-non-member", true, nil, nil)
		w := fixture.NewWriter("flood")
		c.expectWorks(w)
		before := c.waitSettled()
		stranger := c.nodeCerts(filepath.Join(c.dir, "id9-certs"), 9)

		ctx, stopLoad := context.WithCancel(context.Background())
		var loadDone sync.WaitGroup
		loadDone.Add(1)
		go func() {
			defer loadDone.Done()
			w.Run(ctx, 4, func(i int) (string, *client.Client) {
				m := c.members[i%len(c.members)]
				return fmt.Sprint(m.id), c.writer[m.id]
			})
		}()
		ackedBefore := len(w.Acked())

		sent := map[uint64]*atomic.Int64{}
		var flood sync.WaitGroup
		deadline := time.Now().Add(10 * time.Second)
		for _, m := range c.members {
			sent[m.id] = &atomic.Int64{}
			f := newForger(m.peerAddr, stranger, false)
			flood.Add(1)
			go func() {
				defer GinkgoRecover()
				defer flood.Done()
				for time.Now().Before(deadline) {
					var batch []*raftpb.Message
					for i := range 100 {
						batch = append(batch, heartbeatMsg(9, m.id, 1000), appendMsg(9, m.id, 1000, before.Commit+uint64(i), "forged-flood"))
					}
					Expect(f.send(batch...)).To(Succeed())
					sent[m.id].Add(int64(len(batch)))
				}
			}()
		}
		flood.Wait()
		Expect(len(w.Acked())).To(BeNumerically(">", ackedBefore), "no write committed during the flood: %s", w.Summary())
		stopLoad()
		loadDone.Wait()
		GinkgoWriter.Printf("flood: %s\n", w.Summary())

		dropLine := regexp.MustCompile(`dropping peer messages.*reason=not_member`)
		for _, m := range c.members {
			n := sent[m.id].Load()
			Expect(n).To(BeNumerically(">=", 2000), "the flood sent too little to member %d to judge its log", m.id)
			Expect(c.metric(m, dropsOf("not_member"))).To(BeNumerically(">=", n), "member %d's not_member drops", m.id)
			lines := logLines(m, dropLine)
			GinkgoWriter.Printf("member %d: %d forged messages, %d log lines about them\n", m.id, n, lines)
			Expect(lines).To(BeNumerically(">=", 1), "member %d did not log the drops", m.id)
			// The first refusal, a running count at most every 10s: 10s
			// of flood is 2 or 3 lines, whatever its rate.
			Expect(lines).To(BeNumerically("<=", 3), "member %d logged %d lines for %d messages", m.id, lines, n)
		}
		after := c.waitSettled()
		Expect(after.Term).To(Equal(before.Term), "the term moved")
		Expect(after.Leader).To(Equal(before.Leader), "the leader moved")
		c.expectAbsent("forged-flood")
		c.expectWorks(w)
		c.expectAbsent("forged-flood")
	})

	// After `members remove`, the removed member's
	// (still valid) certificate is refused as removed_member.
	It("drops a removed member's messages as removed_member", func() {
		c := newPeerCluster("peer-removed", true, nil, nil)
		w := fixture.NewWriter("removed")
		c.expectWorks(w)
		before := c.waitSettled()
		leader, _, gone := c.roles(before)
		out, code := tidalServer("members", "remove", fmt.Sprint(gone.id), "--addr", leader.clientAddr, "--certs-dir", c.clients)
		Expect(code).To(Equal(0), "members remove %d:\n%s", gone.id, out)
		// The removed node exits 5 once it applies its removal, or once a
		// member tells it; the operator may stop it
		// first.
		gone.proc.cmd.Process.Signal(syscall.SIGTERM)
		Expect(gone.proc.waitExit(60*time.Second)).To(BeElementOf(0, 5), "the removed member's exit status")
		settled := c.waitSettled()

		for _, m := range c.running() {
			removed := c.metric(m, dropsOf("removed_member"))
			f := newForger(m.peerAddr, gone.certs(), false)
			// Each stream is ended with the answer that tells the removed
			// member so, after its first message.
			for _, msg := range []*raftpb.Message{heartbeatMsg(gone.id, m.id, settled.Term+5), appendMsg(gone.id, m.id, settled.Term+5, settled.Commit, "forged-removed")} {
				Expect(f.send(msg)).To(MatchError(ContainSubstring(fmt.Sprintf("member %d was removed from the cluster", gone.id))))
			}
			Expect(c.metric(m, dropsOf("removed_member"))).To(Equal(removed+2), "member %d's removed_member drops", m.id)
		}
		c.expectUnchanged(settled)
		c.expectAbsent("forged-removed")
		c.expectWorks(w)
	})

	// A member's certificate streaming a 400 MiB snapshot
	// (generated as it goes, never held) at a node capped at 64 MiB: the
	// stream is cut, the node's memory stays far below the stream's size,
	// and nothing is left in its spool.
	It("cuts a forged 400 MiB snapshot stream at --max-snapshot-bytes with memory bounded and the spool emptied", func() {
		const limit = 64 << 20
		c := newPeerCluster("peer-snapshot", true, []string{"--max-snapshot-bytes", fmt.Sprint(limit)}, nil)
		w := fixture.NewWriter("snapshot")
		c.expectWorks(w)
		before := c.waitSettled()
		_, impostor, target := c.roles(before)
		baseline, err := vmRSS(target.pid())
		Expect(err).NotTo(HaveOccurred())
		tooLarge := c.metric(target, dropsOf("snapshot_too_large"))

		var peak atomic.Int64
		sampling, stopSampling := context.WithCancel(context.Background())
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for sampling.Err() == nil {
				if rss, err := vmRSS(target.pid()); err == nil && rss > peak.Load() {
					peak.Store(rss)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()

		f := newForger(target.peerAddr, impostor.certs(), false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		st, err := f.conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, raftService+"Snapshot")
		Expect(err).NotTo(HaveOccurred())
		const total, chunkSize = 400 << 20, 1 << 20
		chunk := make([]byte, chunkSize) // one buffer, sent 400 times
		head, err := proto.Marshal(&raftpb.Message{Type: raftpb.MsgSnap.Enum(), From: proto.Uint64(impostor.id), To: proto.Uint64(target.id), Term: proto.Uint64(before.Term)})
		Expect(err).NotTo(HaveOccurred())
		copy(chunk, head)
		var sent int64
		var sendErr error
		for sent < total {
			if sendErr = st.SendMsg(&chunk); sendErr != nil {
				break
			}
			sent += chunkSize
		}
		if sendErr == nil {
			sendErr = st.CloseSend()
		}
		var ack []byte
		recvErr := st.RecvMsg(&ack)
		stopSampling()
		<-sampled
		Expect(status.Code(recvErr)).To(Equal(codes.ResourceExhausted), "the stream's outcome: %v (send: %v)", recvErr, sendErr)
		Expect(recvErr.Error()).To(ContainSubstring("--max-snapshot-bytes"))
		Expect(sent).To(BeNumerically("<", total), "all 400 MiB went through before the node cut the stream")
		received := c.metric(target, "tidal_peer_snapshot_bytes_received_total")
		Expect(received).To(BeNumerically("<=", limit+chunkSize), "member %d read past its cap", target.id)
		Expect(c.metric(target, dropsOf("snapshot_too_large"))).To(Equal(tooLarge + 1))
		GinkgoWriter.Printf("forged snapshot: sent %d MiB before the cut, member %d received %.0f MiB; VmRSS %d MiB before, peak %d MiB during the stream\n",
			sent>>20, target.id, received/(1<<20), baseline>>20, peak.Load()>>20)
		AddReportEntry("forged snapshot: peak VmRSS of the target (MiB)", peak.Load()>>20)
		Expect(peak.Load()).To(BeNumerically("<", 200<<20), "member %d's VmRSS peaked at %d MiB while a 400 MiB snapshot streamed in", target.id, peak.Load()>>20)

		spool := filepath.Join(target.data(), "snap-spool")
		Eventually(func() ([]string, error) {
			entries, err := os.ReadDir(spool)
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			return names, err
		}).WithTimeout(30*time.Second).Should(BeEmpty(), "member %d's spool %s", target.id, spool)
		c.expectUnchanged(before)
		c.expectWorks(w)
	})
})

var _ = Describe("a node whose clock is off", Label("lifecycle"), func() {
	// A node whose offset to a majority of the voters
	// exceeds --max-clock-skew (1m by default) refuses writes with the
	// reason, says so in /readyz and its log; the others take writes; the
	// node restarted with its clock right takes writes again.
	It("refuses writes and is not ready while 5m off; the others take writes; restarted right, it takes them again", func() {
		const skewed = uint64(3)
		c := newPeerCluster("clock-skew", true, nil, map[uint64][]string{skewed: {"--test-clock-offset", "5m"}})
		m := c.member(skewed)
		w := fixture.NewWriter("clock")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()

		var refused error
		Eventually(func() bool {
			_, refused = c.writer[skewed].WriteSignals(ctx, []client.Event{{ID: "from-the-skewed-node", Entity: 7, Signal: "view"}})
			return client.IsUnavailable(refused) && strings.Contains(refused.Error(), "--max-clock-skew")
		}).WithTimeout(60*time.Second).WithPolling(250*time.Millisecond).Should(BeTrue(), "a write through the skewed member: %v", refused)
		GinkgoWriter.Printf("write through the skewed member: %v\n", refused)
		Expect(refused.Error()).To(And(ContainSubstring("1m0s"), MatchRegexp(`member \d -(5m0(\.\d+)?s|4m59\.\d+s)`)), "the refusal names the bound and the offset")
		ready := c.admin[skewed].Ready(ctx)
		Expect(ready).To(HaveOccurred(), "the skewed member says it is ready")
		Expect(ready.Error()).To(ContainSubstring("--max-clock-skew"))
		Expect(logLines(m, regexp.MustCompile(`clock out of bounds: refusing writes`))).To(Equal(1))

		for _, id := range []uint64{1, 2} {
			before := len(w.Acked())
			Eventually(func() int {
				w.WriteOne(ctx, fmt.Sprint(id), c.writer[id])
				return len(w.Acked())
			}).WithTimeout(60*time.Second).Should(BeNumerically(">", before), "member %d refuses writes too: %s", id, w.Summary())
			Expect(c.admin[id].Ready(ctx)).To(Succeed(), "member %d", id)
		}
		_, err := c.writer[skewed].EventLocation(ctx, "from-the-skewed-node")
		Expect(client.IsNotFound(err)).To(BeTrue(), "the refused write landed: %v", err)

		c.stop(m)
		c.start(m) // without the offset
		Eventually(func() error {
			_, err := c.writer[skewed].WriteSignals(ctx, []client.Event{{ID: "after-the-fix", Entity: 7, Signal: "view"}})
			return err
		}).WithTimeout(90*time.Second).WithPolling(250*time.Millisecond).Should(Succeed(), "the member restarted with its clock right")
		Expect(c.admin[skewed].Ready(ctx)).To(Succeed())
		c.expectWorks(w)
	})

	// A skewed node "resumes when it is back in bounds" without a
	// restart: the same process, its (test-only) offset file moved from
	// 5m back to 0s, takes writes again and is ready, and says so once.
	It("refuses writes while its offset file says 5m, and takes them again in the same process once it says 0s", func() {
		const skewed = uint64(2)
		offsetFile := filepath.Join(specDir("clock-resume-offset"), "offset")
		Expect(os.WriteFile(offsetFile, []byte("5m\n"), 0o644)).To(Succeed())
		c := newPeerCluster("clock-resume", true, nil, map[uint64][]string{skewed: {"--test-clock-offset-file", offsetFile}})
		m := c.member(skewed)
		pid := m.pid()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()

		var refused error
		Eventually(func() bool {
			_, refused = c.writer[skewed].WriteSignals(ctx, []client.Event{{ID: "while-skewed", Entity: 7, Signal: "view"}})
			return client.IsUnavailable(refused) && strings.Contains(refused.Error(), "--max-clock-skew")
		}).WithTimeout(60*time.Second).WithPolling(250*time.Millisecond).Should(BeTrue(), "a write through the skewed member: %v", refused)
		Expect(c.admin[skewed].Ready(ctx)).To(MatchError(ContainSubstring("--max-clock-skew")), "the skewed member says it is ready")
		// Reads evaluated at its clock are refused as its writes are; a
		// read at a named time does not use its clock and is served.
		_, err := c.writer[skewed].Entity(ctx, 7, client.Local())
		Expect(client.IsUnavailable(err) && strings.Contains(err.Error(), "--max-clock-skew") && strings.Contains(err.Error(), "?at=")).
			To(BeTrue(), "a read at the skewed member's clock: %v", err)
		_, err = c.writer[skewed].Top(ctx, "view", "1h", 10)
		Expect(client.IsUnavailable(err) && strings.Contains(err.Error(), "--max-clock-skew")).To(BeTrue(), "top-k at the skewed member's clock: %v", err)
		_, err = c.writer[skewed].Entity(ctx, 7, client.Local(), client.At(time.Now().UnixMilli()))
		Expect(err).NotTo(HaveOccurred(), "a read at a named time through the skewed member")

		Expect(os.WriteFile(offsetFile, []byte("0s\n"), 0o644)).To(Succeed())
		Eventually(func() error {
			_, err = c.writer[skewed].WriteSignals(ctx, []client.Event{{ID: "back-in-bounds", Entity: 7, Signal: "view"}})
			return err
		}).WithTimeout(90*time.Second).WithPolling(250*time.Millisecond).Should(Succeed(), "the member whose offset went back to 0s: %v", err)
		Expect(c.admin[skewed].Ready(ctx)).To(Succeed())
		_, err = c.writer[skewed].Entity(ctx, 7, client.Local())
		Expect(err).NotTo(HaveOccurred(), "a read at the member's clock once it is back in bounds")
		Expect(m.pid()).To(Equal(pid), "the member was restarted")
		Expect(m.proc.exited).NotTo(BeClosed(), "the member exited")
		Expect(logLines(m, regexp.MustCompile(`clock out of bounds: refusing writes`))).To(Equal(1))
		Expect(logLines(m, regexp.MustCompile(`clock back within bounds: taking writes again`))).To(Equal(1))
		_, err = c.writer[skewed].EventLocation(ctx, "while-skewed")
		Expect(client.IsNotFound(err)).To(BeTrue(), "the refused write landed: %v", err)
	})
})
