// The runbook suite: every page of runbooks/ executed block by block
// against a fresh cluster of real processes (started by the page's own
// runbooks/local-cluster.sh) while a ledger workload records a history;
// then the checkers judge the run and the availability budget the page
// states. A runbook that stops working fails here.
package runbook

import (
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/tidaldb/tidal/harness/runbook"
	"github.com/tidaldb/tidal/suites/fixture"
)

var bins *fixture.Binaries

func TestRunbook(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "runbook", Label("runbook"))
}

// binDirEnv names a directory of already-built binaries to run the pages
// against instead of building this tree: a release candidate before it
// ships.
const binDirEnv = "TIDAL_RUNBOOK_BIN"

var _ = SynchronizedBeforeSuite(func() []byte {
	// Nodes an earlier run of this suite left behind when it was killed
	// before its cleanup.
	if root, err := fixture.RepoRoot(); err == nil {
		if killed, _ := runbook.Reap(filepath.Join(root, "store", "runbook-suite")); len(killed) > 0 {
			GinkgoWriter.Printf("reaped nodes an earlier run left: %v\n", killed)
		}
	}
	if dir := os.Getenv(binDirEnv); dir != "" {
		_, err := os.Stat(fixture.At(dir).TidalServer)
		Expect(err).NotTo(HaveOccurred(), "%s=%s: expected tidal-server there", binDirEnv, dir)
		return []byte(dir)
	}
	dir, err := fixture.BuildTemp("runbook")
	Expect(err).NotTo(HaveOccurred())
	return []byte(dir)
}, func(dir []byte) {
	bins = fixture.At(string(dir))
})

var _ = SynchronizedAfterSuite(removePrevious, func() {
	if bins != nil && os.Getenv(binDirEnv) == "" {
		os.RemoveAll(bins.Dir)
	}
})
