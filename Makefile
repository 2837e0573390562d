# tidal — see README.md. Every target works from a fresh clone with only Go
# installed; Go tools (ginkgo, benchstat) come from go.mod's tool lines.
GO        ?= go
BIN       := $(CURDIR)/bin
GINKGO    := $(GO) tool ginkgo
# Packages with unit tests (the suites under suites/ run real binaries).
UNIT_PKGS := ./buildinfo/... ./usage/... ./tidal-server/... ./tcp-relay/... ./harness/... ./bench/... ./deploy/... ./ci/...
FUZZTIME  ?= 10s
# --version of every binary: `git describe`, or "dev" outside a checkout.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The commit, linked in too: a build with -buildvcs=false embeds no VCS stamp.
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS   := -X github.com/tidaldb/tidal/buildinfo.Version=$(VERSION) -X github.com/tidaldb/tidal/buildinfo.Commit=$(COMMIT)

.PHONY: all build test unit fuzz suites chaos runbook e2e bench lint clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/tidal-server ./tidal-server
	CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/tcp-relay ./tcp-relay
	@if [ -d harness/cmd/tidal-chaos ] && ls harness/cmd/tidal-chaos/*.go >/dev/null 2>&1; then \
		CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/tidal-chaos ./harness/cmd/tidal-chaos; fi
	@if [ -d harness/cmd/tidal-stress ] && ls harness/cmd/tidal-stress/*.go >/dev/null 2>&1; then \
		CGO_ENABLED=0 $(GO) build -ldflags '$(LDFLAGS)' -o $(BIN)/tidal-stress ./harness/cmd/tidal-stress; fi

# make test: lint, unit tests under the race detector, a short run of every
# fuzz target, then the fast suites on real processes: multiproc, lifecycle
# and the specs labelled smoke — the chaos smoke run, one planted-bug run
# (so every CI run shows a checker saying false on a real cluster), and the
# shortest runbook page (so the runbook parser and runner never rot).
test: lint unit fuzz suites

# Tests in files built only with the tidalbugs tag (first line
# //go:build tidalbugs): the planted defects' own tests
# (tidal-server/bugs/on_test.go, */bugs_on_test.go) and those that need a
# tidalbugs build's test hooks (*_tidalbugs_test.go: vectors.Store's
# SetAfterChunk and PinnedQueries, replica.SetTestNewerEntryFormat). The
# second unit step runs exactly these, by name, in their packages; the
# first already ran everything else.
TIDALBUGS_TEST_FILES := $(shell grep -l '^//go:build tidalbugs' $$(find tidal-server -name '*_test.go'))
TIDALBUGS_TEST_PKGS  := $(sort $(addprefix ./,$(dir $(TIDALBUGS_TEST_FILES))))
TIDALBUGS_TESTS      := $(shell grep -ho '^func Test[A-Za-z0-9_]*' $(TIDALBUGS_TEST_FILES) | sed 's/^func //' | paste -sd'|' -)

unit:
	$(GO) test -race -count=1 -timeout 15m $(UNIT_PKGS)
	$(GO) test -race -count=1 -tags tidalbugs -run '^($(TIDALBUGS_TESTS))$$' $(TIDALBUGS_TEST_PKGS)
	cd bench/storeload && $(GO) vet ./... && $(GO) test -count=1 ./...   # its own module (etcd's client)

fuzz:
	@./ci/fuzz $(FUZZTIME)

suites: build
	$(GINKGO) -r --keep-going --procs=1 --timeout=15m --label-filter='multiproc || lifecycle || smoke' ./suites

# make chaos: every chaos scenario and planted-bug spec; JUnit report in
# store/junit/chaos.xml, run stores under store/chaos-suite/.
chaos: build
	@mkdir -p store/junit
	$(GINKGO) -r --keep-going --procs=1 --timeout=60m --label-filter='chaos' --output-dir=$(CURDIR)/store/junit --junit-report=chaos.xml ./suites

# make chaos-etcd: the harness against etcd (issue 15), one fault family
# per spec; asserts the harness ran and judged, not that etcd is correct.
# Needs etcd (Debian's etcd-server; installed with apt-get when absent and
# run as root). JUnit report in store/junit/chaos-etcd.xml.
.PHONY: chaos-etcd
chaos-etcd:
	@./ci/install-etcd
	@mkdir -p store/junit
	$(GINKGO) --keep-going --procs=1 --timeout=30m --label-filter='etcd' --output-dir=$(CURDIR)/store/junit --junit-report=chaos-etcd.xml ./suites/etcd

# make images: tidal-server and tcp-relay images FROM scratch around the
# static binaries, tagged :$(VERSION), :dev and by content (bin-<hash>).
# Needs only a Docker daemon: the legacy builder, nothing pulled.
.PHONY: images
images: build
	$(GO) run ./harness/cmd/tidal-images --version '$(VERSION)' --server $(BIN)/tidal-server --relay $(BIN)/tcp-relay

# make runbook: every page of runbooks/ executed block by block against a
# live cluster under load, judged by the checkers and the page's own
# availability budget (suites/runbook). JUnit report in
# store/junit/runbook.xml, the summary table in store/runbook-suite/summary.txt.
runbook: build
	@mkdir -p store/junit
	$(GINKGO) -r --keep-going --procs=1 --timeout=20m --label-filter='runbook' --output-dir=$(CURDIR)/store/junit --junit-report=runbook.xml ./suites/runbook

# make e2e: the deployment a user runs (deploy/compose.yaml over mutual TLS,
# the docker CLI's faults) and the chaos workload on the container backend;
# needs a Docker daemon (specs skip, loudly, without one) and docker-compose
# (ci/e2e installs it). JUnit report in store/junit/e2e.xml.
e2e: build
	@mkdir -p store/junit
	$(GINKGO) --keep-going --procs=1 --timeout=30m --label-filter='e2e' --output-dir=$(CURDIR)/store/junit --junit-report=e2e.xml ./suites/e2e

bench: build
	@./ci/bench

# tidal vs etcd and tcp-relay vs direct vs Toxiproxy (installs etcd and Toxiproxy when absent).
.PHONY: bench-compare
bench-compare: build
	@./ci/bench -side-by-side

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags tidalbugs ./tidal-server/...

clean:
	rm -rf $(BIN) store tidal-data
