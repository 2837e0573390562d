package container

import (
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
)

// Stats is a point-in-time sample of a container's cgroup, in the shape
// of the process backend's (pid, rss_bytes, cpu_percent) plus what a
// cgroup adds: memory with its limit, block and network I/O, tasks.
type Stats struct {
	PID int `json:"pid"`
	// RSSBytes is anonymous memory (cgroup v1 "rss", v2 "anon").
	RSSBytes uint64 `json:"rss_bytes"`
	// MemoryBytes is the cgroup's usage less its inactive page cache, as
	// `docker stats` reports it.
	MemoryBytes      uint64 `json:"memory_bytes"`
	MemoryLimitBytes uint64 `json:"memory_limit_bytes"`
	// CPUPercent is CPU time over wall time since the container started
	// (100 = one core), as gopsutil's is since the process started.
	CPUPercent      float64 `json:"cpu_percent"`
	CPUSeconds      float64 `json:"cpu_seconds"`
	BlockReadBytes  uint64  `json:"block_read_bytes"`
	BlockWriteBytes uint64  `json:"block_write_bytes"`
	NetRxBytes      uint64  `json:"net_rx_bytes"`
	NetTxBytes      uint64  `json:"net_tx_bytes"`
	// Tasks counts the cgroup's threads (pids.current).
	Tasks uint64 `json:"tasks"`
}

// statsOf reduces the API's sample; started is when the container
// started (for CPUPercent).
func statsOf(s container.StatsResponse, pid int, started time.Time) Stats {
	out := Stats{
		PID:              pid,
		MemoryLimitBytes: s.MemoryStats.Limit,
		CPUSeconds:       float64(s.CPUStats.CPUUsage.TotalUsage) / 1e9,
		Tasks:            s.PidsStats.Current,
	}
	ms := s.MemoryStats.Stats
	out.RSSBytes = ms["rss"]
	if out.RSSBytes == 0 {
		out.RSSBytes = ms["anon"]
	}
	// docker stats: usage less inactive_file (v2) or total_inactive_file
	// (v1), falling back to cache.
	cache := ms["inactive_file"]
	if v, ok := ms["total_inactive_file"]; ok {
		cache = v
	} else if cache == 0 {
		cache = ms["cache"]
	}
	if s.MemoryStats.Usage > cache {
		out.MemoryBytes = s.MemoryStats.Usage - cache
	}
	for _, e := range s.BlkioStats.IoServiceBytesRecursive {
		switch strings.ToLower(e.Op) {
		case "read":
			out.BlockReadBytes += e.Value
		case "write":
			out.BlockWriteBytes += e.Value
		}
	}
	for _, n := range s.Networks {
		out.NetRxBytes += n.RxBytes
		out.NetTxBytes += n.TxBytes
	}
	at := s.Read
	if at.IsZero() {
		at = time.Now()
	}
	if wall := at.Sub(started).Seconds(); !started.IsZero() && wall > 0 {
		out.CPUPercent = out.CPUSeconds / wall * 100
	}
	return out
}
