package lifecycle

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/suites/fixture"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// newNode starts a one-node "cluster" of a real process; no relays.
func newNode(name string) (*cluster.Cluster, string) {
	dir, err := fixture.SpecDir("lifecycle", name)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			GinkgoWriter.Printf("spec store (logs, data): %s\n", dir)
		} else {
			os.RemoveAll(dir)
		}
	})
	c, err := fixture.NewCluster(bins, dir, 1)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	Expect(c.WaitReady(ctx)).To(Succeed())
	return c, dir
}

var _ = Describe("a single node", func() {
	It("loses no acknowledged write to kill -9 mid-load and folds none twice", func(ctx SpecContext) {
		c, _ := newNode("kill9")
		w := fixture.NewWriter("k9")
		cl := c.Client("n1", client.WithRetries(1))

		load, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.Run(load, 32, func(int) (string, *client.Client) { return "n1", cl })
		}()
		// Kill once a good part of the 10,000 writes are acknowledged, so
		// the kill lands with many writes in flight.
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(60 * time.Second).WithPolling(50 * time.Millisecond).Should(BeNumerically(">=", 5000))
		Expect(c.Kill("n1")).To(Succeed())
		time.Sleep(300 * time.Millisecond) // writes in flight fail against the dead node
		stop()
		<-done
		GinkgoWriter.Printf("before restart: %s\n", w.Summary())

		Expect(c.Start("n1")).To(Succeed())
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		Expect(c.WaitReady(rctx)).To(Succeed())

		// Finish the 10,000 on the restarted node.
		load2, stop2 := context.WithCancel(context.Background())
		done2 := make(chan struct{})
		go func() {
			defer close(done2)
			w.Run(load2, 32, func(int) (string, *client.Client) { return "n1", cl })
		}()
		Eventually(func() int { return len(w.Acked()) + len(w.Unknown()) }).WithTimeout(60 * time.Second).Should(BeNumerically(">=", 10000))
		stop2()
		<-done2
		GinkgoWriter.Printf("after restart: %s\n", w.Summary())

		rctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		rep, err := w.Check(rctx, "n1", c.AdminClient("n1"))
		Expect(err).NotTo(HaveOccurred())
		GinkgoWriter.Println(rep.String())
		Expect(rep.OK()).To(BeTrue(), rep.String())

		// By count as well as by id: each entity's view count equals the
		// number of distinct ids for it that landed.
		want := map[uint64]uint64{}
		err = c.AdminClient("n1").AuditEvents(rctx, func(l client.Location) error {
			if strings.HasPrefix(l.ID, "k9-") {
				want[l.Entity]++
			}
			return nil
		})
		Expect(err).NotTo(HaveOccurred())
		for entity, n := range want {
			e, err := c.AdminClient("n1").Entity(rctx, entity)
			Expect(err).NotTo(HaveOccurred())
			Expect(e.Signals["view"].Count).To(Equal(n), "entity %d", entity)
		}
	}, SpecTimeout(3*time.Minute))

	It("drains on SIGTERM and exits 0, keeping every acknowledged write", func(ctx SpecContext) {
		c, dir := newNode("sigterm")
		w := fixture.NewWriter("term")
		cl := c.Client("n1", client.WithRetries(1))
		load, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.Run(load, 16, func(int) (string, *client.Client) { return "n1", cl })
		}()
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 500))
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		Expect(c.Stop(sctx, "n1")).To(Succeed())
		stop()
		<-done
		log, err := os.ReadFile(filepath.Join(dir, "nodes", "n1", "stdout.log"))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(log)).To(ContainSubstring("exit: status 0"))

		Expect(c.Start("n1")).To(Succeed())
		Expect(c.WaitReady(sctx)).To(Succeed())
		rep, err := w.Check(sctx, "n1", c.AdminClient("n1"))
		Expect(err).NotTo(HaveOccurred())
		Expect(rep.OK()).To(BeTrue(), rep.String())
	}, SpecTimeout(2*time.Minute))

	It("leaves a WAL that `wal verify` accepts after kill -9, holding every acknowledged write", func(ctx SpecContext) {
		c, dir := newNode("walverify")
		w := fixture.NewWriter("wv")
		cl := c.Client("n1", client.WithRetries(1))
		load, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.Run(load, 8, func(int) (string, *client.Client) { return "n1", cl })
		}()
		// Regression: this spec used to write for 2s
		// and never look at what was acked, so an empty WAL passed. Kill
		// once writes are acknowledged, with more in flight.
		Eventually(func() int { return len(w.Acked()) }).WithTimeout(60*time.Second).WithPolling(50*time.Millisecond).Should(BeNumerically(">=", 200), "expected writes acknowledged before the kill")
		Expect(c.Kill("n1")).To(Succeed())
		stop()
		<-done
		GinkgoWriter.Printf("before the kill: %s\n", w.Summary())
		out, err := exec.Command(bins.TidalServer, "wal", "verify", "--data-dir", filepath.Join(dir, "nodes", "n1", "data")).CombinedOutput()
		GinkgoWriter.Printf("%s\n", out)
		// A torn tail after SIGKILL is normal (exit 0 with a note); damage
		// anywhere else exits 3.
		Expect(err).NotTo(HaveOccurred(), string(out))

		// The WAL verify accepted is the one the node restarts from: every
		// acknowledged write is in it.
		Expect(c.Start("n1")).To(Succeed())
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		Expect(c.WaitReady(rctx)).To(Succeed())
		rep, err := w.Check(rctx, "n1", c.AdminClient("n1"))
		Expect(err).NotTo(HaveOccurred())
		Expect(rep.OK()).To(BeTrue(), rep.String())
		Expect(rep.Present).To(BeNumerically(">=", len(w.Acked())), rep.String())
	}, SpecTimeout(2*time.Minute))

	It("refuses bad input with 4xx naming the field and changes nothing", func(ctx SpecContext) {
		c, _ := newNode("badinput")
		admin := c.AdminClient("n1")
		before, err := admin.Digest(ctx)
		Expect(err).NotTo(HaveOccurred())
		cases := []struct {
			body, field string
			status      int
		}{
			{`{"events":[{"id":"a","entity":1,"signal":"view"},{"id":"b","entity":1,"signal":"view","weight":"heavy"}]}`, "events[1].weight", 400},
			{`{"events":[{"id":"a","entity":-1,"signal":"view"}]}`, "events[0].entity", 400},
			{`{"events":[{"id":"a","entity":1,"signal":"nope"}]}`, "events[0].signal", 400},
			{`{"events":[{"entity":1,"signal":"view"}]}`, "events[0].id", 400},
			{`{"events":[{"id":"a","entity":1,"signal":"view","extra":1}]}`, "events[0].extra", 400},
			{`{"events":[]}`, "events", 400},
			{`{"events":[{"id":"a","entity":1,"signal":"view","ts":12}]}`, "events[0].ts", 400},
			{`not json`, "body", 400},
		}
		hc := newHTTP(c)
		for _, tc := range cases {
			status, field := post(c, hc, c.Nodes()[0].ClientAddr, "/v1/signals", "application/json", tc.body)
			Expect(status).To(Equal(tc.status), tc.body)
			Expect(field).To(Equal(tc.field), tc.body)
		}
		status, field := post(c, hc, c.Nodes()[0].ClientAddr, "/v1/signals", "text/plain", `{"events":[{"id":"a","entity":1,"signal":"view"}]}`)
		Expect(status).To(Equal(415))
		Expect(field).To(Equal("Content-Type"))
		big := `{"events":[` + strings.Repeat(`{"id":"x","entity":1,"signal":"view"},`, 300000) + `{"id":"y","entity":1,"signal":"view"}]}`
		status, _ = post(c, hc, c.Nodes()[0].ClientAddr, "/v1/signals", "application/json", big)
		Expect(status).To(Equal(413))
		after, err := admin.Digest(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(after).To(Equal(before), fmt.Sprintf("state changed: %+v -> %+v", before, after))
	}, SpecTimeout(time.Minute))
})
