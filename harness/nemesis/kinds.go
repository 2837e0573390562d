package nemesis

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/history"
)

// Class is what a fault acts on. At most one fault of a class is active at
// a time (see the package comment); faults of different classes compose.
type Class string

const (
	// Network faults rewrite the mesh's grudge, which is one shape at a time.
	Network Class = "network"
	// Links faults slow peer links (latency, bandwidth).
	Links Class = "links"
	// Process faults signal processes or change membership: a node that is
	// killed cannot also be paused, or removed, without the heals clashing.
	Process Class = "process"
	// Leadership faults move the leader (instant).
	Leadership Class = "leadership"
	// Disk faults (disk.go) cut power under the nodes or fail their
	// disks, through faultfs: one at a time across the cluster.
	Disk Class = "disk"
)

// Kind is one fault kind as named in --nemesis lists and schedule.json.
type Kind struct {
	Name string
	// F is the history f of its ops; Sub is FaultValue.Kind (partitions:
	// the shape, kill/pause: "one", "leader", "minority").
	F, Sub string
	Class  Class
	Doc    string
	// Instant faults are over when they complete (restart, transfer); the
	// schedule gives them no duration and they are never healed.
	Instant bool
	// MinNodes is the smallest cluster the kind makes sense on.
	MinNodes int
	// Leader kinds resolve their target at run time; the schedule holds
	// no targets (or, for transfer-leader, only an order of candidates).
	Leader bool
	// OptIn kinds run only when named: "all" leaves them out.
	OptIn bool

	// Needs, when set, is what the kind needs from the database under test
	// (see Capability); empty derives it from F (Kind.Requires).
	Needs []Capability
	// Timeout, when longer than the Runner's ActionTimeout, bounds the
	// kind's inject instead (a rolling restart waits for every node).
	Timeout time.Duration

	// pick chooses a step's targets at generation time from the sorted
	// nodes; nil means none.
	pick  func(r *rand.Rand, nodes []string) []string
	fault Fault
}

