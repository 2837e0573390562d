// Package mesh puts every directed link between N named nodes behind its
// own relay, so any grudge — who cannot send to whom — can be imposed on
// a cluster without root, iptables or tc.
//
// Node i reaches node j only by dialing PeerAddr(i, j), the relay i->j,
// whose upstream is j's real peer address. Clients reach node j through
// ClientAddr(j); partitions leave client relays alone (the client stands
// where Jepsen's control node stands), link faults can still target them
// through the relay itself.
//
// A grudge is directed: Grudge[a] lists the nodes a cannot send to. It is
// imposed with blackholes on the relays of both connections between a
// pair, because TCP carries both directions on one connection: a -> b cut
// means the upstream direction of relay a->b (a's requests) and the
// downstream direction of relay b->a (a's replies to b) are blackholed.
// For a one-way cut this means b still reaches a, but on the connection b
// opened, a's answers never return — as with a real one-way packet loss,
// the sender sees a connection that stalls, not one that fails.
package mesh

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tidaldb/tidal/tcp-relay/relay"
)

// PartitionFault is the name of the fault a partition installs on relays;
// user link faults must use other names.
const PartitionFault = "mesh-partition"

var (
	// ErrUnknownNode is returned for a node name the mesh does not hold.
	ErrUnknownNode = errors.New("unknown node")
	// ErrBadShape is returned when a partition's shape is invalid.
	ErrBadShape = errors.New("invalid partition")
)

// Node is a node's real addresses, as the relays dial them.
type Node struct {
	Peer   string `json:"peer" yaml:"peer"`
	Client string `json:"client" yaml:"client"`
}

// Grudge maps a node to the nodes it cannot send to. Nodes that reach
// everyone are absent; an empty grudge is a healed network.
type Grudge map[string][]string

// Change records one operation on the mesh and the grudge it left.
type Change struct {
	At     time.Time `json:"at"` // when the change acted on every existing connection
	Op     string    `json:"op"`
	Grudge Grudge    `json:"grudge"`
}

// Config describes a mesh.
type Config struct {
	Nodes map[string]Node
	// Host is the address relays listen on, each on a free port; default 127.0.0.1.
	Host string
	// ClientPorts fixes the port of a node's client relay (absent: a free
	// port). A container runtime publishes ports when it creates the
	// relay's container, before the mesh exists, so it must know them.
	ClientPorts map[string]int
	Logger      *slog.Logger
}

type link struct{ from, to string }

// Mesh is safe for concurrent use; operations are serialized.
type Mesh struct {
	nodes   []string // sorted
	addrs   map[string]Node
	peers   map[link]*relay.Relay
	clients map[string]*relay.Relay

	mu        sync.Mutex
	cut       map[link]bool            // current grudge: from cannot send to to
	installed map[link]relay.Direction // partition blackhole on each peer relay; absent = none
	history   []Change
}

// New starts one relay per directed pair and one client relay per node.
func New(cfg Config) (*Mesh, error) {
	if len(cfg.Nodes) < 2 {
		return nil, fmt.Errorf("mesh: expected at least 2 nodes, found %d", len(cfg.Nodes))
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	m := &Mesh{
		nodes:     slices.Sorted(maps.Keys(cfg.Nodes)),
		addrs:     maps.Clone(cfg.Nodes),
		peers:     make(map[link]*relay.Relay),
		clients:   make(map[string]*relay.Relay),
		cut:       make(map[link]bool),
		installed: make(map[link]relay.Direction),
	}
	for n, port := range cfg.ClientPorts {
		if _, ok := cfg.Nodes[n]; !ok {
			return nil, fmt.Errorf("mesh: client port for %q: %w (nodes %v)", n, ErrUnknownNode, m.nodes)
		}
		if port < 1 || port > 65535 {
			return nil, fmt.Errorf("mesh: client port for %s: expected 1..65535, found %d", n, port)
		}
	}
	listen := net.JoinHostPort(cfg.Host, "0")
	for _, n := range m.nodes {
		if err := relay.CheckName(n); err != nil || slices.Contains([]rune(n), ':') {
			m.Close()
			return nil, fmt.Errorf("mesh: node name %q: expected letters, digits and _-. only", n)
		}
		clientListen := listen
		if port, ok := cfg.ClientPorts[n]; ok {
			clientListen = net.JoinHostPort(cfg.Host, strconv.Itoa(port))
		}
		r, err := relay.Listen(relay.Config{Name: ClientRelayName(n), Listen: clientListen, Upstream: cfg.Nodes[n].Client, Logger: cfg.Logger})
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("mesh: client relay for %s: %w", n, err)
		}
		m.clients[n] = r
		for _, to := range m.nodes {
			if to == n {
				continue
			}
			r, err := relay.Listen(relay.Config{Name: PeerRelayName(n, to), Listen: listen, Upstream: cfg.Nodes[to].Peer, Logger: cfg.Logger})
			if err != nil {
				m.Close()
				return nil, fmt.Errorf("mesh: relay %s->%s: %w", n, to, err)
			}
			m.peers[link{n, to}] = r
		}
	}
	return m, nil
}

