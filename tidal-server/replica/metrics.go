package replica

import "github.com/prometheus/client_golang/prometheus"

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
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Term:              prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_raft_term", Help: "Current raft term."}),
		IsLeader:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_raft_is_leader", Help: "1 if this node is the raft leader."}),
		CommitIndex:       prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_raft_commit_index", Help: "Highest log index known committed."}),
		AppliedIndex:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_raft_applied_index", Help: "Highest log index applied to the state machine."}),
		LeaderChanges:     prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_raft_leader_changes_total", Help: "Leader changes seen by this node."}),
		PeerMatch:         prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidal_raft_peer_match_index", Help: "Leader's view of each peer's match index."}, []string{"peer"}),
		PeerLag:           prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidal_raft_peer_lag_entries", Help: "Entries between commit and each peer's match index (leader only)."}, []string{"peer"}),
		ProposalsPending:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_proposals_queued", Help: "Proposals waiting to be committed and applied."}),
		ProposalsDropped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_proposals_rejected_total", Help: "Proposals raft refused (no leader, or uncommitted log full)."}),
		ProposalsTimedOut: prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_proposals_timed_out_total", Help: "Proposals whose deadline passed before apply (outcome unknown)."}),
		PersistSeconds:    prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_raft_persist_duration_seconds", Help: "Time to persist one Ready (write + fdatasync).", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}),
		ApplySeconds:      prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_apply_duration_seconds", Help: "Time to apply the committed entries of one Ready.", Buckets: prometheus.ExponentialBuckets(10e-6, 2, 16)}),
		ApplyBatch:        prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_apply_batch_entries", Help: "Committed entries applied per Ready.", Buckets: prometheus.ExponentialBuckets(1, 2, 12)}),
		PackSize:          prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_proposal_pack_size", Help: "Proposals per raft entry this node proposed with --pack-proposals.", Buckets: prometheus.ExponentialBuckets(1, 2, 10)}),
		Snapshots:         prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_snapshots_total", Help: "Snapshots taken."}),
		SnapshotSeconds:   prometheus.NewHistogram(prometheus.HistogramOpts{Name: "tidal_snapshot_duration_seconds", Help: "Time to take and persist a snapshot.", Buckets: prometheus.ExponentialBuckets(1e-3, 2, 14)}),
		Fenced:            prometheus.NewGauge(prometheus.GaugeOpts{Name: "tidal_replica_fenced", Help: "1 once a failed WAL write fenced this node."}),
	}
	if reg != nil {
		reg.MustRegister(m.Term, m.IsLeader, m.CommitIndex, m.AppliedIndex, m.LeaderChanges, m.PeerMatch, m.PeerLag,
			m.ProposalsPending, m.ProposalsDropped, m.ProposalsTimedOut, m.PersistSeconds, m.ApplySeconds, m.ApplyBatch, m.PackSize,
			m.Snapshots, m.SnapshotSeconds, m.Fenced)
	}
	return m
}
