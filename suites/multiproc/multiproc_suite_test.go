// The multiproc suite: clusters of real tidal-server processes, every link
// through a relay: replication, failover, catch-up, membership.
package multiproc

import (
	"os"
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
	dir, err := fixture.BuildTemp("multiproc")
	Expect(err).NotTo(HaveOccurred())
	return []byte(dir)
}, func(dir []byte) {
	bins = fixture.At(string(dir))
})

var _ = SynchronizedAfterSuite(func() {}, func() {
	if bins != nil {
		os.RemoveAll(bins.Dir)
	}
})