func shuffled(r *rand.Rand, nodes []string) []string {
	out := slices.Clone(nodes)
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func pickN(n func(total int) int) func(*rand.Rand, []string) []string {
	return func(r *rand.Rand, nodes []string) []string {
		out := shuffled(r, nodes)[:n(len(nodes))]
		slices.Sort(out)
		return out
	}
}

var (
	one      = pickN(func(int) int { return 1 })
	two      = func(r *rand.Rand, nodes []string) []string { return shuffled(r, nodes)[:2] } // ordered: from, to
	minority = pickN(func(n int) int { return (n - 1) / 2 })
	// someLinks slows every peer link half the time, and the links of one
	// node otherwise (a slow node is a different failure from a slow network).
	someLinks = func(r *rand.Rand, nodes []string) []string {
		if r.IntN(2) == 0 {
			return nil
		}
		return one(r, nodes)
	}
)

func kill(c Cluster, n string) error   { return c.Kill(n) }
func start(c Cluster, n string) error  { return c.Start(n) }
func pause(c Cluster, n string) error  { return c.Pause(n) }
func resume(c Cluster, n string) error { return c.Resume(n) }

var kinds = []Kind{
	{Name: "partition-halves", F: history.FPartition, Sub: "halves", Class: Network, MinNodes: 2, pick: shuffled, fault: partition{"halves"},
		Doc: "split the nodes into a random smaller and larger half that cannot talk"},
	{Name: "isolate-one", F: history.FPartition, Sub: "isolate-one", Class: Network, MinNodes: 2, pick: one, fault: partition{"isolate-one"},
		Doc: "cut one random node off from every other node"},
	{Name: "isolate-leader", F: history.FPartition, Sub: "isolate-leader", Class: Network, MinNodes: 2, Leader: true, fault: partition{"isolate-leader"},
		Doc: "cut the current leader off from every other node"},
	{Name: "majorities-ring", F: history.FPartition, Sub: "majorities-ring", Class: Network, MinNodes: 4, pick: shuffled, fault: partition{"majorities-ring"},
		Doc: "each node sees a majority, no two the same one (needs 4+ nodes)"},
	{Name: "bridge", F: history.FPartition, Sub: "bridge", Class: Network, MinNodes: 3, pick: shuffled, fault: partition{"bridge"},
		Doc: "two halves that cannot talk, joined only through one middle node"},
	{Name: "one-way", F: history.FPartition, Sub: "one-way", Class: Network, MinNodes: 2, pick: two, fault: partition{"one-way"},
		Doc: "one random node cannot send to another; the reverse direction works"},

	{Name: "kill-one", F: history.FKill, Sub: "one", Class: Process, MinNodes: 2, pick: one, fault: signal{sub: "one", do: kill, undo: start, undoing: cluster.Killed},
		Doc: "SIGKILL one random node; heal starts it again on its data"},
	{Name: "kill-leader", F: history.FKill, Sub: "leader", Class: Process, MinNodes: 2, Leader: true, fault: signal{sub: "leader", do: kill, undo: start, undoing: cluster.Killed},
		Doc: "SIGKILL the current leader; heal starts it again"},
	{Name: "kill-minority", F: history.FKill, Sub: "minority", Class: Process, MinNodes: 3, pick: minority, fault: signal{sub: "minority", do: kill, undo: start, undoing: cluster.Killed},
		Doc: "SIGKILL a random minority of nodes at once; heal starts them again"},
	{Name: "pause-one", F: history.FPause, Sub: "one", Class: Process, MinNodes: 2, pick: one, fault: signal{sub: "one", do: pause, undo: resume, undoing: cluster.Paused},
		Doc: "SIGSTOP one random node; heal sends SIGCONT"},
	{Name: "pause-leader", F: history.FPause, Sub: "leader", Class: Process, MinNodes: 2, Leader: true, fault: signal{sub: "leader", do: pause, undo: resume, undoing: cluster.Paused},
		Doc: "SIGSTOP the current leader; heal sends SIGCONT"},
	{Name: "pause-minority", F: history.FPause, Sub: "minority", Class: Process, MinNodes: 3, pick: minority, fault: signal{sub: "minority", do: pause, undo: resume, undoing: cluster.Paused},
		Doc: "SIGSTOP a random minority of nodes; heal sends SIGCONT"},
	{Name: "restart-one", F: history.FRestart, Sub: "one", Class: Process, MinNodes: 2, Instant: true, pick: one, fault: signal{sub: "one", do: func(c Cluster, n string) error { return c.Restart(n) }},
		Doc: "SIGKILL one random node and start it again at once (instant)"},
	{Name: "member-churn", F: history.FRemoveMember, Sub: "one", Class: Process, MinNodes: 3, pick: one, fault: churn{},
		Doc: "remove one random node's member and wipe it; heal adds the slot back as a new member"},

	{Name: "slow-links", F: history.FSlow, Class: Links, MinNodes: 2, pick: someLinks, fault: links{name: "nemesis-latency"},
		Doc: "add latency ± jitter to every peer link, or to one random node's links"},
	{Name: "bandwidth", F: history.FSlow, Class: Links, MinNodes: 2, pick: someLinks, fault: links{name: "nemesis-bandwidth"},
		Doc: "cap the bandwidth of every peer link, or of one random node's links"},

	{Name: "clock-skew", F: history.FClock, Sub: "skew", Class: Clock, MinNodes: 3, pick: minority, fault: clockShift{sub: "skew"},
		Doc: "give a random minority a steady clock offset, within (±20s) or beyond (±3m) --max-clock-skew; heal sets it back"},
	{Name: "clock-jump", F: history.FClock, Sub: "jump", Class: Clock, MinNodes: 3, pick: one, fault: clockShift{sub: "jump"},
		Doc: "step one random node's clock by ±2h; heal steps it back"},

	{Name: "transfer-leader", F: history.FTransferLeader, Sub: "leader", Class: Leadership, MinNodes: 2, Instant: true, Leader: true, pick: shuffled, fault: transfer{},
		Doc: "hand leadership to another running node via the admin API (instant)"},
}

func init() { kinds = slices.Concat(kinds, diskKinds, electionKinds, gracefulKinds) }

// Recorded is how the history records a fault of kind k: the checker
// finds the faults a run asked for by it (see checker.Faults). Links
// kinds record the relay fault's type, which their default spec fixes.
func (k Kind) Recorded() checker.FaultKind {
	fk := checker.FaultKind{Name: k.Name, F: k.F, Kind: k.Sub, Instant: k.Instant}
	if fk.Kind == "" {
		fk.Kind = k.Name
		if spec := (ScheduleConfig{}).withDefaults().linkSpec(k.Name); spec != nil {
			fk.Kind = spec.Type
		}
	}
	return fk
}

// Requested lists how the history records each kind the schedule asks
// for, in Kinds order: what checker.Faults needs to judge the run.
func (s Schedule) Requested() []checker.FaultKind {
	var out []checker.FaultKind
	for _, name := range s.Kinds() {
		if k, ok := LookupKind(name); ok {
			out = append(out, k.Recorded())
		}
	}
	return out
}

// RequestedOf is Requested for a run asked for the fault list named (its
// --nemesis), plus every kind named there by itself (not through a group)
// that the schedule was generated to draw from but never drew: a run
// asked for isolate-one whose draws all fell on partition-halves
// exercised nothing of isolate-one, and checker.Faults must say so.
// Kinds reached only through a group ("partition",
// "all") are not each required: a group asks for some of its kinds.
func (s Schedule) RequestedOf(named []string) []checker.FaultKind {
	out := s.Requested()
	scheduled := s.Kinds()
	for _, name := range named {
		k, ok := LookupKind(name)
		if !ok || slices.Contains(scheduled, name) || !slices.Contains(s.Config.Mix, name) {
			continue
		}
		scheduled = append(scheduled, name)
		out = append(out, k.Recorded())
	}
	return out
}

// groups are shorthand names in --nemesis lists; a group expands to its
// kinds that fit the cluster size.
type group struct {
	Name, Doc string
	Kinds     []string
}

var groups = []group{
	{"partition", "every partition shape", []string{"partition-halves", "isolate-one", "isolate-leader", "majorities-ring", "bridge", "one-way"}},
	{"kill", "kill-one, kill-leader, kill-minority", []string{"kill-one", "kill-leader", "kill-minority"}},
	{"pause", "pause-one, pause-leader, pause-minority", []string{"pause-one", "pause-leader", "pause-minority"}},
	{"restart", "restart-one", []string{"restart-one"}},
	{"graceful", "stop, restart-graceful, rolling-restart, stop-then-power-cut (the last needs faultfs)", []string{"stop", "restart-graceful", "rolling-restart", "stop-then-power-cut"}},
	{"slow", "slow-links, bandwidth", []string{"slow-links", "bandwidth"}},
	{"transfer", "transfer-leader", []string{"transfer-leader"}},
	{"membership", "member-churn", []string{"member-churn"}},
	{"disk", "power-cut-one, power-cut-minority, power-cut-all, power-cut-after-election, fsync-error, disk-full, slow-disk, corrupt-read, slow-disk-stall (need faultfs)",
		[]string{"power-cut-one", "power-cut-minority", "power-cut-all", "power-cut-after-election", "fsync-error", "disk-full", "slow-disk", "corrupt-read", "slow-disk-stall"}},
	{"clock", "clock-skew, clock-jump", []string{"clock-skew", "clock-jump"}},
	{"all", "every kind but the opt-in power-cut-reorder and pause-leader-burst (the disk kinds only where faultfs can mount)", nil},
}

// groupOf names the group kind belongs to (the first group listing it,
// "all" aside), or the kind itself when no group lists it.
func groupOf(kind string) string {
	for _, g := range groups {
		if g.Kinds != nil && slices.Contains(g.Kinds, kind) {
			return g.Name
		}
	}
	return kind
}

// Kinds returns every fault kind, in help order.
func Kinds() []Kind { return slices.Clone(kinds) }

// LookupKind returns the kind called name.
func LookupKind(name string) (Kind, bool) {
	for _, k := range kinds {
		if k.Name == name {
			return k, true
		}
	}
	return Kind{}, false
}

// KindNames lists every kind's name.
func KindNames() []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = k.Name
	}
	return out
}

