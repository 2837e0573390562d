package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidaldb/tidal/buildinfo"
	"github.com/tidaldb/tidal/buildinfo/gobuild"
	"github.com/tidaldb/tidal/tcp-relay/control"
	"github.com/tidaldb/tidal/tcp-relay/relay"
)

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestBinary builds tcp-relay, starts it with a config file, drives it
// through the API and stops it with SIGTERM.
func TestBinary(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tcp-relay")
	if out, err := gobuild.Command(context.Background(), "..", gobuild.StampOf(".."), bin, "./tcp-relay").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	version, err := exec.Command(bin, "--version").CombinedOutput()
	if want := buildinfo.Line("tcp-relay"); err != nil || !strings.HasPrefix(string(version), "tcp-relay ") || !strings.Contains(string(version), "(commit ") ||
		strings.Count(string(version), "\n") != 1 {
		t.Errorf("--version: expected one line like %q, found %q (%v)", want, version, err)
	}
	// Regression: a binary a test builds itself said
	// "commit unknown" under GOFLAGS=-buildvcs=false; only `make build`
	// linked the commit in.
	if head, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		if c := strings.TrimSpace(string(head))[:12]; !strings.Contains(string(version), "(commit "+c) {
			t.Errorf("--version names no commit %s (git rev-parse HEAD): %q", c, version)
		}
	}
	help, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("--help: %v", err)
	}
	for _, tp := range relay.Types {
		if !strings.Contains(string(help), tp.Type) {
			t.Errorf("--help does not document fault %q", tp.Type)
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	relayAddr, ctlAddr := freePort(t), freePort(t)
	cfg := filepath.Join(dir, "relays.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`relays:
  - name: echo
    listen: %s
    upstream: %s
    faults:
      - {name: slow, type: latency, latency_ms: 30, direction: upstream}
mesh:
  nodes:
    a: {peer: %[2]s, client: %[2]s}
    b: {peer: %[2]s, client: %[2]s}
`, relayAddr, ln.Addr())), 0o644)
	cmd := exec.Command(bin, "--control", ctlAddr, "--config", cfg)
	logFile, _ := os.Create(filepath.Join(dir, "relay.log"))
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-exited
		}
	}()

	c := control.NewClient(ctlAddr, nil)
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for c.Healthz(ctx) != nil {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile.Name())
			t.Fatalf("control API never came up\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	in, err := c.Relay(ctx, "echo")
	if err != nil || len(in.Faults) != 1 || in.Faults[0].Name != "slow" {
		t.Fatalf("expected relay echo with fault slow from the config, found %+v, %v", in, err)
	}
	if m, err := c.Mesh(ctx); err != nil || len(m.Nodes) != 2 {
		t.Fatalf("expected the config's 2-node mesh, found %+v, %v", m, err)
	}

	conn, err := net.Dial("tcp", relayAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	start := time.Now()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	conn.Write([]byte("x"))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 25*time.Millisecond {
		t.Errorf("expected the config's 30ms latency, round trip took %v", d)
	}
	if _, err := c.AddFault(ctx, "echo", relay.Spec{Type: "reset"}); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 1)); err == nil || !strings.Contains(err.Error(), "reset") {
		t.Errorf("expected the API's reset fault to reset the connection, found %v", err)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("expected a clean exit on SIGTERM, found %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("tcp-relay did not exit on SIGTERM")
	}
	if _, err := net.DialTimeout("tcp", relayAddr, time.Second); err == nil {
		t.Error("expected the relay port closed after exit")
	}
}
