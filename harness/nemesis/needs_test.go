package nemesis

import (
	"slices"
	"strings"
	"testing"
)

// Every kind declares what it needs from a database, and
// a run refuses a fault its database cannot take, saying why.
func TestEveryKindRequiresSomething(t *testing.T) {
	all := Capabilities{DB: "all", Has: []Capability{CapNetwork, CapKill, CapPause, CapLeader, CapTransferLeader, CapMembership, CapDisk, CapStop}}
	for _, k := range Kinds() {
		if len(k.Requires()) == 0 {
			t.Errorf("%s: expected at least one capability, found none", k.Name)
		}
		known := k.Class == Network || k.Class == Links || k.Class == Process || k.Class == Leadership
		if err := CheckMix([]string{k.Name}, all); err != nil && known {
			t.Errorf("%s: a database with every capability refused it: %v", k.Name, err)
		}
	}
	if got := mustKind(t, "kill-leader").Requires(); !slices.Equal(got, []Capability{CapKill, CapLeader}) {
		t.Errorf("kill-leader: expected [kill leader], found %v", got)
	}
}

func TestCheckMixRefusesWithReason(t *testing.T) {
	caps := Capabilities{DB: "toy", Has: []Capability{CapNetwork, CapKill}, Lacks: map[Capability]string{CapPause: "runs in a VM the harness cannot stop"}}
	if err := CheckMix([]string{"partition-halves", "kill-one"}, caps); err != nil {
		t.Fatalf("expected network and kill faults to be taken, found %v", err)
	}
	err := CheckMix([]string{"kill-one", "pause-one", "member-churn"}, caps)
	if err == nil {
		t.Fatal("expected pause-one and member-churn to be refused, found no error")
	}
	for _, want := range []string{"toy", "pause-one needs pause (runs in a VM the harness cannot stop)", "member-churn needs membership (not provided)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("expected the error to say %q, found %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "kill-one") {
		t.Errorf("expected kill-one not to be named, found %v", err)
	}
	// A kind of an unknown class needs a capability named after it.
	k := Kind{Name: "x", F: "scramble-disk", Class: "disk"}
	if got := k.Requires(); !slices.Equal(got, []Capability{"disk"}) {
		t.Errorf("expected an unknown f to need its class, found %v", got)
	}
}
