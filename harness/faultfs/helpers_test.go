package faultfs

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// requireFUSE skips tests that need a FUSE mount where there can be none.
// CI runs them as root with /dev/fuse.
func requireFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("faultfs tests mount FUSE filesystems: they need root and /dev/fuse (CI has both); skipped as a non-root user")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("faultfs tests mount FUSE filesystems: they need /dev/fuse (CI has it): %v", err)
	}
}

// mountForTest mounts a faultfs over a fresh backing directory and
// unmounts it in cleanup.
func mountForTest(t testing.TB, opts Options) (f *FS, backing, mnt string) {
	t.Helper()
	requireFUSE(t)
	dir := t.TempDir()
	backing, mnt = filepath.Join(dir, "backing"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(backing, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := Mount(backing, mnt, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Unmount(); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
		assertNotMounted(t, mnt)
	})
	return f, backing, mnt
}

// assertNotMounted fails if mnt is still in the mount table.
func assertNotMounted(t testing.TB, mnt string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Errorf("read mount table: %v", err)
		return
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) > 1 && f[1] == mnt {
			t.Errorf("%s is still mounted after Unmount: %s", mnt, strings.TrimSpace(line))
		}
	}
}

// readTree walks the mount: every path with its content, and which paths
// share an inode.
func readTree(t testing.TB, root string) (map[string]mEntry, map[uint64][]string) {
	t.Helper()
	tree := map[string]mEntry{}
	inodes := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			tree[rel] = mEntry{dir: true}
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		ino := info.Sys().(*syscall.Stat_t).Ino
		inodes[ino] = append(inodes[ino], rel)
		tree[rel] = mEntry{data: string(data)}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return tree, inodes
}

// diffTrees describes how got differs from want (names, kinds, contents),
// "" if it does not.
func diffTrees(want, got map[string]mEntry) string {
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(want)) {
		w := want[p]
		g, ok := got[p]
		switch {
		case !ok:
			fmt.Fprintf(&b, "  missing %s (want %s)\n", p, describe(w))
		case g.dir != w.dir || g.data != w.data:
			fmt.Fprintf(&b, "  %s: want %s, got %s\n", p, describe(w), describe(g))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[p]; !ok {
			fmt.Fprintf(&b, "  unexpected %s (%s)\n", p, describe(got[p]))
		}
	}
	return b.String()
}

func describe(e mEntry) string {
	if e.dir {
		return "directory"
	}
	if len(e.data) > 40 {
		return fmt.Sprintf("%d bytes %q...", len(e.data), e.data[:40])
	}
	return fmt.Sprintf("%q", e.data)
}

// diffLinks checks that the paths sharing a model inode are exactly the
// paths sharing a real inode.
func diffLinks(want map[string]mEntry, got map[uint64][]string) string {
	group := func(paths []string) string { slices.Sort(paths); return strings.Join(paths, " ") }
	wantGroups := map[string]bool{}
	byIno := map[int][]string{}
	for p, e := range want {
		if !e.dir {
			byIno[e.ino] = append(byIno[e.ino], p)
		}
	}
	for _, paths := range byIno {
		wantGroups[group(paths)] = true
	}
	var b strings.Builder
	for _, paths := range got {
		if g := group(paths); !wantGroups[g] {
			fmt.Fprintf(&b, "  names of one inode: got {%s}, which the model does not have as one file\n", g)
		}
	}
	return b.String()
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func isErrno(err error, want syscall.Errno) bool {
	var errno syscall.Errno
	return errors.As(err, &errno) && errno == want
}
