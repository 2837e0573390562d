package ci

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

// rawGoBuild matches a `go build` a program starts itself.
var rawGoBuild = regexp.MustCompile(`exec\.Command(Context)?\([^)]*"go",\s*"build"`)

// rawGoBuilds lists the Go files in fsys that start `go build` themselves
// instead of through buildinfo/gobuild (which links in the version and
// commit as `make build` does). store/ holds run output, not source.
func rawGoBuilds(fsys fs.FS) ([]string, error) {
	var found []string
	err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == "store" || path == "bin" || strings.HasPrefix(d.Name(), ".") && path != "." {
				return fs.SkipDir
			}
			return nil
		}
		// gobuild itself, and this file, whose samples are plain builds.
		if !strings.HasSuffix(path, ".go") || strings.HasPrefix(path, "buildinfo/gobuild/") || path == "ci/gobuild_test.go" {
			return nil
		}
		data, err := fs.ReadFile(fsys, path)
		if err != nil {
			return err
		}
		if rawGoBuild.Match(data) {
			found = append(found, path)
		}
		return nil
	})
	return found, err
}

// Regression: the suites, harness tests and benchmarks
// built their binaries with a plain `go build`, which under
// GOFLAGS=-buildvcs=false links no commit: their `--version` and start-up
// log said "commit unknown". Every such build goes through gobuild.Command.
func TestEveryBuildLinksTheCommit(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	found, err := rawGoBuilds(os.DirFS(root))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range found {
		t.Errorf("%s runs `go build` itself: use gobuild.Command (buildinfo/gobuild) so the binary names its commit", path)
	}
}

// The check says false: a plain `go build` in a test is found, one through
// gobuild is not.
func TestRawGoBuildsFindsAPlainBuild(t *testing.T) {
	fsys := fstest.MapFS{
		"suites/x/x_test.go":           {Data: []byte(`cmd := exec.Command("go", "build", "-o", out, "./tidal-server")`)},
		"bench/y.go":                   {Data: []byte(`cmd := exec.CommandContext(ctx, "go", "build", "-tags", "t", "-o", out, pkg)`)},
		"harness/z_test.go":            {Data: []byte(`cmd := gobuild.Command(ctx, root, gobuild.StampOf(root), out, pkg)`)},
		"buildinfo/gobuild/gobuild.go": {Data: []byte(`cmd := exec.CommandContext(ctx, "go", args...)`)},
		"store/run/copy.go":            {Data: []byte(`exec.Command("go", "build")`)},
	}
	found, err := rawGoBuilds(fsys)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"bench/y.go", "suites/x/x_test.go"}
	if strings.Join(found, " ") != strings.Join(want, " ") {
		t.Errorf("found %v, expected %v", found, want)
	}
}
