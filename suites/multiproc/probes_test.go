package multiproc

// Probes under a connection flood, on a real secured process: past
// --max-conns a node answers requests 503, but /healthz and /readyz keep
// answering 200, so an orchestrator neither restarts a healthy node nor
// takes it out of service while it sheds connections.

import (
	"bufio"
	"crypto/tls"
	"io"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("probes under a connection flood", func() {
	It("Regression: probes answer under a connection flood", func(ctx SpecContext) {
		const maxConns = 8
		n := startSecuredNodes("probe-flood", 1, "--max-conns", "8")[0]
		h1 := n.tls.Clone()
		h1.NextProtos = []string{"http/1.1"}
		dialer := &tls.Dialer{Config: h1}
		// request sends one HTTP/1.1 request on a new TLS connection and
		// reads its answer; the connection is left open (held) until the
		// spec ends.
		request := func(path string) *http.Response {
			GinkgoHelper()
			c, err := dialer.DialContext(ctx, "tcp", n.addr)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(c.Close)
			_, err = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: tidal\r\n\r\n")
			Expect(err).NotTo(HaveOccurred())
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			Expect(err).NotTo(HaveOccurred(), "GET %s", path)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp
		}
		// The flood: maxConns connections, each answered (so each was
		// accepted) and kept open.
		for range maxConns {
			Expect(request("/v1/top?signal=view").StatusCode).To(Equal(http.StatusOK), "a connection within --max-conns")
		}
		// The cap is reached: another request on a new connection is shed.
		shed := request("/v1/top?signal=view")
		Expect(shed.StatusCode).To(Equal(http.StatusServiceUnavailable), "a request past --max-conns")
		Expect(shed.Header.Get("Retry-After")).NotTo(BeEmpty())

		// Probes on new connections, with the flood still open.
		probe := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: n.tls.Clone(), ForceAttemptHTTP2: true, DisableKeepAlives: true}}
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := probe.Get(n.baseURL() + path)
			Expect(err).NotTo(HaveOccurred(), "GET %s past --max-conns", path)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			Expect(resp.StatusCode).To(Equal(http.StatusOK), "GET %s past --max-conns (%d held): %s", path, maxConns, body)
		}
	})
})
