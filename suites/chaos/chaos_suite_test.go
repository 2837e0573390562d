// The chaos suite: Jepsen-style runs of real tidal-server processes behind
// the relay mesh, one fault family per spec, judged by every checker.
package chaos

import (
	"os"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
)

var bins *fixture.Binaries

func TestChaos(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "chaos", Label("chaos"))
}

var _ = SynchronizedBeforeSuite(func() []byte {
	dir, err := fixture.BuildTemp("chaos")
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
