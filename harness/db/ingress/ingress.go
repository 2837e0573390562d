// Package ingress lets a database whose nodes all dial one advertised
// address per peer still send every peer link through its own relay of
// the mesh.
//
// tidal-server is told, per node, which relay to dial for each peer
// (--peer-dial). Most databases are not: etcd's members share one
// membership in which each member has one peer URL, and every other
// member dials it. The mesh needs to know who is dialing, because a
// partition cuts the directed pair (from, to), not the destination.
//
// An Ingress stands at node to's advertised peer address. For each
// connection it accepts, it finds which node's process holds the other end
// of the socket — the kernel knows: /proc/net/tcp maps the connection to
// a socket inode, and /proc/<pid>/fd of each node's process names the
// sockets it holds — and forwards the connection through the mesh relay
// from->to, whose upstream is to's real peer listener. So every partition
// shape and link fault acts on the same relays as for tidal-server. A
// connection whose owner is not one of the nodes (a tool, a process that
// already exited) is closed: only nodes speak on peer ports.
//
// It needs the nodes to be local processes the harness can read /proc of
// (the process backend, same user or root), and IPv4 loopback.
package ingress

import (
	"bufio"
	"context"
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
	"time"
)

// Router says where a connection from node from to node to must go: the
// mesh relay from->to.
type Router interface {
	PeerAddr(from, to string) (string, error)
}

// Owners names the node whose process has pid, and lists the pids of the
// node processes now running.
type Owners interface {
	PIDs() map[int]string
}

// Ingress is one node's advertised peer address.
type Ingress struct {
	to     string
	ln     net.Listener
	router Router
	owners Owners
	log    *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	stats  Stats
}

// Stats counts what an Ingress did with the connections it accepted.
type Stats struct {
	Routed  int64 `json:"routed"`
	Unknown int64 `json:"unknown_owner"`
	// Gone counts connections whose dialer had closed its end before
	// the ingress looked it up: nothing left to route.
	Gone    int64 `json:"gone"`
	Refused int64 `json:"relay_refused"`
	// LastRefusal is the last error dialing a relay.
	LastRefusal string           `json:"last_refusal,omitempty"`
	ByOrigin    map[string]int64 `json:"by_origin"`
}

// Listen starts the ingress of node to on addr ("127.0.0.1:0" picks a port).
func Listen(addr, to string, router Router, owners Owners, log *slog.Logger) (*Ingress, error) {
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("ingress %s: listen on %s: %w", to, addr, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	in := &Ingress{to: to, ln: ln, router: router, owners: owners, log: log.With("ingress", to),
		conns: map[net.Conn]struct{}{}, stats: Stats{ByOrigin: map[string]int64{}}}
	in.wg.Add(1)
	go in.serve()
	return in, nil
}

// Addr is the address nodes dial (the advertised peer address).
func (in *Ingress) Addr() string { return in.ln.Addr().String() }

// TCPAddr is the listening address.
func (in *Ingress) TCPAddr() *net.TCPAddr { return in.ln.Addr().(*net.TCPAddr) }

// Stats returns the counts so far.
func (in *Ingress) Stats() Stats {
	in.mu.Lock()
	defer in.mu.Unlock()
	s := in.stats
	s.ByOrigin = map[string]int64{}
	for k, v := range in.stats.ByOrigin {
		s.ByOrigin[k] = v
	}
	return s
}

// Close stops accepting and cuts every connection.
func (in *Ingress) Close() error {
	in.mu.Lock()
	in.closed = true
	for c := range in.conns {
		c.Close()
	}
	in.mu.Unlock()
	err := in.ln.Close()
	in.wg.Wait()
	return err
}

func (in *Ingress) track(c net.Conn) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.closed {
		c.Close()
		return false
	}
	in.conns[c] = struct{}{}
	return true
}

func (in *Ingress) untrack(c net.Conn) {
	in.mu.Lock()
	delete(in.conns, c)
	in.mu.Unlock()
	c.Close()
}

func (in *Ingress) serve() {
	defer in.wg.Done()
	for {
		c, err := in.ln.Accept()
		if err != nil {
			return
		}
		if !in.track(c) {
			return
		}
		in.wg.Add(1)
		go func() {
			defer in.wg.Done()
			defer in.untrack(c)
			in.forward(c)
		}()
	}
}

func (in *Ingress) count(f func(*Stats)) {
	in.mu.Lock()
	f(&in.stats)
	in.mu.Unlock()
}

func (in *Ingress) forward(c net.Conn) {
	from, err := in.origin(c)
	if err != nil {
		level := slog.LevelWarn
		if errors.Is(err, ErrNotFound) {
			level = slog.LevelDebug // its dialer already closed it: nothing to route
			in.count(func(s *Stats) { s.Gone++ })
		} else {
			in.count(func(s *Stats) { s.Unknown++ })
		}
		in.log.Log(context.Background(), level, "closing a peer connection of unknown origin", "remote", c.RemoteAddr(), "error", err)
		return
	}
	relayAddr, err := in.router.PeerAddr(from, in.to)
	if err != nil {
		in.count(func(s *Stats) { s.Unknown++ })
		in.log.Warn("no relay for the link", "from", from, "to", in.to, "error", err)
		return
	}
	up, err := net.DialTimeout("tcp", relayAddr, 5*time.Second)
	if err != nil {
		// The relay refuses (a reject fault) or is gone: so does the link.
		in.count(func(s *Stats) { s.Refused++; s.LastRefusal = err.Error() })
		return
	}
	if !in.track(up) {
		return
	}
	defer in.untrack(up)
	in.count(func(s *Stats) { s.Routed++; s.ByOrigin[from]++ })
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	<-done
}

// origin finds the node whose process holds the dialing end of c.
func (in *Ingress) origin(c net.Conn) (string, error) {
	remote, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return "", fmt.Errorf("expected a TCP peer, found %v", c.RemoteAddr())
	}
	local := c.LocalAddr().(*net.TCPAddr)
	inode, err := socketInode(remote, local)
	if err != nil {
		return "", err
	}
	pids := in.owners.PIDs()
	for pid, name := range pids {
		if holds(pid, inode) {
			return name, nil
		}
	}
	return "", fmt.Errorf("socket inode %d of %s: held by none of the node processes %v", inode, remote, pids)
}

// ErrNotFound is a connection /proc/net/tcp does not list.
var ErrNotFound = errors.New("not in /proc/net/tcp")

// socketInode finds the inode of the socket whose local end is dialer and
// remote end is listener, in /proc/net/tcp.
func socketInode(dialer, listener *net.TCPAddr) (uint64, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	want := hexAddr(dialer) + " " + hexAddr(listener)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// sl local rem st queues tr retrnsmt uid timeout inode
		if len(fields) < 10 || fields[1]+" "+fields[2] != want {
			continue
		}
		inode, err := strconv.ParseUint(fields[9], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/net/tcp: inode %q: %w", fields[9], err)
		}
		if inode != 0 {
			return inode, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("connection %s -> %s: %w", dialer, listener, ErrNotFound)
}

// hexAddr is addr as /proc/net/tcp writes it: the IPv4 address as a
// little-endian hex word, then the port in hex ("0100007F:1F90").
func hexAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	if ip == nil {
		ip = net.IPv4zero.To4()
	}
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
}

// holds reports whether process pid has socket inode open.
func holds(pid int, inode uint64) bool {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	want := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == want {
			return true
		}
	}
	return false
}
