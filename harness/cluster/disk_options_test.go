package cluster

import (
	"os"
	"strings"
	"testing"
)

// Disk faults run on docker too: faultfs under a container's node
// directory allows other users exactly when the container runs as another
// user than the harness (a root harness runs its containers as uid
// 65532); a process node needs no such option; any other backend is
// refused by name.
func TestDiskMountOptions(t *testing.T) {
	if o, err := diskMountOptions("process"); err != nil || o.AllowOther {
		t.Errorf("process: expected the defaults, found %+v, %v", o, err)
	}
	if o, err := diskMountOptions("docker"); err != nil || o.AllowOther != (os.Geteuid() == 0) {
		t.Errorf("docker (euid %d): expected AllowOther %t, found %+v, %v", os.Geteuid(), os.Geteuid() == 0, o, err)
	}
	if _, err := diskMountOptions("podman"); err == nil || !strings.Contains(err.Error(), "found podman") {
		t.Errorf("podman: expected a refusal naming it, found %v", err)
	}
}
