package closedloop

// Record is one run as the store load tool (bench/storeload) prints it and
// the side-by-side benchmark (bench/cmd/tidal-bench) reads it.
type Record struct {
	System string `json:"system"` // etcd or tidal
	// Protocol is what the writes travelled on: http (tidal's POST
	// /v1/signals) or grpc (etcd's Put, tidal's ingest stream); "" in
	// records from before the ingest stream (http).
	Protocol      string `json:"protocol,omitempty"`
	Leader        string `json:"leader"` // endpoint every write went to
	LeaderChanged bool   `json:"leader_changed"`
	Batch         int    `json:"batch"`                 // events per request
	Connections   int    `json:"connections"`           // client connections the workers shared
	ValueBytes    int    `json:"value_bytes,omitempty"` // etcd: bytes of one value
	// CPU seconds (user + system) over the whole run, warm-up included:
	// the load tool's own (set by storeload) and the cluster's, all
	// members together (set by the side-by-side benchmark, which knows
	// their pids). Divided by AllOps they are CPU per request, a figure
	// that moves far less with the machine's load than throughput does.
	ToolCPUSeconds   float64 `json:"tool_cpu_s"`
	ServerCPUSeconds float64 `json:"server_cpu_s,omitempty"`
	Result
}

// AllOps is every op the run completed: warm-up, window and late, failed
// or not — what the CPU figures were spent on.
func (r Record) AllOps() int64 { return r.WarmupOps + r.Ops + r.Errors + r.LateOps }

// CPUPerOp is seconds of CPU per completed op (0 without ops).
func (r Record) CPUPerOp(seconds float64) float64 {
	if n := r.AllOps(); n > 0 {
		return seconds / float64(n)
	}
	return 0
}
