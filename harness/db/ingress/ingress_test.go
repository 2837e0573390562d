package ingress

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

type routes map[string]string // from -> address

func (r routes) PeerAddr(from, to string) (string, error) {
	a, ok := r[from]
	if !ok {
		return "", fmt.Errorf("no route from %s to %s", from, to)
	}
	return a, nil
}

type pids map[int]string

func (p pids) PIDs() map[int]string { return p }

// upstream answers every line it reads with tag + line, so the test sees
// which relay a connection went through.
func upstream(t *testing.T, tag string) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					fmt.Fprintf(c, "%s %s\n", tag, sc.Text())
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A connection goes through the relay of the node whose
// process dialed it, found from the socket's owner in /proc.
func TestRoutesByDialingProcess(t *testing.T) {
	viaN1, viaN2 := upstream(t, "relay-n1"), upstream(t, "relay-n2")
	child := exec.Command("bash", "-c", `read port; exec 3<>/dev/tcp/127.0.0.1/$port; echo hello >&3; read -t 20 line <&3; echo "$line"`)
	stdin, _ := child.StdinPipe()
	var out strings.Builder
	child.Stdout = &out
	if err := child.Start(); err != nil {
		t.Skipf("bash: %v", err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })

	in, err := Listen("127.0.0.1:0", "n3", routes{"n1": viaN1, "n2": viaN2}, pids{os.Getpid(): "n1", child.Process.Pid: "n2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()

	// This process is n1.
	c, err := net.Dial("tcp4", in.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, "ping")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "relay-n1 ping\n" {
		t.Fatalf("expected the connection of this process (n1) through relay-n1, found %q, %v", line, err)
	}

	// The child is n2.
	fmt.Fprintln(stdin, in.TCPAddr().Port)
	if err := child.Wait(); err != nil {
		t.Fatalf("child: %v (output %q)", err, out.String())
	}
	if got := strings.TrimSpace(out.String()); got != "relay-n2 hello" {
		t.Fatalf("expected the child's connection (n2) through relay-n2, found %q", got)
	}
	if st := in.Stats(); st.ByOrigin["n1"] != 1 || st.ByOrigin["n2"] != 1 || st.Unknown != 0 {
		t.Fatalf("expected one connection from each of n1 and n2, found %+v", st)
	}
}

// A connection from a process that is none of the nodes is closed, not
// forwarded somewhere by guess.
func TestClosesUnknownOrigin(t *testing.T) {
	via := upstream(t, "relay")
	in, err := Listen("127.0.0.1:0", "n3", routes{"n1": via}, pids{os.Getpid() + 1_000_000: "n1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	c, err := net.Dial("tcp4", in.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, "ping")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
		t.Fatalf("expected the connection closed, found an answer %q", line)
	}
	if st := in.Stats(); st.Unknown != 1 || st.Routed != 0 {
		t.Fatalf("expected one connection of unknown origin, found %+v", st)
	}
}

func TestHexAddr(t *testing.T) {
	if got := hexAddr(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}); got != "0100007F:1F90" {
		t.Fatalf("expected 0100007F:1F90, found %s", got)
	}
}
