// The etcd suite: the harness run against etcd, a database no
// one here wrote, one fault family per spec. Its specs assert that the
// harness ran and judged — the faults took effect, every checker gave a
// verdict, the store and report exist — not that etcd is correct: what
// the harness finds in etcd goes to docs/findings.md.
package etcd

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestEtcd(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "etcd", Label("etcd"))
}
