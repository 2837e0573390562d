// The chaos suite: Jepsen-style runs of real tidal-server processes behind
// the relay mesh, one fault family per spec, judged by every checker.
package chaos

import (
	"os"
	"path/filepath"
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
	dir, err := os.MkdirTemp("", "tidal-chaos-bin-")
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
