package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http/httptest"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The frame check must be able to say no: a planted HTTP/2 server answers
// 204 the way the reference system's relay did (HEADERS, then a DATA
// frame), and the check catches it; the same server's correct 204 passes.
// It needs no Docker daemon.
var _ = Describe("the HTTP/2 frame check", func() {
	It("says no to a 204 with a body and to a reset stream, and yes to a bare 204 (a planted server)", func() {
		addr, cfg := plantedH2Server()
		c, err := dialH2(addr, cfg)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)

		resp, err := c.do("POST", "/good-204", nil, []byte(`{}`))
		Expect(err).NotTo(HaveOccurred())
		Expect(InterceptGomegaFailures(func() { expectNoBody204(resp, "planted good 204") })).To(BeEmpty())

		resp, err = c.do("POST", "/bad-204", nil, []byte(`{}`))
		Expect(err).NotTo(HaveOccurred())
		failures := InterceptGomegaFailures(func() { expectNoBody204(resp, "planted bad 204") })
		Expect(failures).To(ContainElement(ContainSubstring("a 204 with DATA frames")), "%s", resp)
		Expect(failures).To(ContainElement(ContainSubstring("HEADERS without END_STREAM")), "%s", resp)

		resp, err = c.do("POST", "/reset", nil, []byte(`{}`))
		Expect(err).NotTo(HaveOccurred())
		Expect(InterceptGomegaFailures(func() { expectNoBody204(resp, "planted reset") })).
			To(ContainElement(ContainSubstring("the stream was reset")), "%s", resp)

		// And a body cut short of its content-length is caught too.
		resp, err = c.do("GET", "/short-body", nil, nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(InterceptGomegaFailures(func() { expectBody(resp, "200", "planted short body") })).
			To(ContainElement(ContainSubstring("content-length against the DATA frames")), "%s", resp)
	})
})

// plantedH2Server serves HTTP/2 over TLS, frame by frame, answering by
// path: /good-204 (HEADERS with END_STREAM), /bad-204 (HEADERS, then DATA
// "oops"), /reset (RST_STREAM), /short-body (200 declaring 10 bytes,
// sending 5). It returns its address and a client TLS config trusting it.
func plantedH2Server() (string, *tls.Config) {
	// httptest's certificate for 127.0.0.1, without its server.
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	serverCert := ts.TLS.Certificates[0]
	pool := x509.NewCertPool()
	pool.AddCert(ts.Certificate())
	ts.Close()

	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{serverCert}, NextProtos: []string{"h2"}})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(l.Close)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go servePlanted(conn)
		}
	}()
	return l.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
}

func servePlanted(conn net.Conn) {
	defer conn.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(conn, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(conn, conn)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if fr.WriteSettings() != nil {
		return
	}
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	headers := func(fields ...string) []byte {
		hbuf.Reset()
		for i := 0; i+1 < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return append([]byte(nil), hbuf.Bytes()...)
	}
	paths := map[uint32]string{}
	answer := func(id uint32) {
		switch paths[id] {
		case "/good-204":
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headers(":status", "204"), EndHeaders: true, EndStream: true})
		case "/bad-204":
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headers(":status", "204"), EndHeaders: true})
			fr.WriteData(id, true, []byte("oops"))
		case "/reset":
			fr.WriteRSTStream(id, http2.ErrCodeProtocol)
		case "/short-body":
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headers(":status", "200", "content-length", "10"), EndHeaders: true})
			fr.WriteData(id, true, []byte("short"))
		}
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			paths[f.StreamID] = f.PseudoValue("path")
			if f.StreamEnded() {
				answer(f.StreamID)
			}
		case *http2.DataFrame:
			if f.StreamEnded() {
				answer(f.StreamID)
			}
		}
	}
}
