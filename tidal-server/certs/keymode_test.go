package certs

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Regression (container helper's note: the k8s key permission
// problem): Kubernetes projects a Secret with defaultMode 0400 and the
// pod's fsGroup as a root-owned file of mode 0440 whose group is the
// fsGroup. The loader refused every group-readable key, so a pod could
// never load its node.key. As CockroachDB does, a key owned by root whose
// group is one of the process's may be group-readable; nothing else may.
func TestLoadAcceptsRootOwnedGroupReadableKey(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("NOT CHECKED here: making a root-owned key needs root (CI runs as root); TestCheckKeyPermissions covers the rule")
	}
	ca := newCA(t)
	key := func(dir string) string { return filepath.Join(dir, NodeKeyFile) }

	// As kubelet writes it: owner root, group = a group of this process.
	dir := nodeDir(t, ca, 3)
	if err := os.Chown(key(dir), 0, os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(key(dir), 0o440); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err != nil {
		t.Fatalf("root:%d 0440 node.key: expected it loaded (the Kubernetes Secret-with-fsGroup case), found %v", os.Getgid(), err)
	}

	// Root-owned but its group is not one of this process's: refused.
	other := unusedGroup(t)
	dir = nodeDir(t, ca, 3)
	if err := os.Chown(key(dir), 0, other); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(key(dir), 0o440); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("root:%d 0440 node.key, a group this process is not in: expected a refusal saying chmod 600, found %v", other, err)
	}

	// Root-owned, its group ours, but others may read it too: refused.
	dir = nodeDir(t, ca, 3)
	if err := os.Chown(key(dir), 0, os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(key(dir), 0o444); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil {
		t.Fatal("root-owned 0444 node.key: expected a refusal (others may read it), found none")
	}
}

// unusedGroup returns a gid that is not among this process's groups.
func unusedGroup(t *testing.T) int {
	t.Helper()
	mine := ProcessGroups()
	for gid := 54321; gid < 54400; gid++ {
		if !contains(mine, gid) {
			return gid
		}
	}
	t.Fatalf("no gid in 54321..54399 outside this process's groups %v", mine)
	return 0
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// The rule itself, for any owner: at most 0700, or, owned by root with
// one of the process's groups as its group, at most 0740 (group read).
func TestCheckKeyPermissions(t *testing.T) {
	const me, ours, theirs = 1000, 1000, 2000
	groups := []int{ours, 4000} // primary, supplementary (an fsGroup)
	for _, c := range []struct {
		mode     fs.FileMode
		uid, gid int
		ok       bool
	}{
		{0o600, me, ours, true},
		{0o400, me, theirs, true},
		{0o700, me, ours, true},
		{0o640, me, ours, false}, // group-readable and not root's
		{0o604, me, ours, false},
		{0o440, 0, ours, true},    // kubelet: defaultMode 0400 + fsGroup
		{0o440, 0, 4000, true},    // the fsGroup as a supplementary group
		{0o640, 0, ours, true},    // root may keep write for itself
		{0o740, 0, ours, true},    // CockroachDB's maximum
		{0o440, 0, theirs, false}, // a group this process is not in
		{0o460, 0, ours, false},   // group write
		{0o450, 0, ours, false},   // group execute
		{0o444, 0, ours, false},   // others
		{0o400, 0, theirs, true},  // owner-only is fine whoever owns it
	} {
		err := CheckKeyPermissions("k", c.mode, c.uid, c.gid, groups)
		if (err == nil) != c.ok {
			t.Errorf("mode %#o owner %d:%d, process groups %v: expected ok=%v, found %v", c.mode, c.uid, c.gid, groups, c.ok, err)
		}
		if err != nil && !strings.Contains(err.Error(), "k: key file mode is") {
			t.Errorf("mode %#o owner %d:%d: expected the error to name the file and mode, found %v", c.mode, c.uid, c.gid, err)
		}
	}
}
