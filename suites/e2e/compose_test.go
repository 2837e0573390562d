package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/workload"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/client"
)

var _ = Describe("deploy/compose.yaml, as its README brings it up", func() {
	It("serves writes and linearizable reads through every node over mutual TLS, and the checkers find the recorded history valid", func(ctx SpecContext) {
		d := deployCompose(ctx, "compose-every-node")

		// Secured as the file says: plaintext and a client without a
		// certificate are refused.
		_, err := client.New("http://"+d.addrs["tidal-1"], client.WithRetries(0)).Status(ctx)
		var ae *client.APIError
		Expect(errors.As(err, &ae) && ae.Code == client.CodeTLSRequired).To(BeTrue(), "plain HTTP to a --certs-dir node: expected %s, found %v", client.CodeTLSRequired, err)
		caOnly, err := certs.ClientTLS(filepath.Join(d.certs, "ca"), "")
		Expect(err).NotTo(HaveOccurred())
		_, err = client.New(d.addrs["tidal-2"], client.WithTLS(caOnly), client.WithRetries(0)).Status(ctx)
		Expect(client.IsUnauthenticated(err)).To(BeTrue(), "TLS without a client certificate: expected 401, found %v", err)

		// `tidal-server status` from the host, as the file's header says:
		// every member is listed at the address it is published on, and
		// the leader's progress is reachable through it.
		// (Each node publishes its address once it runs: wait for it.)
		Eventually(ctx, func() error {
			out, err := d.cli(ctx, "status", "--addr", d.addrs["tidal-1"])
			if err != nil {
				return err
			}
			for _, n := range d.names {
				row := fmt.Sprintf(`(?m)^%d\s+\S+\s+%s:7100\s+%s\s+\d+\s+\d+\s+true\s*$`, d.ids[n], n, regexp.QuoteMeta(d.addrs[n]))
				if !regexp.MustCompile(row).MatchString(out) {
					return fmt.Errorf("no status row for %s at %s, reachable:\n%s", n, d.addrs[n], out)
				}
			}
			return nil
		}).WithTimeout(time.Minute).WithPolling(time.Second).Should(Succeed())

		// A mixed workload, round robin over the three nodes: ledger
		// writes, counter adds with linearizable reads, embeddings.
		r := d.record(workload.Config{Kind: workload.Mixed, Concurrency: 9, Duration: 15 * time.Second, Seed: 13, Dim: 1536})
		r.Wait()
		v := r.check(ctx)

		// Through every node, not only the leader.
		writes := okWrites(v.Ops, 0, -1)
		reads := okOps(v.Ops, history.FRead)
		for _, n := range d.names {
			Expect(writes[n]).To(BeNumerically(">", 0), "ok writes per node %v", writes)
			Expect(reads[n]).To(BeNumerically(">", 0), "ok linearizable reads per node %v", reads)
		}
	}, SpecTimeout(8*time.Minute))

	It("speaks HTTP/2 end to end: every 204 is a HEADERS frame ending the stream, with no DATA, on the leader and on the followers that hand it their work", func(ctx SpecContext) {
		d := deployCompose(ctx, "compose-h2-no-body")
		leader, _ := d.waitLeader(ctx, d.names)

		vector := make([]string, 1536)
		for i := range vector {
			vector[i] = strconv.FormatFloat(float64(i%7)/7+0.01, 'f', 3, 64)
		}
		for _, n := range d.names {
			role := "follower"
			if n == leader {
				role = "leader"
			}
			By(fmt.Sprintf("%s (%s)", n, role))
			c, err := dialH2(d.addrs[n], d.tls)
			Expect(err).NotTo(HaveOccurred())
			DeferCleanup(c.Close)

			write := fmt.Sprintf(`{"events":[{"id":"h2-%s","entity":7,"signal":"view"}]}`, n)
			resp, err := c.do("POST", "/v1/signals", nil, []byte(write))
			Expect(err).NotTo(HaveOccurred())
			expectNoBody204(resp, "POST /v1/signals on the "+role)
			Expect(resp.Header.Get("x-tidal-seq")).NotTo(BeEmpty(), "%s", resp)

			// The same write again is acknowledged as a duplicate: a 204
			// as well.
			resp, err = c.do("POST", "/v1/signals", nil, []byte(write))
			Expect(err).NotTo(HaveOccurred())
			expectNoBody204(resp, "a retried POST /v1/signals on the "+role)
			Expect(resp.Header.Get("x-tidal-duplicates")).To(Equal("1"), "%s", resp)

			put := fmt.Sprintf(`{"id":"h2-emb-%s","vector":[%s]}`, n, strings.Join(vector, ","))
			resp, err = c.do("PUT", "/v1/entities/"+strconv.FormatUint(100+d.ids[n], 10)+"/embedding", nil, []byte(put))
			Expect(err).NotTo(HaveOccurred())
			expectNoBody204(resp, "PUT embedding on the "+role)

			// Answers that do have a body carry it whole, in DATA frames
			// ending the stream: a linearizable read (on a follower, the
			// leader's read index) and an error.
			resp, err = c.do("GET", "/v1/entities/7", nil, nil)
			Expect(err).NotTo(HaveOccurred())
			expectBody(resp, "200", "linearizable GET on the "+role)
			var ent client.Entity
			Expect(json.Unmarshal(resp.Body, &ent)).To(Succeed(), "%s", resp)
			Expect(ent.Signals["view"].Count).To(BeNumerically(">=", 1), "%s", resp)

			conflict := fmt.Sprintf(`{"events":[{"id":"h2-%s","entity":8,"signal":"view"}]}`, n)
			resp, err = c.do("POST", "/v1/signals", nil, []byte(conflict))
			Expect(err).NotTo(HaveOccurred())
			expectBody(resp, "409", "an id reused with another payload on the "+role)
		}

		// A leader transfer asked of a follower: 204, no body, and the
		// leadership moves.
		var asked, target string
		for _, n := range d.names {
			if n == leader {
				continue
			}
			if asked == "" {
				asked = n
			} else {
				target = n
			}
		}
		c, err := dialH2(d.addrs[asked], d.tls)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(c.Close)
		resp, err := c.do("POST", "/admin/transfer-leader", nil, []byte(fmt.Sprintf(`{"to":%d}`, d.ids[target])))
		Expect(err).NotTo(HaveOccurred())
		expectNoBody204(resp, "POST /admin/transfer-leader on a follower")
		Eventually(ctx, func() string { l, _ := d.leader(ctx); return l }).WithTimeout(time.Minute).Should(Equal(target))

		// And through net/http's own HTTP/2 client, as tidal's client and
		// curl use it: the protocol is h2 and the 204 has no body.
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: d.tls.Clone(), ForceAttemptHTTP2: true}, Timeout: 30 * time.Second}
		DeferCleanup(hc.CloseIdleConnections)
		for _, n := range d.names {
			body := strings.NewReader(fmt.Sprintf(`{"events":[{"id":"h2-std-%s","entity":9,"signal":"view"}]}`, n))
			req, err := http.NewRequestWithContext(ctx, "POST", "https://"+d.addrs[n]+"/v1/signals", body)
			Expect(err).NotTo(HaveOccurred())
			req.Header.Set("Content-Type", "application/json")
			res, err := hc.Do(req)
			Expect(err).NotTo(HaveOccurred())
			b, err := io.ReadAll(res.Body)
			res.Body.Close()
			Expect(err).NotTo(HaveOccurred())
			Expect(res.Proto).To(Equal("HTTP/2.0"), "%s", n)
			Expect(res.StatusCode).To(Equal(http.StatusNoContent), "%s: %s", n, b)
			Expect(b).To(BeEmpty())
		}
	}, SpecTimeout(6*time.Minute))
})