// PeerRelayName is the relay name of link from->to ("peer:a:b").
func PeerRelayName(from, to string) string { return "peer:" + from + ":" + to }

// ClientRelayName is the relay name of node's client relay ("client:a").
func ClientRelayName(node string) string { return "client:" + node }

// Nodes returns the node names, sorted.
func (m *Mesh) Nodes() []string { return slices.Clone(m.nodes) }

// Node returns a node's real addresses.
func (m *Mesh) Node(name string) (Node, bool) { n, ok := m.addrs[name]; return n, ok }

// PeerAddr is the address node from must dial to reach node to.
func (m *Mesh) PeerAddr(from, to string) (string, error) {
	r, ok := m.peers[link{from, to}]
	if !ok {
		return "", fmt.Errorf("mesh: link %s->%s: %w", from, to, ErrUnknownNode)
	}
	return r.Addr().String(), nil
}

// ClientAddr is the address clients dial to reach node.
func (m *Mesh) ClientAddr(node string) (string, error) {
	r, ok := m.clients[node]
	if !ok {
		return "", fmt.Errorf("mesh: node %q: %w", node, ErrUnknownNode)
	}
	return r.Addr().String(), nil
}

// PeerRelay returns the relay of link from->to.
func (m *Mesh) PeerRelay(from, to string) (*relay.Relay, bool) {
	r, ok := m.peers[link{from, to}]
	return r, ok
}

// ClientRelay returns node's client relay.
func (m *Mesh) ClientRelay(node string) (*relay.Relay, bool) {
	r, ok := m.clients[node]
	return r, ok
}

// Relays returns every relay of the mesh, peers then clients.
func (m *Mesh) Relays() []*relay.Relay {
	var out []*relay.Relay
	for _, from := range m.nodes {
		for _, to := range m.nodes {
			if r, ok := m.peers[link{from, to}]; ok {
				out = append(out, r)
			}
		}
	}
	for _, n := range m.nodes {
		out = append(out, m.clients[n])
	}
	return out
}

// Grudge returns the current grudge.
func (m *Mesh) Grudge() Grudge {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.grudgeLocked()
}

func (m *Mesh) grudgeLocked() Grudge {
	g := Grudge{}
	for _, from := range m.nodes {
		for _, to := range m.nodes {
			if m.cut[link{from, to}] {
				g[from] = append(g[from], to)
			}
		}
	}
	return g
}

// History returns every change made so far, oldest first.
func (m *Mesh) History() []Change {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.history)
}

func (m *Mesh) check(nodes ...string) error {
	for _, n := range nodes {
		if _, ok := m.addrs[n]; !ok {
			return fmt.Errorf("mesh: node %q (have %v): %w", n, m.nodes, ErrUnknownNode)
		}
	}
	return nil
}

// Partition cuts every pair of nodes in different groups, both ways.
// Every node must appear in exactly one group.
func (m *Mesh) Partition(groups ...[]string) (Change, error) {
	group := map[string]int{}
	for i, g := range groups {
		if err := m.check(g...); err != nil {
			return Change{}, err
		}
		for _, n := range g {
			if _, dup := group[n]; dup {
				return Change{}, fmt.Errorf("mesh: node %q is in two groups: %w", n, ErrBadShape)
			}
			group[n] = i
		}
	}
	if len(group) != len(m.nodes) {
		var missing []string
		for _, n := range m.nodes {
			if _, ok := group[n]; !ok {
				missing = append(missing, n)
			}
		}
		return Change{}, fmt.Errorf("mesh: expected every node in a group, missing %v: %w", missing, ErrBadShape)
	}
	cut := map[link]bool{}
	for _, a := range m.nodes {
		for _, b := range m.nodes {
			if group[a] != group[b] {
				cut[link{a, b}] = true
			}
		}
	}
	return m.impose(fmt.Sprintf("partition %v", groups), cut)
}

