package peer

import "github.com/prometheus/client_golang/prometheus"

// metrics are per peer node (label peer) or per reason, never per raft
// group: a node may host thousands of groups, and the connection, queue
// and batching these describe are per node pair (docs/ARCHITECTURE.md,
// "Transport").
type metrics struct {
	batchSize     *prometheus.HistogramVec
	sendSeconds   *prometheus.HistogramVec
	queueDepth    *prometheus.GaugeVec
	failures      *prometheus.CounterVec
	dropped       *prometheus.CounterVec
	snapshotsSent *prometheus.CounterVec

	messagesDropped   *prometheus.CounterVec
	handshakeFailures prometheus.Counter
	memberQueries     *prometheus.CounterVec
	snapshotsReceived prometheus.Counter
	snapshotBytes     prometheus.Counter
	clockOffset       *prometheus.GaugeVec
	clockUncertainty  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tidal_transport_batch_messages",
			Help: "Raft messages per gRPC stream send, per peer.", Buckets: prometheus.ExponentialBuckets(1, 2, 11)}, []string{"peer"}),
		sendSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "tidal_transport_send_duration_seconds",
			Help: "Time to hand one batch to the stream, per peer.", Buckets: prometheus.ExponentialBuckets(10e-6, 2, 16)}, []string{"peer"}),
		queueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidal_transport_queue_depth",
			Help: "Messages waiting in the per-peer send queue."}, []string{"peer"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_transport_send_failures_total",
			Help: "Stream failures per peer (each followed by a reconnect)."}, []string{"peer"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_transport_dropped_total",
			Help: "Outbound messages dropped because the peer's queue was full, the peer unknown, it carried entries of a format the peer did not advertise, or it belongs to a group other than 1 and the peer's protocol does not carry groups. Per peer node, never per group."}, []string{"peer"}),
		snapshotsSent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_transport_snapshots_sent_total",
			Help: "Snapshots streamed to each peer."}, []string{"peer"}),

		messagesDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_peer_messages_dropped_total",
			Help: "Inbound raft messages (or snapshot streams) refused before raft saw them, by reason: sender_mismatch, from_self, wrong_recipient, not_member, removed_member, malformed, unauthenticated, not_snapshot, snapshot_too_large, snapshot_busy, unknown_group, unknown_replica, protocol_version, entry_format."},
			[]string{"reason"}),
		handshakeFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_peer_handshake_failures_total",
			Help: "Inbound peer connections refused by the TLS handshake (no certificate, another CA, not a member certificate, plaintext)."}),
		memberQueries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tidal_peer_member_queries_total",
			Help: "Answers of known members asked whether an id this node does not know is a member, by answer: member, removed, unknown, error."},
			[]string{"answer"}),
		snapshotsReceived: prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_peer_snapshots_received_total",
			Help: "Inbound snapshots spooled, admitted and handed to raft."}),
		snapshotBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "tidal_peer_snapshot_bytes_received_total",
			Help: "Bytes received on snapshot streams, admitted or not."}),
		clockOffset: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidal_clock_offset_seconds",
			Help: "The peer's clock minus this node's, best recent estimate (the true offset is within ± tidal_clock_offset_uncertainty_seconds)."},
			[]string{"peer"}),
		clockUncertainty: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tidal_clock_offset_uncertainty_seconds",
			Help: "Half the round trip of the probe behind tidal_clock_offset_seconds: the bound on its error."},
			[]string{"peer"}),
	}
	if reg != nil {
		reg.MustRegister(m.batchSize, m.sendSeconds, m.queueDepth, m.failures, m.dropped, m.snapshotsSent,
			m.messagesDropped, m.handshakeFailures, m.memberQueries, m.snapshotsReceived, m.snapshotBytes,
			m.clockOffset, m.clockUncertainty)
	}
	return m
}
