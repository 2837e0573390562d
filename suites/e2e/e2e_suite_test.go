// The e2e suite: the deployment a user would run, tested as they would use
// it. Three tidal-server containers from deploy/compose.yaml over mutual
// TLS (certificates from deploy/certs.sh), driven with docker-compose, the
// docker CLI's faults (a crashed process restarted by its restart policy,
// `network disconnect`, `pause`), the tidal-server CLI and the HTTP API,
// every spec judged on a recorded history by the harness's checkers; and
// the chaos workload on the container backend.
//
// Every spec that runs containers needs a Docker daemon; without one each
// is skipped with a loud message (CI starts a daemon, see .ci/run and
// ci/e2e).
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/tidaldb/tidal/harness/container"
	"github.com/tidaldb/tidal/suites/fixture"
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "e2e", Label("e2e"))
}

// suiteEnv is what the first process prepares for every spec.
type suiteEnv struct {
	// NoDocker says why no spec can run; empty when a daemon answers.
	NoDocker string `json:"no_docker,omitempty"`
	// Bins is the directory of the static binaries (fixture.Build).
	Bins string `json:"bins"`
	// Image is the tidal-server image built from Bins, by content tag.
	Image string `json:"image"`
	// Compose is how docker-compose is invoked: ["docker", "compose"] (the
	// v2 plugin) or ["docker-compose"] (Debian's 1.29).
	Compose []string `json:"compose"`
	// NoCompose says why the compose specs cannot run (no compose
	// command), with how to install one.
	NoCompose string `json:"no_compose,omitempty"`
}

var (
	env  suiteEnv
	bins *fixture.Binaries
)

var _ = SynchronizedBeforeSuite(func(ctx SpecContext) []byte {
	var e suiteEnv
	cli, err := container.Connect(ctx)
	if err != nil {
		e.NoDocker = err.Error()
		fmt.Fprintf(os.Stderr, "\n*** e2e: EVERY SPEC IS SKIPPED: %v\n*** e2e: start a Docker daemon (CI: .ci/run installs and starts one) to run them.\n\n", err)
		return marshal(e)
	}
	defer cli.Close()
	e.Bins, err = fixture.BuildTemp("e2e")
	Expect(err).NotTo(HaveOccurred())
	e.Image, err = container.ServerImage.Build(ctx, cli, fixture.At(e.Bins).TidalServer)
	Expect(err).NotTo(HaveOccurred(), "building the tidal-server image")
	e.Compose, e.NoCompose = findCompose(ctx)
	return marshal(e)
}, func(data []byte) {
	Expect(json.Unmarshal(data, &env)).To(Succeed())
	if env.Bins != "" {
		bins = fixture.At(env.Bins)
	}
}, NodeTimeout(10*time.Minute))

var _ = SynchronizedAfterSuite(func() {}, func() {
	if env.Bins != "" {
		os.RemoveAll(env.Bins)
	}
})

// requireDocker skips the spec, loudly, when no Docker daemon answered
// at the suite's start: every spec that runs containers calls it first.
func requireDocker() {
	if env.NoDocker != "" {
		msg := "NO DOCKER DAEMON: e2e spec not run: " + env.NoDocker
		fmt.Fprintf(os.Stderr, "*** %s: %s\n", CurrentSpecReport().FullText(), msg)
		Skip(msg)
	}
}

func marshal(e suiteEnv) []byte {
	b, err := json.Marshal(e)
	Expect(err).NotTo(HaveOccurred())
	return b
}

// findCompose prefers the compose plugin (`docker compose`) and falls back
// to the standalone docker-compose; both read deploy/compose.yaml.
func findCompose(ctx context.Context) ([]string, string) {
	var tried []string
	for _, cmd := range [][]string{{"docker", "compose"}, {"docker-compose"}} {
		vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := exec.CommandContext(vctx, cmd[0], append(cmd[1:], "version")...).CombinedOutput()
		cancel()
		if err == nil {
			return cmd, ""
		}
		var ee *exec.ExitError
		why := err.Error()
		if errors.As(err, &ee) {
			why = strings.TrimSpace(string(out))
		}
		tried = append(tried, fmt.Sprintf("%q: %s", strings.Join(cmd, " "), why))
	}
	return nil, "no compose command works (" + strings.Join(tried, "; ") +
		"): install Debian's docker-compose (apt-get install docker-compose) or the compose plugin; ci/e2e does"
}
