// The planted-bugs suite proves the chaos checkers can fail: it builds
// tidal-server twice, normally and with -tags tidalbugs, switches one
// planted defect on per spec (TIDAL_BUGS, see tidal-server/bugs) and
// expects the harness to call the run invalid through the checker that
// should see that defect. docs/planted-bugs.md describes each defect.
package bugs

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tidaldb/tidal/suites/fixture"
)

// normalBins are the binaries as released; buggyServer is tidal-server
// built with the tidalbugs tag, in the same directory.
var (
	normalBins  *fixture.Binaries
	buggyServer string
)

func TestBugs(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "bugs", Label("chaos", "bugs"))
}

var _ = SynchronizedBeforeSuite(func() []byte {
	dir, err := os.MkdirTemp("", "tidal-bugs-bin-")
	Expect(err).NotTo(HaveOccurred())
	_, err = fixture.Build(dir)
	Expect(err).NotTo(HaveOccurred())
	_, err = fixture.BuildTidalbugs(dir)
	Expect(err).NotTo(HaveOccurred())
	return []byte(dir)
}, func(dir []byte) {
	d := string(dir)
	normalBins = &fixture.Binaries{Dir: d, TidalServer: filepath.Join(d, "tidal-server"), TCPRelay: filepath.Join(d, "tcp-relay")}
	buggyServer = filepath.Join(d, fixture.TidalbugsServer)
})

var _ = SynchronizedAfterSuite(func() {}, func() {
	if normalBins != nil {
		os.RemoveAll(normalBins.Dir)
	}
})
