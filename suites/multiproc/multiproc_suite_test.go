// The multiproc suite: clusters of real tidal-server processes, every link
// through a relay: replication, failover, catch-up, membership.
package multiproc

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
)

var bins *fixture.Binaries

func TestMultiproc(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "multiproc", Label("multiproc"))
}

var _ = SynchronizedBeforeSuite(func() []byte {
	dir, err := os.MkdirTemp("", "tidal-multiproc-bin-")
	Expect(err).NotTo(HaveOccurred())
	_, err = fixture.Build(dir)
	Expect(err).NotTo(HaveOccurred())
	return []byte(dir)
}, func(dir []byte) {
	bins = &fixture.Binaries{Dir: string(dir), TidalServer: filepath.Join(string(dir), "tidal-server"), TCPRelay: filepath.Join(string(dir), "tcp-relay")}
})

var _ = SynchronizedAfterSuite(func() {}, func() {
	if bins != nil {
		os.RemoveAll(bins.Dir)
	}
})
