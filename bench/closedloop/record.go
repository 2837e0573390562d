package closedloop

// Record is one run as the store load tool (bench/storeload) prints it and
// the side-by-side benchmark (bench/cmd/tidal-bench) reads it.
type Record struct {
	System        string `json:"system"` // etcd or tidal
	Leader        string `json:"leader"` // endpoint every write went to
	LeaderChanged bool   `json:"leader_changed"`
	Batch         int    `json:"batch"`                 // events per request
	Connections   int    `json:"connections"`           // client connections the workers shared
	ValueBytes    int    `json:"value_bytes,omitempty"` // etcd: bytes of one value
	Result
}
