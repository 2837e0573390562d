// Package probe is the loopback measurement of a TCP relay: an echo and a
// sink server, and a client that measures 1-byte round trips, bulk
// throughput and connections per second against them, direct or through
// a relay. bench/relay runs it in one process or as separate ones.
package probe

import (
	"encoding/binary"
	"io"
	"net"
)

// The servers the measurements run against. Both are plain loopback TCP
// servers, one goroutine per connection.
//
// echo writes back every byte it reads.
//
// sink speaks a framed protocol so that a client in another process can
// time a bulk transfer end to end, through any relay: the client sends an
// 8-byte big-endian length n, then n bytes; the sink answers one byte once
// all n have arrived. A connection may carry any number of transfers.

// Listen binds addr ("127.0.0.1:0" for any port) and serves every accepted
// connection with h until the listener is closed.
func Listen(addr string, h func(net.Conn)) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { h(c); c.Close() }()
		}
	}()
	return ln, nil
}

// Echo writes back every byte it reads.
func Echo(c net.Conn) { io.Copy(c, c) }

// Sink acknowledges each framed transfer (see above) with one byte.
func Sink(c net.Conn) {
	buf := make([]byte, 1<<20)
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		left := int64(binary.BigEndian.Uint64(hdr[:]))
		for left > 0 {
			n, err := c.Read(buf[:min(int64(len(buf)), left)])
			left -= int64(n)
			if err != nil {
				return
			}
		}
		if _, err := c.Write([]byte{1}); err != nil {
			return
		}
	}
}
