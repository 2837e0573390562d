package replica

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the replica's Prometheus collectors (names per DESIGN.md).
type Metrics struct {
	Term              prometheus.Gauge
	IsLeader          prometheus.Gauge
	CommitIndex       prometheus.Gauge
	AppliedIndex      prometheus.Gauge
	LeaderChanges     prometheus.Counter
	PeerMatch         *prometheus.GaugeVec
	PeerLag           *prometheus.GaugeVec
	ProposalsPending  prometheus.Gauge
	ProposalsDropped  prometheus.Counter
	ProposalsTimedOut prometheus.Counter
	PersistSeconds    prometheus.Histogram
	ApplySeconds      prometheus.Histogram
	ApplyBatch        prometheus.Histogram
	PackSize          prometheus.Histogram
	Snapshots         prometheus.Counter
	SnapshotSeconds   prometheus.Histogram
	Fenced            prometheus.Gauge
}

// NewMetrics creates the collectors and registers them with reg (nil: not
// registered, which tests use to run several replicas in one process).
// They carry no labels beyond their own: the metrics of a node that runs
// one raft group.
func NewMetrics(reg prometheus.Registerer) *Metrics { return newMetrics(reg, nil) }

// NewGroupMetrics is NewMetrics for one group of a node hosting several:
// every series carries the constant label group="<group>", so the groups'
// collectors register in one registry side by side. A registry takes one
// label set per name, so on a node hosting several groups every group's
// metrics, the default group's included, come from NewGroupMetrics;
// NewMetrics and NewGroupMetrics of the same names in one registry panic
// there (a wiring bug, as every MustRegister conflict).
func NewGroupMetrics(reg prometheus.Registerer, group uint64) *Metrics {
	return newMetrics(reg, prometheus.Labels{"group": strconv.FormatUint(group, 10)})
}

func newMetrics(reg prometheus.Registerer, labels prometheus.Labels) *Metrics {
	m := &Metrics{
		Term:              prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_raft_term", ConstLabels: labels, Help: "Current raft term."}),
		IsLeader:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_raft_is_leader", ConstLabels: labels, Help: "1 if this node is the raft leader."}),
		CommitIndex:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_raft_commit_index", ConstLabels: labels, Help: "Highest log index known committed."}),
		AppliedIndex:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_raft_applied_index", ConstLabels: labels, Help: "Highest log index applied to the state machine."}),
		LeaderChanges:     prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_raft_leader_changes_total", ConstLabels: labels, Help: "Leader changes seen by this node."}),
		PeerMatch:         prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidal_raft_peer_match_index", ConstLabels: labels, Help: "Leader's view of each peer's match index."}, []string{"peer"}),
		PeerLag:           prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidal_raft_peer_lag_entries", ConstLabels: labels, Help: "Entries between commit and each peer's match index (leader only)."}, []string{"peer"}),
		ProposalsPending:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_proposals_queued", ConstLabels: labels, Help: "Proposals waiting to be committed and applied."}),
		ProposalsDropped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_proposals_rejected_total", ConstLabels: labels, Help: "Proposals raft refused (no leader, or uncommitted log full)."}),
		ProposalsTimedOut: prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_proposals_timed_out_total", ConstLabels: labels, Help: "Proposals whose deadline passed before apply (outcome unknown)."}),
		PersistSeconds:    prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_raft_persist_duration_seconds", ConstLabels: labels, Help: "Time to persist one Ready (write + fdatasync).", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}),
		ApplySeconds:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_apply_duration_seconds", ConstLabels: labels, Help: "Time to apply the committed entries of one Ready.", Buckets: prometheus.ExponentialBuckets(10e-6, 2, 16)}),
		ApplyBatch:        prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_apply_batch_entries", ConstLabels: labels, Help: "Committed entries applied per Ready.", Buckets: prometheus.ExponentialBuckets(1, 2, 12)}),
		PackSize:          prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_proposal_pack_size", ConstLabels: labels, Help: "Proposals per raft entry this node proposed with --pack-proposals.", Buckets: prometheus.ExponentialBuckets(1, 2, 10)}),
		Snapshots:         prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_snapshots_total", ConstLabels: labels, Help: "Snapshots taken."}),
		SnapshotSeconds:   prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_snapshot_duration_seconds", ConstLabels: labels, Help: "Time to take and persist a snapshot.", Buckets: prometheus.ExponentialBuckets(1e-3, 2, 14)}),
		Fenced:            prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_replica_fenced", ConstLabels: labels, Help: "1 once a failed WAL write fenced this node."}),
	}
	if reg != nil {
		reg.MustRegister(m.Term, m.IsLeader, m.CommitIndex, m.AppliedIndex, m.LeaderChanges, m.PeerMatch, m.PeerLag,
			m.ProposalsPending, m.ProposalsDropped, m.ProposalsTimedOut, m.PersistSeconds, m.ApplySeconds, m.ApplyBatch, m.PackSize,
			m.Snapshots, m.SnapshotSeconds, m.Fenced)
	}
	return m
}