// Help describes every kind and group, one line each, for --help.
func Help() string {
	var b strings.Builder
	b.WriteString("fault kinds:\n")
	for _, k := range kinds {
		fmt.Fprintf(&b, "  %-24s %s\n", k.Name, k.Doc)
	}
	b.WriteString("groups:\n")
	for _, g := range groups {
		fmt.Fprintf(&b, "  %-24s %s\n", g.Name, g.Doc)
	}
	b.WriteString("the disk kinds run on faultfs mounted over every node's data dir (tidal-chaos run --faultfs auto|on)")
	if err := DiskSupport(); err != nil {
		fmt.Fprintf(&b, "; not here: %v", err)
	}
	b.WriteString("\n")
	return b.String()
}

// ParseMix parses a --nemesis list ("partition-halves,kill-leader,pause")
// into kind names for a cluster of nodes nodes, without duplicates, in
// the order given. Groups expand to their kinds that fit the cluster; a
// kind named explicitly that needs more nodes is an error, as is an
// unknown name (the error lists the valid ones). Disk kinds need faultfs
// (DiskSupport): without it, naming one (or the disk group) is an error
// saying why, and "all" leaves them out.
func ParseMix(list string, nodes int) ([]string, error) {
	return ParseMixWith(list, nodes, DiskSupport())
}

// ParseMixWith is ParseMix with the reason disk kinds cannot run given
// (nil: they can), e.g. because the run was asked not to mount faultfs.
func ParseMixWith(list string, nodes int, noDisks error) ([]string, error) {
	var out []string
	add := func(k string) {
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	for _, name := range strings.Split(list, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if k, ok := LookupKind(name); ok {
			if nodes < k.MinNodes {
				return nil, fmt.Errorf("nemesis %q: expected a cluster of at least %d nodes, found %d", name, k.MinNodes, nodes)
			}
			if k.IsDisk() && noDisks != nil {
				return nil, fmt.Errorf("nemesis %q: %s needs faultfs: %w", name, name, noDisks)
			}
			add(name)
			continue
		}
		i := slices.IndexFunc(groups, func(g group) bool { return g.Name == name })
		if i < 0 {
			var groupNames []string
			for _, g := range groups {
				groupNames = append(groupNames, g.Name)
			}
			return nil, fmt.Errorf("nemesis %q: unknown fault kind; expected one of %s, or a group: %s",
				name, strings.Join(KindNames(), ", "), strings.Join(groupNames, ", "))
		}
		members := groups[i].Kinds
		if members == nil {
			for _, k := range kinds {
				if !k.OptIn {
					members = append(members, k.Name)
				}
			}
		} else if name == "disk" && noDisks != nil {
			return nil, fmt.Errorf("nemesis %q: the disk kinds need faultfs: %w", name, noDisks)
		}
		for _, m := range members {
			if k, _ := LookupKind(m); nodes >= k.MinNodes && (!k.IsDisk() || noDisks == nil) {
				add(m)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("nemesis %q: expected at least one fault kind that fits %d nodes", list, nodes)
	}
	return out, nil
}
