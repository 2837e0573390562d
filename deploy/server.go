// Package deploy validates the deployment artifacts in this directory —
// compose.yaml and the Kubernetes manifests in k8s/ — against the real
// tidal-server: no cluster runs in `make test`, so a manifest is checked by
// what would break it. Manifests decode strictly into the compose subset
// and the k8s.io/api types (an unknown or misspelled field is an error);
// every node's arguments parse as `tidal-server run` parses them; probe
// paths are routes of the client API; ports, ids, peers, volumes and
// certificates agree with the flags. Each problem names the file, the
// object and the field.
package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/certs"
	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

// Pending names flags the artifacts use for features the server does not
// have yet, with the issue that brings them. A pending flag the server
// refuses is left out of the parse check and reported as a note (loudly,
// never silently); once the server accepts it, the check fails until the
// entry is removed here, so the list cannot go stale.
var Pending = map[string]string{}

// Server is what the artifacts are checked against.
type Server interface {
	// CheckRun returns an error if tidal-server would refuse args (the
	// words after the binary, starting with "run") at start.
	CheckRun(args []string) error
	// ServesGET returns an error unless GET path is a route of the
	// client API that answers a healthy node with 200.
	ServesGET(path string) error
	// KeyAccepted returns an error if the server, running with the
	// process groups given, refuses a node key file of this mode owned by
	// uid:gid.
	KeyAccepted(mode fs.FileMode, uid, gid int, groups []int) error
}

// Binary is the real tidal-server: arguments are checked by running
// `tidal-server ARGS --help`, which parses every flag as a start would
// (unknown flags, bad values) and then prints help instead of starting.
// Routes are checked against the API handler itself, and key files
// against package certs' rule.
type Binary struct{ Path string }

var _ Server = Binary{}

// CheckRun implements Server.
func (b Binary) CheckRun(args []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.Path, append(slices.Clone(args), "--help")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.IndexByte(msg, '\n'); i >= 0 {
			msg = msg[:i]
		}
		return fmt.Errorf("tidal-server refuses the arguments: %s (%v)", strings.TrimPrefix(msg, "error: "), err)
	}
	return nil
}

// probeBackend is a healthy node as far as the probes can tell: it has a
// leader and is caught up. Any other call is a probe path that is not a
// probe, and panics into a 500.
type probeBackend struct{ api.Backend }

func (probeBackend) Schema() ledger.Schema  { return ledger.DefaultSchema() }
func (probeBackend) Status() replica.Status { return replica.Status{} }
func (probeBackend) Ready() error           { return nil }

// ServesGET implements Server.
func (Binary) ServesGET(path string) (err error) {
	h := api.New(probeBackend{}, api.Options{})
	rec := httptest.NewRecorder()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("GET %s: expected a probe route, found a route that needs more than a healthy node (%v)", path, r)
		}
	}()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		return fmt.Errorf("GET %s: expected 200 from a healthy node, found %d %s", path, rec.Code, strings.TrimSpace(rec.Body.String()))
	}
	return nil
}

// KeyAccepted implements Server with the rule the certs loader applies
// to every key it reads (certs.CheckKeyPermissions): a file owned by
// another uid, as kubelet writes a Secret, cannot be made here without
// root, and the loader would judge it by this process's groups, not the
// pod's.
func (Binary) KeyAccepted(mode fs.FileMode, uid, gid int, groups []int) error {
	if err := certs.CheckKeyPermissions("node.key", mode, uid, gid, groups); err != nil {
		return fmt.Errorf("tidal-server refuses it: %w", err)
	}
	return nil
}

// Report is the outcome of a check: Problems make the artifacts invalid;
// Notes are checks left out because the server lacks a pending feature.
type Report struct {
	Problems []error
	Notes    []string
}

// Err joins the problems (nil when there are none).
func (r *Report) Err() error { return errors.Join(r.Problems...) }

func (r *Report) problem(where, format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...)))
}

var unknownFlag = regexp.MustCompile(`unknown flag: --([a-z0-9-]+)`)

// checkRun checks args against the server, leaving out pending flags the
// server refuses (one note per noteWhere) and failing on pending flags it
// accepts.
func checkRun(r *Report, srv Server, where, noteWhere string, args []string) {
	left := slices.Clone(args)
	for {
		err := srv.CheckRun(left)
		if err == nil {
			break
		}
		m := unknownFlag.FindStringSubmatch(err.Error())
		if m == nil {
			r.problem(where, "%v", err)
			return
		}
		why, pending := Pending[m[1]]
		if !pending {
			r.problem(where, "%v", err)
			return
		}
		note := fmt.Sprintf("%s: --%s left out of the parse check: pending %s", noteWhere, m[1], why)
		if !slices.Contains(r.Notes, note) {
			r.Notes = append(r.Notes, note)
		}
		left = slices.DeleteFunc(left, func(a string) bool { f, _, _ := strings.Cut(a, "="); return f == "--"+m[1] })
	}
	for _, a := range left {
		f, _, _ := strings.Cut(a, "=")
		if why, ok := Pending[strings.TrimPrefix(f, "--")]; ok && strings.HasPrefix(f, "--") {
			r.problem(where, "tidal-server accepts %s now: remove it from deploy.Pending (%s)", f, why)
		}
	}
}

// flagValue finds --name=value among args.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// runFlags reads "run --name=value ..." into a map. Deploy artifacts
// spell every flag as --name=value: unambiguous for a reader and for
// this check (a boolean flag needs no value: --name alone).
func runFlags(r *Report, where string, args []string) map[string]string {
	flags := map[string]string{}
	if len(args) == 0 || args[0] != "run" {
		r.problem(where, "expected the arguments to start with the run command, found %q", args)
		return flags
	}
	for _, a := range args[1:] {
		if !strings.HasPrefix(a, "--") {
			r.problem(where, "argument %q: expected --name=value", a)
			continue
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			value = "true"
		}
		if _, dup := flags[name]; dup {
			r.problem(where, "--%s given twice", name)
		}
		flags[name] = value
	}
	return flags
}