// order returns nodes in the order given, or sorted when none is given;
// an order must name every node once.
func (m *Mesh) order(nodes []string) ([]string, error) {
	if len(nodes) == 0 {
		return slices.Clone(m.nodes), nil
	}
	if err := m.check(nodes...); err != nil {
		return nil, err
	}
	if s := slices.Sorted(slices.Values(nodes)); !slices.Equal(slices.Compact(s), m.nodes) {
		return nil, fmt.Errorf("mesh: expected an order naming each of %v once, found %v: %w", m.nodes, nodes, ErrBadShape)
	}
	return nodes, nil
}

// Halves splits the nodes (in the given order, or sorted) into a smaller
// first half and a larger second half, as Jepsen's partition-halves.
func (m *Mesh) Halves(order ...string) (Change, error) {
	o, err := m.order(order)
	if err != nil {
		return Change{}, err
	}
	k := len(o) / 2
	return m.Partition(o[:k], o[k:])
}

// Isolate cuts node off from every other node, both ways.
func (m *Mesh) Isolate(node string) (Change, error) {
	if err := m.check(node); err != nil {
		return Change{}, err
	}
	var rest []string
	for _, n := range m.nodes {
		if n != node {
			rest = append(rest, n)
		}
	}
	return m.Partition([]string{node}, rest)
}

// OneWay cuts traffic from -> to and keeps to -> from (see the package
// comment for what that means on TCP). Other links are healed.
func (m *Mesh) OneWay(from, to string) (Change, error) {
	if err := m.check(from, to); err != nil {
		return Change{}, err
	}
	if from == to {
		return Change{}, fmt.Errorf("mesh: one-way from %q to itself: %w", from, ErrBadShape)
	}
	return m.impose(fmt.Sprintf("oneway %s->%s", from, to), map[link]bool{{from, to}: true})
}

// Bridge is Jepsen's bridge: the nodes (in order, or sorted) are split into
// two halves that cannot reach each other, except the middle node, which
// reaches both. Needs at least 3 nodes.
func (m *Mesh) Bridge(order ...string) (Change, error) {
	o, err := m.order(order)
	if err != nil {
		return Change{}, err
	}
	if len(o) < 3 {
		return Change{}, fmt.Errorf("mesh: bridge needs at least 3 nodes, have %d: %w", len(o), ErrBadShape)
	}
	mid := len(o) / 2
	left, right := o[:mid], o[mid+1:]
	cut := map[link]bool{}
	for _, a := range left {
		for _, b := range right {
			cut[link{a, b}], cut[link{b, a}] = true, true
		}
	}
	return m.impose(fmt.Sprintf("bridge %v <%s> %v", left, o[mid], right), cut)
}

// MajoritiesRing is Jepsen's majorities-ring: nodes (in order, or sorted)
// form a ring; each node reaches the nodes within distance d of it, with d
// the smallest that makes 2d+1 a majority. Every node then sees a
// majority, and no two see the same one. Needs at least 4 nodes (with 3
// every majority of neighbours is the whole ring).
func (m *Mesh) MajoritiesRing(order ...string) (Change, error) {
	o, err := m.order(order)
	if err != nil {
		return Change{}, err
	}
	n := len(o)
	majority := n/2 + 1
	d := majority / 2 // 2d+1 >= majority
	if 2*d+1 >= n {
		return Change{}, fmt.Errorf("mesh: majorities-ring needs at least 4 nodes (each must miss someone), have %d: %w", n, ErrBadShape)
	}
	cut := map[link]bool{}
	for i := range o {
		for j := range o {
			dist := min((i-j+n)%n, (j-i+n)%n)
			if dist > d {
				cut[link{o[i], o[j]}] = true
			}
		}
	}
	return m.impose(fmt.Sprintf("majorities-ring %v", o), cut)
}

// Heal removes the partition. Link faults stay.
func (m *Mesh) Heal() (Change, error) { return m.impose("heal", map[link]bool{}) }

