package certs

import (
	"fmt"
	"io/fs"
	"os"
	"slices"
	"syscall"
)

// CheckKeyPermissions returns an error unless a private key file of mode
// owned by uid:gid is private enough for a process whose groups (primary
// and supplementary, see ProcessGroups) are groups. path only names the
// file in the error.
//
// A key may be accessible to its owner only (at most 0700). As in
// CockroachDB, a key owned by root whose group is one of the process's
// may also be group-readable (at most 0740): that is how Kubernetes
// projects a Secret with defaultMode 0400 for a pod with an fsGroup
// (root:fsGroup, 0440), and root handing a file to a group is a choice
// only root can make. Group write or execute, and any access for others,
// are refused either way.
func CheckKeyPermissions(path string, mode fs.FileMode, uid, gid int, groups []int) error {
	perm := mode.Perm()
	if perm&0o077 == 0 {
		return nil
	}
	if uid == 0 && slices.Contains(groups, gid) && perm&^0o740 == 0 {
		return nil
	}
	return fmt.Errorf("%s: key file mode is %#o (owner %d:%d), expected no access for group and others (chmod 600), "+
		"or a root-owned file readable by a group of this process %v and no one else (in Kubernetes: a Secret with defaultMode: 0400 and the pod's fsGroup)",
		path, perm, uid, gid, groups)
}

// ProcessGroups are the groups whose access this process has: its group
// and its supplementary groups (where Kubernetes puts the fsGroup).
func ProcessGroups() []int {
	groups := []int{os.Getgid()}
	if more, err := os.Getgroups(); err == nil {
		for _, g := range more {
			if !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
	}
	return groups
}

// checkKeyFile applies CheckKeyPermissions to a key file as st describes
// it. Where the owner cannot be read (not a Unix stat), only owner-only
// modes pass.
func checkKeyFile(path string, st fs.FileInfo) error {
	uid, gid := -1, -1
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		uid, gid = int(sys.Uid), int(sys.Gid)
	}
	return CheckKeyPermissions(path, st.Mode(), uid, gid, ProcessGroups())
}
