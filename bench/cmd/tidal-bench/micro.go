package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// microResult is one Go benchmark, the median of its -count runs per unit
// ("ns/op", "B/op", "allocs/op", "MB/s" and any b.ReportMetric unit).
type microResult struct {
	Name    string             `json:"name"` // package path below the module, then the benchmark: "tidal-server/wal.BenchmarkAppend/size=1k"
	Runs    int                `json:"runs"`
	Medians map[string]float64 `json:"medians"`
}

// microRun is the micro-benchmark part of a results file.
type microRun struct {
	Command  string        `json:"command"`
	CPU      string        `json:"cpu,omitempty"`      // go test's "cpu:" line (the CPUID brand string)
	Raw      string        `json:"raw"`                // the go test output, benchstat's input, next to the results file
	Failures []string      `json:"failures,omitempty"` // packages whose benchmarks did not build or failed
	Results  []microResult `json:"results"`
}

// runMicro runs the Go benchmarks of pkgs, -count times each so benchstat
// can tell noise from change, writes go test's output to rawPath and
// returns the medians. A package that fails is recorded, not fatal: one
// broken benchmark should not cost the cluster figures.
func runMicro(ctx context.Context, repo string, pkgs []string, count int, benchtime, rawPath string) (*microRun, error) {
	args := append([]string{"test", "-run", "^$", "-bench", ".", "-benchmem",
		"-count", strconv.Itoa(count), "-benchtime", benchtime, "-timeout", "15m"}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repo
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	runErr := cmd.Run()
	if err := os.WriteFile(rawPath, out.Bytes(), 0o644); err != nil {
		return nil, err
	}
	mr := parseBench(out.Bytes())
	mr.Command = "go " + strings.Join(args, " ")
	if runErr != nil && len(mr.Failures) == 0 {
		mr.Failures = append(mr.Failures, fmt.Sprintf("go test: %v", runErr))
	}
	return mr, nil
}

// parseBench reads go test -bench output (the format benchstat reads).
func parseBench(out []byte) *microRun {
	type key struct{ name, unit string }
	values := map[key][]float64{}
	runs := map[string]int{}
	var order []string
	mr := &microRun{}
	pkg := ""
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimPrefix(p, "github.com/tidaldb/tidal/")
			continue
		}
		if c, ok := strings.CutPrefix(line, "cpu: "); ok {
			mr.CPU = strings.TrimSpace(c)
			continue
		}
		if strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "--- FAIL") {
			mr.Failures = append(mr.Failures, line)
			continue
		}
		if !strings.HasPrefix(line, "Benchmark") {
			continue
		}
		f := strings.Fields(line)
		// name, iterations, then value-unit pairs.
		if len(f) < 4 || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			continue
		}
		name := pkg + "." + trimProcs(f[0])
		if runs[name] == 0 {
			order = append(order, name)
		}
		runs[name]++
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			values[key{name, f[i+1]}] = append(values[key{name, f[i+1]}], v)
		}
	}
	for _, name := range order {
		r := microResult{Name: name, Runs: runs[name], Medians: map[string]float64{}}
		for k, vs := range values {
			if k.name == name {
				r.Medians[k.unit] = median(vs)
			}
		}
		mr.Results = append(mr.Results, r)
	}
	return mr
}

// trimProcs drops the -GOMAXPROCS suffix go test adds ("BenchmarkX-2").
func trimProcs(name string) string {
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			return name[:i]
		}
	}
	return name
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// benchstat compares two raw outputs with golang.org/x/perf's benchstat
// (a tool line of go.mod); it returns its table or why it could not.
func benchstat(ctx context.Context, repo, oldRaw, newRaw string) string {
	cmd := exec.CommandContext(ctx, "go", "tool", "benchstat", oldRaw, newRaw)
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("benchstat failed: %v\n%s", err, out)
	}
	return string(out)
}