// impose makes cut the current grudge, touching only relays whose
// partition fault changes, each atomically (a link cut before and after
// never opens in between).
func (m *Mesh) impose(op string, cut map[link]bool) (Change, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var failed error
	for l, r := range m.peers {
		before, after := m.installed[l], partitionDirection(cut, l)
		if before == after {
			continue
		}
		var remove []string
		var add []relay.Fault
		if before != "" {
			remove = []string{PartitionFault}
		}
		if after != "" {
			add = []relay.Fault{{Name: PartitionFault, Direction: after, Toxicity: 1, Toxic: relay.Blackhole{}}}
		}
		if _, err := r.Apply(remove, add); err != nil {
			failed = errors.Join(failed, fmt.Errorf("mesh: %s on relay %s: %w", op, r.Name(), err))
			continue
		}
		if after == "" {
			delete(m.installed, l)
		} else {
			m.installed[l] = after
		}
	}
	// The grudge reported is what the relays enforce, even after a failure.
	m.cut = map[link]bool{}
	for l, d := range m.installed {
		if d == relay.Both || d == relay.Upstream {
			m.cut[l] = true
		}
	}
	if failed != nil {
		return Change{}, failed
	}
	c := Change{At: time.Now(), Op: op, Grudge: m.grudgeLocked()}
	m.history = append(m.history, c)
	return c, nil
}

// partitionDirection is the blackhole direction relay l needs for cut:
// its upstream carries l.from -> l.to, its downstream l.to -> l.from.
func partitionDirection(cut map[link]bool, l link) relay.Direction {
	up, down := cut[l], cut[link{l.to, l.from}]
	switch {
	case up && down:
		return relay.Both
	case up:
		return relay.Upstream
	case down:
		return relay.Downstream
	}
	return ""
}

// AddLinkFault installs f on relay from->to (f's direction is relative to
// that relay: upstream = from -> to). With from and to both empty it goes
// on every peer relay.
func (m *Mesh) AddLinkFault(from, to string, f relay.Fault) (Change, error) {
	if f.Name == PartitionFault {
		return Change{}, fmt.Errorf("mesh: fault name %q is reserved for partitions: %w", f.Name, relay.ErrFaultExists)
	}
	return m.linkOp(fmt.Sprintf("add %s %s->%s", f, from, to), from, to, func(r *relay.Relay) error {
		_, err := r.AddFault(f)
		return err
	})
}

// RemoveLinkFault removes the fault name from relay from->to, or from every
// peer relay when from and to are empty.
func (m *Mesh) RemoveLinkFault(from, to, name string) (Change, error) {
	return m.linkOp(fmt.Sprintf("remove %s %s->%s", name, from, to), from, to, func(r *relay.Relay) error {
		_, err := r.RemoveFault(name)
		return err
	})
}

func (m *Mesh) linkOp(op, from, to string, do func(*relay.Relay) error) (Change, error) {
	var targets []*relay.Relay
	if from == "" && to == "" {
		for _, a := range m.nodes {
			for _, b := range m.nodes {
				if r, ok := m.peers[link{a, b}]; ok {
					targets = append(targets, r)
				}
			}
		}
	} else {
		r, ok := m.peers[link{from, to}]
		if !ok {
			return Change{}, fmt.Errorf("mesh: link %q->%q (nodes %v): %w", from, to, m.nodes, ErrUnknownNode)
		}
		targets = []*relay.Relay{r}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range targets {
		if err := do(r); err != nil {
			return Change{}, fmt.Errorf("mesh: %s: %w", op, err)
		}
	}
	c := Change{At: time.Now(), Op: op, Grudge: m.grudgeLocked()}
	m.history = append(m.history, c)
	return c, nil
}

// Reset heals the partition and removes every fault from every relay of
// the mesh, client relays included. After Close it fails with
// relay.ErrClosed and records nothing.
func (m *Mesh) Reset() (Change, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	relays := m.Relays()
	var failed []error
	for _, r := range relays {
		if _, err := r.RemoveAll(); err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return Change{}, fmt.Errorf("mesh: reset: %d of %d relays failed, first: %w", len(failed), len(relays), failed[0])
	}
	m.cut = map[link]bool{}
	m.installed = map[link]relay.Direction{}
	c := Change{At: time.Now(), Op: "reset", Grudge: Grudge{}}
	m.history = append(m.history, c)
	return c, nil
}

// Close closes every relay.
func (m *Mesh) Close() error {
	var errs []error
	for _, r := range m.peers {
		errs = append(errs, r.Close())
	}
	for _, r := range m.clients {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}