// expectNoBody204 asserts the shape HTTP/2 requires of a 204: one HEADERS
// frame with END_STREAM, no DATA frame, no reset.
func expectNoBody204(resp h2Response, what string) {
	GinkgoHelper()
	Expect(resp.Status).To(Equal("204"), "%s: %s", what, resp)
	Expect(resp.Reset).To(BeNil(), "%s: the stream was reset: %s", what, resp)
	Expect(resp.DataFrames).To(BeZero(), "%s: a 204 with DATA frames: %s", what, resp)
	Expect(resp.HeadersEndStream).To(BeTrue(), "%s: HEADERS without END_STREAM: %s", what, resp)
	Expect(resp.Frames).To(Equal([]string{"HEADERS+END_STREAM"}), "%s", what)
	Expect(resp.Header.Get("content-length")).To(Or(BeEmpty(), Equal("0")), "%s: %s", what, resp)
}

// expectBody asserts a response with a body: HEADERS without END_STREAM,
// DATA frames ending the stream, as many bytes as content-length says.
func expectBody(resp h2Response, status, what string) {
	GinkgoHelper()
	Expect(resp.Status).To(Equal(status), "%s: %s", what, resp)
	Expect(resp.Reset).To(BeNil(), "%s: the stream was reset: %s", what, resp)
	Expect(resp.HeadersEndStream).To(BeFalse(), "%s: %s", what, resp)
	Expect(resp.DataFrames).To(BeNumerically(">", 0), "%s: %s", what, resp)
	Expect(resp.Ended).To(BeTrue(), "%s: %s", what, resp)
	if cl := resp.Header.Get("content-length"); cl != "" {
		Expect(strconv.Itoa(len(resp.Body))).To(Equal(cl), "%s: content-length against the DATA frames: %s", what, resp)
	}
}

// okOps counts the ok completions of f per node.
func okOps(ops []history.Op, f string) map[string]int {
	out := map[string]int{}
	for _, op := range ops {
		if op.Type == history.OK && op.F == f && op.Process != history.Nemesis {
			out[op.Node]++
		}
	}
	return out
}
