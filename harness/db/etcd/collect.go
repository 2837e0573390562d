package etcd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tidaldb/tidal/harness/checker"
	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/report"
)

// pageSize bounds one range request while reading a node's keys.
const pageSize = 2000

// Collect implements db.Cluster. For every member it reads, from that
// node alone (serializable ranges, directly, not through the mesh):
//   - its append keys, as the ledger checker's audit (id, index = the
//     key's mod revision, identical on every node that holds it);
//   - a digest of its whole keyspace at one revision common to all
//     nodes (sha256 over key, value, create and mod revision), for the
//     convergence checker.
func (c *Cluster) Collect(ctx context.Context, run *report.Run, out io.Writer, alive func(string) bool, ev *checker.NodeEvidence) {
	ev.AuditErrors, ev.DigestErrors = map[string]string{}, map[string]string{}
	revs := map[string]uint64{}
	var live []*node
	for _, name := range c.Names() {
		n, _ := c.node(name)
		st := c.State(name)
		if st == cluster.Removed {
			continue
		}
		if st != cluster.Running || !alive(name) {
			why := fmt.Sprintf("not running after the final heal (harness state %s, process alive %t)", st, alive(name))
			ev.AuditErrors[name], ev.DigestErrors[name] = why, why
			fmt.Fprintf(out, "  warning: no keys or digest of %s: %s\n", name, why)
			continue
		}
		var buf bytes.Buffer
		rev, err := c.audit(ctx, n, &buf)
		if err == nil {
			err = run.WriteAudit(name, &buf)
		}
		if err != nil {
			ev.AuditErrors[name], ev.DigestErrors[name] = err.Error(), err.Error()
			fmt.Fprintf(out, "  warning: keys of %s: %v\n", name, err)
			continue
		}
		revs[name] = rev
		live = append(live, n)
	}
	// One revision every node has applied: the digests compare the same
	// history prefix, so a node merely behind is not "divergent".
	var at uint64
	for _, r := range revs {
		if at == 0 || r < at {
			at = r
		}
	}
	digests := map[string]checker.DigestSample{}
	for _, n := range live {
		d, err := c.digest(ctx, n, at)
		if err != nil {
			ev.DigestErrors[n.name] = err.Error()
			fmt.Fprintf(out, "  warning: digest of %s: %v\n", n.name, err)
			continue
		}
		digests[n.name] = checker.DigestSample{AppliedIndex: at, Digest: d}
	}
	if err := run.WriteDigests(digests); err != nil {
		fmt.Fprintf(out, "  warning: digests: %v\n", err)
	}
	// What each ingress did with the peer connections it accepted: the
	// evidence that peer traffic crossed the mesh, pair by pair.
	for i, in := range c.ingress {
		b, _ := json.MarshalIndent(in.Stats(), "", "  ")
		os.WriteFile(filepath.Join(run.NodeDir(c.nodes[i].name), "ingress.json"), append(b, '\n'), 0o644)
	}
}

// scan reads every key in [key, end) from n at revision rev (0: its
// current one) with serializable ranges, page by page, and returns the
// revision it read at.
func (c *Cluster) scan(ctx context.Context, n *node, key, end []byte, rev uint64, each func(keyValue)) (uint64, error) {
	for attempt := 1; ; attempt++ {
		at, err := c.scanOnce(ctx, n, key, end, rev, each)
		if err == nil || attempt == 3 || ctx.Err() != nil {
			return at, err
		}
		time.Sleep(time.Second)
	}
}

func (c *Cluster) scanOnce(ctx context.Context, n *node, key, end []byte, rev uint64, each func(keyValue)) (uint64, error) {
	from := key
	for {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := n.control.rangeKeys(rctx, rangeRequest{Key: from, RangeEnd: end, Limit: pageSize, Revision: int64(rev), Serializable: true})
		cancel()
		if err != nil {
			return rev, fmt.Errorf("range %q..%q at revision %d on %s: %w", from, end, rev, n.name, err)
		}
		if rev == 0 {
			rev = uint64(resp.Header.Revision)
		}
		for _, kv := range resp.KVs {
			each(kv)
		}
		if !resp.More || len(resp.KVs) == 0 {
			return rev, nil
		}
		from = append(bytes.Clone(resp.KVs[len(resp.KVs)-1].Key), 0)
	}
}

// audit writes n's append keys as audit NDJSON and returns the revision
// it read them at.
func (c *Cluster) audit(ctx context.Context, n *node, w io.Writer) (uint64, error) {
	enc := json.NewEncoder(w)
	var encErr error
	rev, err := c.scan(ctx, n, []byte(appendPrefix), prefixEnd([]byte(appendPrefix)), 0, func(kv keyValue) {
		id := string(kv.Key[len(appendPrefix):])
		if e := enc.Encode(checker.AuditEntry{ID: id, Index: uint64(kv.ModRevision), Signal: "append"}); e != nil && encErr == nil {
			encErr = e
		}
	})
	if err == nil {
		err = encErr
	}
	return rev, err
}

// digest hashes n's whole keyspace as of revision rev.
func (c *Cluster) digest(ctx context.Context, n *node, rev uint64) (string, error) {
	h := sha256.New()
	keys := 0
	_, err := c.scan(ctx, n, []byte{0}, []byte{0}, rev, func(kv keyValue) {
		keys++
		for _, part := range [][]byte{kv.Key, kv.Value, []byte(strconv.FormatUint(uint64(kv.CreateRevision), 10)), []byte(strconv.FormatUint(uint64(kv.ModRevision), 10))} {
			h.Write([]byte(strconv.Itoa(len(part))))
			h.Write([]byte{':'})
			h.Write(part)
		}
	})
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d keys sha256:%s", keys, hex.EncodeToString(h.Sum(nil))[:16]), nil
}
