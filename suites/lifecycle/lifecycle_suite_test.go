// The lifecycle suite: one real tidal-server process through start, load,
// kill -9, restart, SIGTERM and WAL inspection.
package lifecycle

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/suites/fixture"
)

// bins are the binaries as released; newerServer is tidal-server built
// with the tidalbugs tag, whose hidden --test-newer-format makes a node
// stand for a newer release (format_test.go). A normal build has no such
// flag.
var (
	bins        *fixture.Binaries
	newerServer string
)

func TestLifecycle(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "lifecycle", Label("lifecycle"))
}

var _ = SynchronizedBeforeSuite(func() []byte {
	dir, err := fixture.BuildTemp("lifecycle")
	Expect(err).NotTo(HaveOccurred())
	_, err = fixture.BuildTidalbugs(dir)
	Expect(err).NotTo(HaveOccurred())
	return []byte(dir)
}, func(dir []byte) {
	bins = fixture.At(string(dir))
	newerServer = filepath.Join(bins.Dir, fixture.TidalbugsServer)
})

var _ = SynchronizedAfterSuite(func() {}, func() {
	if bins != nil {
		os.RemoveAll(bins.Dir)
	}
})
