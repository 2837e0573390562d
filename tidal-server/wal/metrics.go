package wal

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the WAL's Prometheus collectors. A nil *Metrics records
// nothing, so the WAL never has to ask whether metrics are on.
type Metrics struct {
	FsyncDuration prometheus.Histogram
	// GroupBatches is how many Save calls one fsync made durable: the
	// group-commit factor.
	GroupBatches prometheus.Histogram
	// GroupBytes is how many bytes one group commit wrote.
	GroupBytes prometheus.Histogram
	// Fenced is 1 once a failed write or sync has fenced the WAL.
	Fenced prometheus.Gauge
}

// NewMetrics creates the collectors and registers them with reg when reg is
// not nil. It panics if registration fails (duplicate names), like
// prometheus.MustRegister: that is a wiring bug, not a runtime condition.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		FsyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tidal_wal_fsync_duration_seconds",
			Help:    "Time one WAL fdatasync took.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16), // 50µs .. 1.6s
		}),
		GroupBatches: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tidal_wal_group_commit_batches",
			Help:    "Save calls made durable by one WAL write and fdatasync.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12), // 1 .. 2048
		}),
		GroupBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tidal_wal_group_commit_bytes",
			Help:    "Bytes written by one WAL group commit.",
			Buckets: prometheus.ExponentialBuckets(128, 4, 10), // 128B .. 32MiB
		}),
		Fenced: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tidal_wal_fenced",
			Help: "1 when a failed WAL write or fsync has fenced the log; it then refuses every write.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.FsyncDuration, m.GroupBatches, m.GroupBytes, m.Fenced)
	}
	return m
}

func (m *Metrics) observeSync(d time.Duration) {
	if m != nil {
		m.FsyncDuration.Observe(d.Seconds())
	}
}

func (m *Metrics) observeGroup(batches, bytes int) {
	if m != nil {
		m.GroupBatches.Observe(float64(batches))
		m.GroupBytes.Observe(float64(bytes))
	}
}

func (m *Metrics) setFenced() {
	if m != nil {
		m.Fenced.Set(1)
	}
}
