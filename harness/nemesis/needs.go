package nemesis

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tidaldb/tidal/harness/history"
)

// Capability is something a fault needs from the database under test.
// A database adapter (package db) says which it has; a run
// refuses, before anything starts, a fault whose database lacks one of
// the capabilities the fault needs, and says which and why.
type Capability string

const (
	// CapNetwork: every peer link crosses its own relay of the mesh, so
	// partitions and slow links act on it.
	CapNetwork Capability = "network"
	// CapKill: a node's process can be SIGKILLed and started again on its data.
	CapKill Capability = "kill"
	// CapPause: a node's process can be SIGSTOPped and SIGCONTed.
	CapPause Capability = "pause"
	// CapLeader: the current leader can be named (leader-targeted faults).
	CapLeader Capability = "leader"
	// CapTransferLeader: leadership can be handed to a chosen node.
	CapTransferLeader Capability = "transfer-leader"
	// CapMembership: a member can be removed, wiped, and its slot added
	// back as a new member.
	CapMembership Capability = "membership"
	// CapDisk: the node's data directory sits on faultfs.
	CapDisk Capability = "disk"
	// CapStop: a node's process can be stopped gracefully (SIGTERM, then
	// a wait for its exit) and its exit status read; 0 means it drained
	// clean.
	CapStop Capability = "stop"
	// CapElectionLog: the node's log says, as it happens, when it
	// campaigns, votes or becomes leader (raft's Info lines in
	// tidal-server's --log-file): power-cut-after-election's trigger.
	CapElectionLog Capability = "election-log"
	// CapClock: the node's clock can be moved while it runs (tidal-server's
	// test-only --test-clock-offset-file).
	CapClock Capability = "clock"
)

// Capabilities is what a database can take: every capability it has, and
// for those it lacks, why (a missing entry reads "not provided").
type Capabilities struct {
	DB    string
	Has   []Capability
	Lacks map[Capability]string
}

// Requires is what k needs from the database: k.Needs when set, else what
// its history f implies. A kind of an f this table does not know (a kind
// added without Needs) needs a capability named after its class, which no
// adapter has until it says so: a new fault is refused, not run blind.
func (k Kind) Requires() []Capability {
	if len(k.Needs) > 0 {
		return slices.Clone(k.Needs)
	}
	var out []Capability
	switch k.F {
	case history.FPartition, history.FSlow:
		out = []Capability{CapNetwork}
	case history.FKill, history.FRestart:
		out = []Capability{CapKill}
	case history.FPause:
		out = []Capability{CapPause}
	case history.FTransferLeader:
		out = []Capability{CapTransferLeader}
	case history.FRemoveMember, history.FAddMember:
		out = []Capability{CapMembership}
	default:
		out = []Capability{Capability(k.Class)}
	}
	if k.Leader {
		out = append(out, CapLeader)
	}
	return out
}

// Missing lists what of need c lacks, each with why.
func (c Capabilities) Missing(need []Capability) []string {
	var out []string
	for _, n := range need {
		if slices.Contains(c.Has, n) {
			continue
		}
		why := c.Lacks[n]
		if why == "" {
			why = "not provided"
		}
		out = append(out, fmt.Sprintf("%s (%s)", n, why))
	}
	return out
}

// CheckMix refuses a mix (kind names, as ParseMix returns them) holding a
// kind the database cannot take, naming every such kind, what it needs
// that the database lacks, and why.
func CheckMix(mix []string, c Capabilities) error {
	var bad []string
	for _, name := range mix {
		k, ok := LookupKind(name)
		if !ok {
			return fmt.Errorf("nemesis %q: unknown fault kind", name)
		}
		if m := c.Missing(k.Requires()); len(m) > 0 {
			bad = append(bad, fmt.Sprintf("%s needs %s", name, strings.Join(m, ", ")))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("nemesis: database %s cannot take: %s", c.DB, strings.Join(bad, "; "))
	}
	return nil
}

// Takeable splits mix into the kinds c can take and those it cannot, in
// mix order: what "all" leaves out for a database.
func (c Capabilities) Takeable(mix []string) (can, cannot []string) {
	for _, name := range mix {
		k, ok := LookupKind(name)
		if ok && len(c.Missing(k.Requires())) == 0 {
			can = append(can, name)
		} else {
			cannot = append(cannot, name)
		}
	}
	return can, cannot
}
