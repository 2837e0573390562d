package mesh

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tcp-relay/relay"
)

// node is a real TCP server standing in for a tidal node: it echoes every
// line and remembers the lines it received.
type node struct {
	ln   net.Listener
	mu   sync.Mutex
	seen map[string]bool
	wg   sync.WaitGroup
}

func startNode(t *testing.T) *node {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{ln: ln, seen: map[string]bool{}}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					n.mu.Lock()
					n.seen[sc.Text()] = true
					n.mu.Unlock()
					c.Write(append(sc.Bytes(), '\n'))
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); n.wg.Wait() })
	return n
}

func (n *node) saw(token string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.seen[token]
}

var names = []string{"a", "b", "c", "d", "e"}

func startMesh(t *testing.T) (*Mesh, map[string]*node) {
	nodes := map[string]*node{}
	cfg := Config{Nodes: map[string]Node{}}
	for _, name := range names {
		n := startNode(t)
		nodes[name] = n
		cfg.Nodes[name] = Node{Peer: n.ln.Addr().String(), Client: n.ln.Addr().String()}
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, nodes
}

// cutSet is the expected grudge of a shape as a set of directed links.
type cutSet map[[2]string]bool

func groups(gs ...[]string) cutSet {
	in := map[string]int{}
	for i, g := range gs {
		for _, n := range g {
			in[n] = i
		}
	}
	c := cutSet{}
	for _, a := range names {
		for _, b := range names {
			if in[a] != in[b] {
				c[[2]string{a, b}] = true
			}
		}
	}
	return c
}

func (c cutSet) grudge() Grudge {
	g := Grudge{}
	for _, a := range names {
		for _, b := range names {
			if c[[2]string{a, b}] {
				g[a] = append(g[a], b)
			}
		}
	}
	return g
}

// TestPartitionShapes opens a connection on every directed link, imposes
// each shape, and checks on those existing connections which links carry
// data each way.
func TestPartitionShapes(t *testing.T) {
	m, nodes := startMesh(t)
	ring := cutSet{}
	for i, a := range names {
		for j, b := range names {
			if d := min((i-j+5)%5, (j-i+5)%5); d > 1 {
				ring[[2]string{a, b}] = true
			}
		}
	}
	bridge := cutSet{}
	for _, a := range []string{"a", "b"} {
		for _, b := range []string{"d", "e"} {
			bridge[[2]string{a, b}], bridge[[2]string{b, a}] = true, true
		}
	}
	shapes := []struct {
		name   string
		impose func() (Change, error)
		want   cutSet
	}{
		{"halves", func() (Change, error) { return m.Halves() }, groups([]string{"a", "b"}, []string{"c", "d", "e"})},
		{"isolate", func() (Change, error) { return m.Isolate("c") }, groups([]string{"c"}, []string{"a", "b", "d", "e"})},
		{"groups", func() (Change, error) { return m.Partition([]string{"a", "c"}, []string{"b", "d"}, []string{"e"}) },
			groups([]string{"a", "c"}, []string{"b", "d"}, []string{"e"})},
		{"oneway", func() (Change, error) { return m.OneWay("a", "b") }, cutSet{{"a", "b"}: true}},
		{"bridge", func() (Change, error) { return m.Bridge() }, bridge},
		{"majorities-ring", func() (Change, error) { return m.MajoritiesRing() }, ring},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			type probe struct {
				from, to string
				c        net.Conn
				r        *bufio.Reader
				replied  bool
			}
			var probes []probe
			for _, from := range names {
				for _, to := range names {
					if from == to {
						continue
					}
					addr, err := m.PeerAddr(from, to)
					if err != nil {
						t.Fatal(err)
					}
					c, err := net.Dial("tcp", addr)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					p := probe{from: from, to: to, c: c, r: bufio.NewReader(c)}
					// The link works before the shape is imposed.
					fmt.Fprintf(c, "warm %s %s %s\n", sh.name, from, to)
					c.SetReadDeadline(time.Now().Add(5 * time.Second))
					if _, err := p.r.ReadString('\n'); err != nil {
						t.Fatalf("healed link %s->%s: %v", from, to, err)
					}
					probes = append(probes, p)
				}
			}
			before := time.Now()
			ch, err := sh.impose()
			if err != nil {
				t.Fatal(err)
			}
			if ch.At.Before(before) || time.Since(ch.At) > 5*time.Second {
				t.Errorf("change time %v is not the time of the call", ch.At)
			}
			if got, want := m.Grudge(), sh.want.grudge(); !grudgeEqual(got, want) {
				t.Errorf("grudge: expected %v, found %v", want, got)
			}
			for _, p := range probes {
				fmt.Fprintf(p.c, "probe %s %s %s\n", sh.name, p.from, p.to)
			}
			time.Sleep(150 * time.Millisecond)
			for i := range probes {
				p := &probes[i]
				token := fmt.Sprintf("probe %s %s %s", sh.name, p.from, p.to)
				sendOK := !sh.want[[2]string{p.from, p.to}]
				replyOK := sendOK && !sh.want[[2]string{p.to, p.from}]
				if got := nodes[p.to].saw(token); got != sendOK {
					t.Errorf("%s->%s: expected delivered=%v, found %v", p.from, p.to, sendOK, got)
				}
				p.c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
				_, err := p.r.ReadString('\n')
				p.replied = err == nil
				if got := err == nil; got != replyOK {
					t.Errorf("%s->%s: expected the reply to come back=%v, found %v (%v)", p.from, p.to, replyOK, got, err)
				}
			}
			if _, err := m.Heal(); err != nil {
				t.Fatal(err)
			}
			if g := m.Grudge(); len(g) != 0 {
				t.Fatalf("expected an empty grudge after heal, found %v", g)
			}
			// After the heal every held probe and reply comes through.
			for _, p := range probes {
				if p.replied {
					continue
				}
				p.c.SetReadDeadline(time.Now().Add(5 * time.Second))
				for {
					line, err := p.r.ReadString('\n')
					if err != nil {
						t.Fatalf("%s->%s after heal: %v", p.from, p.to, err)
					}
					if line == fmt.Sprintf("probe %s %s %s\n", sh.name, p.from, p.to) {
						break
					}
				}
			}
		})
	}
	if h := m.History(); len(h) != 2*len(shapes) {
		t.Errorf("expected %d changes in history, found %d", 2*len(shapes), len(h))
	}
}

