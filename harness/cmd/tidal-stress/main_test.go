package main

import (
	"bytes"
	"encoding/json"
	"github.com/tidaldb/tidal/usage"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/buildinfo"
)

// --version prints the one line every tidal binary prints.
func TestVersion(t *testing.T) {
	var out bytes.Buffer
	cmd := newCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--version"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if want := buildinfo.Line("tidal-stress") + "\n"; out.String() != want {
		t.Errorf("--version: expected %q, found %q", want, out.String())
	}
}

// The table and the JSON carry the drain and the failed ops' latency.
func TestOutputReportsDrainAndFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "out.json")
	var out bytes.Buffer
	cmd := newCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--targets", srv.URL, "--rate", "20", "--duration", "500ms", "--quiet", "--json", path})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, col := range []string{"drain", "failed p99", "all p99"} {
		if !strings.Contains(out.String(), col) {
			t.Errorf("expected the table to have a %q column, found:\n%s", col, out.String())
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Stages []struct {
			Drain  *int64 `json:"drain_ns"`
			Failed struct {
				Count int64 `json:"count"`
			} `json:"failed_latency"`
			All struct {
				Count int64 `json:"count"`
			} `json:"all_latency"`
		} `json:"stages"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Stages) != 1 || res.Stages[0].Drain == nil || res.Stages[0].Failed.Count != 10 || res.Stages[0].All.Count != 10 {
		t.Errorf("expected one stage with drain_ns and 10 failed ops in failed_latency and all_latency, found %s", data)
	}
}

// Regression: usage errors exit alike. tidal-stress exited 1 for an
// unknown flag, the status it also gives an I/O error; every tidal binary
// now exits usage.Code for a command line it refuses.
func TestUsageErrorsExitWithTheUsageCode(t *testing.T) {
	for _, args := range [][]string{{"--no-such-flag"}, {"--rate", "fast"}, {"extra-arg"}} {
		cmd := newCommand()
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		cmd.SetArgs(args)
		err := cmd.Execute()
		if got := exitCode(err); got != usage.Code {
			t.Errorf("tidal-stress %s: exit status %d (%v), expected %d", strings.Join(args, " "), got, err, usage.Code)
		}
	}
}
