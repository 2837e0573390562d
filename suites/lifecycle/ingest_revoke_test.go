package lifecycle

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// A gRPC ingest stream is authenticated when it opens; a SIGHUP that
// takes its credential away must end it, not only refuse new streams and
// HTTP requests. On a real secured node with --grpc-addr: three streams
// write with three tokens; the tokens file then loses the first and
// lowers the second to reader, and the node gets SIGHUP. The first
// stream's next write is a definite 401, the second's a definite 403, the
// third stream carries on; the node counts and logs the streams it ended.
var _ = Describe("the gRPC ingest stream across a tokens reload", Label("lifecycle"), func() {
	It("Regression: revoked token ends open ingest streams", func(ctx SpecContext) {
		grpcAddr := freeAddrs(1)[0]
		s := startSecuredNode("ingest-revoke", "--grpc-addr", grpcAddr)
		lowered := addToken(s.tokens, "tok-lowered", "writer")
		Expect(s.cmd.Process.Signal(syscall.SIGHUP)).To(Succeed())
		Eventually(s.out.String).WithTimeout(30*time.Second).Should(ContainSubstring("tokens file reloaded"), "the node took the added token")

		open := func(token string) *client.IngestStream {
			st, err := client.NewIngestStream(grpcAddr, client.WithTLS(s.tls("")), client.WithToken(token),
				client.WithRetries(0), client.WithTimeout(30*time.Second))
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(st.Close)
			return st
		}
		n := 0
		write := func(st *client.IngestStream) error {
			n++
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := st.WriteSignals(wctx, []client.Event{{ID: fmt.Sprintf("revoke-%d", n), Entity: 7, Signal: "view"}})
			return err
		}
		removed, lower, kept := open(s.secrets["writer"]), open(lowered), open(s.secrets["admin"])
		for _, st := range []*client.IngestStream{removed, lower, kept} {
			Expect(write(st)).To(Succeed(), "a write on a stream before the reload")
		}

		// The tokens file loses tok-writer and lowers tok-lowered to reader.
		data, err := os.ReadFile(s.tokens)
		Expect(err).NotTo(HaveOccurred())
		var lines []string
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) == 3 && f[0] == "tok-writer":
				continue
			case len(f) == 3 && f[0] == "tok-lowered":
				line = strings.Join([]string{f[0], "reader", f[2]}, " ")
			}
			lines = append(lines, line)
		}
		Expect(os.WriteFile(s.tokens, []byte(strings.Join(lines, "\n")+"\n"), 0o600)).To(Succeed())
		Expect(s.cmd.Process.Signal(syscall.SIGHUP)).To(Succeed())

		// The removed token's open stream stops taking writes. (Polled:
		// the reload is asynchronous to the signal.)
		var last error
		Eventually(func() bool {
			last = write(removed)
			return last != nil
		}).WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(BeTrue(),
			"the stream opened with the removed token still acknowledges writes after SIGHUP")
		Expect(client.IsUnauthenticated(last) && !client.IsIndefinite(last)).To(BeTrue(), "a write on the stream whose token was removed: %v", last)
		err = write(lower)
		Expect(client.IsPermissionDenied(err) && !client.IsIndefinite(err)).To(BeTrue(), "a write on the stream whose token was lowered to reader: %v", err)
		Expect(write(kept)).To(Succeed(), "the stream whose token stayed")

		hc := s.httpClient("")
		_, metrics := s.do(hc, s.secrets["admin"], "GET", "/metrics", "")
		Expect(string(metrics)).To(And(
			ContainSubstring(`tidal_ingest_streams_ended_total{reason="unauthenticated"} 1`),
			ContainSubstring(`tidal_ingest_streams_ended_total{reason="permission_denied"} 1`)), "the node counts the streams it ended")
		Expect(s.out.String()).To(ContainSubstring("ingest streams ended: their credentials are no longer valid"))
		s.stop()
	}, SpecTimeout(3*time.Minute))
})
