package history

import "encoding/json"

// Event is one signal event of a ledger write, as the client sent it. Its
// ID is unique across the whole run (the ledger checker relies on that to
// tell a lost write from a doubled one).
type Event struct {
	ID     string  `json:"id"`
	Entity uint64  `json:"entity"`
	Signal string  `json:"signal"`
	Weight float64 `json:"weight,omitempty"`
}

// WriteValue is the value of an FWrite op: one POST /v1/signals batch. The
// batch is one raft entry, so its events land together or not at all.
type WriteValue struct {
	Events []Event `json:"events"`
	// Duplicates, on ok, is how many of the events the node answered as
	// retries of ones already applied (X-Tidal-Duplicates): then the
	// ack's seq is the index of the retry's entry, not where they landed.
	// Absent (not 0) in histories written before it existed.
	Duplicates *int `json:"duplicates,omitempty"`
}

// AddValue is the value of an FAdd op: add Delta to the counter of entity
// Key, realised as events with the listed ids.
//
// The timestamp fields let the aggregates checker know when each event
// was stamped: TS is the event's ts as the client sent it; when the
// client sent none (TS 0) the node stamped it, no earlier than SentMS (the
// client's clock just before the request) and, on ok, no later than
// AckedMS (the client's clock once the ack arrived). All unix ms; absent
// in histories written before they existed.
type AddValue struct {
	Key     uint64   `json:"key"`
	Delta   int64    `json:"delta"`
	IDs     []string `json:"ids,omitempty"`
	TS      int64    `json:"ts,omitempty"`
	SentMS  int64    `json:"sent_ms,omitempty"`
	AckedMS int64    `json:"acked_ms,omitempty"`
	// Duplicates: as WriteValue's.
	Duplicates *int `json:"duplicates,omitempty"`
}

// ReadValue is the value of an FRead op. Value is null on the invoke and
// on fail/info completions, and the observed counter on ok. Stats, on ok,
// is everything the read saw of the counter's signal.
type ReadValue struct {
	Key   uint64       `json:"key"`
	Value *int64       `json:"value"`
	Stats *SignalStats `json:"stats,omitempty"`
}

// SignalStats are the aggregates of one signal on one entity as a node
// answered them (GET /v1/entities/{id}), with what is needed to judge
// them against the events written.
type SignalStats struct {
	At        int64             `json:"at"` // unix ms the node evaluated score and windows at
	Count     uint64            `json:"count"`
	WeightSum float64           `json:"weight_sum"`
	Score     float64           `json:"score"`
	Windows   map[string]uint64 `json:"windows,omitempty"`
	// ReturnedMS is the client's clock (unix ms) when the answer arrived:
	// no event the answer folded can have been stamped later.
	ReturnedMS int64 `json:"returned_ms"`
}

// PutEmbeddingValue is the value of an FPutEmbedding op. Hash identifies
// the vector (the workload's choice of digest), so reads can be compared
// without storing vectors in the history.
//
// Duplicate, on ok, says whether the node answered the put as a retry of
// one already applied (X-Tidal-Duplicates): the ack's seq is then the
// index of the retry's entry, not of the one that set the vector. Absent
// (not false) in histories written before it existed.
type PutEmbeddingValue struct {
	Entity    uint64 `json:"entity"`
	ID        string `json:"id"`
	Dim       int    `json:"dim"`
	Hash      string `json:"hash"`
	Duplicate *bool  `json:"duplicate,omitempty"`
}

// GetEmbeddingValue is the value of an FGetEmbedding op; Hash is empty on
// the invoke and when the entity has no embedding. Local marks a read of
// the answering node's own applied state (consistency=local): the final
// per-node reads after heal. AppliedIndex, on ok, is the node's applied
// index the answer reflects.
type GetEmbeddingValue struct {
	Entity       uint64 `json:"entity"`
	Hash         string `json:"hash,omitempty"`
	Local        bool   `json:"local,omitempty"`
	AppliedIndex uint64 `json:"applied_index,omitempty"`
}

// Faults. The nemesis records each fault as three ops of process Nemesis:
//
//	invoke  f="partition" value=FaultValue   the request, when it was made
//	ok      f="partition" value=FaultValue   the moment it took effect
//	                                         (fail: it never did; info: unknown)
//	... later ...
//	invoke  f="heal-partition"               the heal request
//	ok      f="heal-partition"               the moment the heal took effect
//
// The window of a fault runs from its invoke to the ok of the next heal of
// the same f (HealOf), or of HealAll. A fault that is over by the time it
// completes (leader transfer, restart) sets Instant, and its window ends at
// its own completion. A fault never healed stays open to the end of the
// history.
type FaultValue struct {
	// Kind refines F: for partitions "halves", "isolate-one",
	// "isolate-leader", "majorities-ring", "bridge", "one-way"; for
	// kill/pause "one", "leader", "minority"; free-form otherwise.
	Kind string `json:"kind"`
	// Grudge maps each node to the nodes it can no longer hear from
	// (directed: "n1": ["n2"] cuts n2 -> n1). Partitions only.
	Grudge map[string][]string `json:"grudge,omitempty"`
	// Targets are the nodes the fault acts on.
	Targets []string `json:"targets,omitempty"`
	// Params carries fault-specific settings (latency, jitter, rate...).
	Params  json.RawMessage `json:"params,omitempty"`
	Instant bool            `json:"instant,omitempty"`
}

// Nemesis fault names used by the nemesis package; any other f is allowed
// and windowed the same way.
const (
	FPartition      = "partition"
	FKill           = "kill"
	FPause          = "pause"
	FRestart        = "restart"
	FSlow           = "slow"
	FTransferLeader = "transfer-leader"
	FRemoveMember   = "remove-member"
	FAddMember      = "add-member"
	// FStop is a graceful stop (SIGTERM, then a wait for the exit; kind
	// "one"); its ok records each node's exit status.
	FStop = "stop"
	// FQuiet is a quiet spell: the workload's new ops held before a power
	// cut (kind "before-cut"), ended by heal-quiet.
	FQuiet = "quiet"
	// FStopPowerCut is a graceful stop followed by a power cut of the
	// stopped node's disk (kind "one"): a process fault of its own f, so
	// that its heal never ends a disk power cut's window.
	FStopPowerCut = "stop-power-cut"
	// FPowerCut is a power cut under nodes (kind "one", "minority",
	// "all"); FDisk a fault armed on nodes' disks (kind "fsync-error",
	// "disk-full", "slow-disk", "slow-disk-stall", "corrupt-read"). Both
	// through faultfs.
	FPowerCut = "power-cut"
	FDisk     = "disk"
	// HealAll ends every open fault window (the final heal of a run).
	HealAll = "heal-all"
)

const healPrefix = "heal-"

// HealOf is the f of the op that heals fault f ("partition" -> "heal-partition").
func HealOf(f string) string { return healPrefix + f }

// HealedBy returns the fault f a heal op ends, and whether f names a heal
// at all. For HealAll it returns ("", true).
func HealedBy(f string) (fault string, ok bool) {
	if f == HealAll {
		return "", true
	}
	if len(f) > len(healPrefix) && f[:len(healPrefix)] == healPrefix {
		return f[len(healPrefix):], true
	}
	return "", false
}
