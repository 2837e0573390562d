package etcd

import (
	"encoding/json"
	"os"

	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/report"
)

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// rewriteHistory replaces a stored run's history with ops.
func rewriteHistory(run *report.Run, ops []history.Op) error {
	f, err := os.Create(run.HistoryPath())
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, op := range ops {
		if err := enc.Encode(op); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