func grudgeEqual(a, b Grudge) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func TestShapeErrors(t *testing.T) {
	m, _ := startMesh(t)
	if _, err := m.Partition([]string{"a", "b"}, []string{"c"}); err == nil {
		t.Error("expected an error when nodes are missing from the groups")
	}
	if _, err := m.Partition([]string{"a", "b"}, []string{"b", "c", "d", "e"}); err == nil {
		t.Error("expected an error for a node in two groups")
	}
	if _, err := m.Isolate("z"); err == nil {
		t.Error("expected an error for an unknown node")
	}
	if _, err := m.OneWay("a", "a"); err == nil {
		t.Error("expected an error for a one-way cut to itself")
	}
	if _, err := m.Halves("a", "b"); err == nil {
		t.Error("expected an error for an order that misses nodes")
	}
	f, _ := relay.Spec{Type: "blackhole", Name: PartitionFault}.Fault()
	if _, err := m.AddLinkFault("a", "b", f); err == nil {
		t.Error("expected the partition fault name to be reserved")
	}
}

func TestLinkFaults(t *testing.T) {
	m, _ := startMesh(t)
	f, err := relay.Spec{Name: "slow", Type: "latency", LatencyMS: 50}.Fault()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddLinkFault("", "", f); err != nil {
		t.Fatal(err)
	}
	for _, r := range m.Relays() {
		has := slices.ContainsFunc(r.Faults(), func(f relay.Fault) bool { return f.Name == "slow" })
		if peer := r.Name()[:5] == "peer:"; has != peer {
			t.Errorf("relay %s: expected the all-links fault only on peer relays, has=%v", r.Name(), has)
		}
	}
	addr, _ := m.PeerAddr("a", "b")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	fmt.Fprintf(c, "x\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 90*time.Millisecond {
		t.Errorf("expected >= 100ms round trip with 50ms latency each way, found %v", d)
	}
	if _, err := m.RemoveLinkFault("a", "b", "slow"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.RemoveLinkFault("a", "b", "slow"); err == nil {
		t.Error("expected an error removing a fault twice")
	}
	m.Reset()
	for _, r := range m.Relays() {
		if n := len(r.Faults()); n != 0 {
			t.Errorf("relay %s: expected no faults after reset, found %d", r.Name(), n)
		}
	}
}

// Regression: Reset after Close drove RemoveAll into
// unbounded recursion on the closed relays (a stack overflow that took
// the process down). It reports the closed relays instead, and records
// no reset that did not happen.
func TestResetAfterCloseFails(t *testing.T) {
	m, _ := startMesh(t)
	if _, err := m.Isolate("a"); err != nil {
		t.Fatal(err)
	}
	m.Close()
	before := len(m.History())
	if _, err := m.Reset(); !errors.Is(err, relay.ErrClosed) {
		t.Fatalf("expected Reset after Close to fail with relay.ErrClosed, found %v", err)
	}
	if h := m.History(); len(h) != before {
		t.Errorf("expected no reset recorded after a failed Reset, found %v", h[before:])
	}
}

// A container runtime publishes the client relays' ports when it creates
// the relay's container, before the mesh exists: ClientPorts fixes them,
// Host moves every relay off loopback, and a port that is out of range or
// names no node is refused before anything listens.
func TestClientPortsAndHost(t *testing.T) {
	a, b := startNode(t), startNode(t)
	free := func() int {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	nodes := map[string]Node{"a": {Peer: a.ln.Addr().String(), Client: a.ln.Addr().String()},
		"b": {Peer: b.ln.Addr().String(), Client: b.ln.Addr().String()}}
	port := free()
	m, err := New(Config{Nodes: nodes, Host: "127.0.0.2", ClientPorts: map[string]int{"a": port}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ca, _ := m.ClientAddr("a")
	if want := fmt.Sprintf("127.0.0.2:%d", port); ca != want {
		t.Errorf("client relay of a: expected %s, found %s", want, ca)
	}
	for _, addr := range []string{must(m.ClientAddr("b")), must(m.PeerAddr("a", "b"))} {
		if h, _, _ := net.SplitHostPort(addr); h != "127.0.0.2" {
			t.Errorf("relay %s: expected to listen on host 127.0.0.2", addr)
		}
	}
	c, err := net.Dial("tcp", ca)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("fixed-port\n"))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "fixed-port\n" {
		t.Errorf("expected the echo through the fixed-port relay, found %q, %v", line, err)
	}
	c.Close()

	for _, bad := range []map[string]int{{"z": port}, {"a": 0}, {"a": 70000}} {
		if m, err := New(Config{Nodes: nodes, ClientPorts: bad}); err == nil {
			m.Close()
			t.Errorf("client ports %v: expected an error", bad)
		}
	}
}

func must(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}
