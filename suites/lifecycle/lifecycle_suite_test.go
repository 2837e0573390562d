// The lifecycle suite: one real tidal-server process through start, load,
// kill -9, restart, SIGTERM and WAL inspection.
package lifecycle

import (
	"os"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
)

var bins *fixture.Binaries

func TestLifecycle(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lifecycle", Label("lifecycle"))
}

var _ = SynchronizedBeforeSuite(func() []byte {
	dir, err := fixture.BuildTemp("lifecycle")
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
