package relay

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// The upstream dial connects in its Control function (dial_linux.go); the
// net package must still end up with a working connection over IPv4 and
// IPv6, and still report a refused connection as an error.
func TestDialControlConnects(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			host := map[string]string{"tcp4": "127.0.0.1:0", "tcp6": "[::1]:0"}[network]
			ln, err := net.Listen(network, host)
			if err != nil {
				t.Skipf("no %s loopback here: %v", network, err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err == nil {
					io.Copy(c, c)
					c.Close()
				}
			}()
			d := net.Dialer{Timeout: 5 * time.Second, Control: dialControl}
			c, err := d.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatalf("expected the dial to %s to succeed, found %v", ln.Addr(), err)
			}
			defer c.Close()
			if c.RemoteAddr().String() != ln.Addr().String() {
				t.Errorf("expected the remote address %s, found %v", ln.Addr(), c.RemoteAddr())
			}
			mustEcho(t, c)
		})
	}
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		d := net.Dialer{Timeout: 5 * time.Second, Control: dialControl}
		c, err := d.Dial("tcp", addr)
		if err == nil {
			c.Close()
			t.Fatalf("expected the dial to the closed port %s to fail, found a connection", addr)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("expected ECONNREFUSED, found %v", err)
		}
	})
}

// A relay whose upstream refuses makes its client see a refusal too (a
// reset), not an accepted connection that hangs up.
func TestRefusedUpstreamResetsClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	r := startRelay(t, addr)
	// The reset can come before the client's own dial has looked at its
	// socket, or after.
	c, err := net.Dial("tcp", r.Addr().String())
	if err == nil {
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("expected a reset from the relay, found %v", err)
	}
}
