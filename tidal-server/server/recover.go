package server

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// RecoverOptions are what `tidal-server recover --force-new-cluster`
// takes.
type RecoverOptions struct {
	DataDir string
	// ID is the survivor's member id; it keeps it in the new cluster.
	ID uint64
	// PeerAddr and ClientAddr: "" keeps what the old membership says.
	PeerAddr, ClientAddr string
	SchemaPath           string
	IDsPerGeneration     int
	// DryRun reads and reports, and changes nothing.
	DryRun bool
}

// RecoverReport is what a forced new cluster keeps and loses.
type RecoverReport struct {
	Survivor replica.Survivor
	Member   replica.Member
	// Aside is where the old wal/ and snap/ were moved ("" on a dry run).
	Aside string
}

// Summary is one line a page can read: key=value pairs.
func (r *RecoverReport) Summary() string {
	ids := make([]string, len(r.Survivor.Members))
	for i, m := range r.Survivor.Members {
		ids[i] = fmt.Sprint(m.ID)
	}
	s := r.Survivor
	return fmt.Sprintf("member=%d last_index=%d last_term=%d commit=%d snapshot=%d members=%s",
		r.Member.ID, s.LastIndex, s.LastTerm, s.Commit, s.SnapshotIndex, strings.Join(ids, ","))
}

// Write prints the summary and what it means.
func (r *RecoverReport) Write(w io.Writer, dataDir string) {
	s := r.Survivor
	fmt.Fprintln(w, r.Summary())
	fmt.Fprintf(w, "loses: every write acknowledged at a log index above %d (only the lost members had it)\n", s.LastIndex)
	if s.LastIndex > s.Commit {
		fmt.Fprintf(w, "keeps: entries %d..%d were in this log but not known committed; their writes are kept (acknowledged ones, and ones whose clients got no answer)\n",
			s.Commit+1, s.LastIndex)
	}
	if r.Aside == "" {
		fmt.Fprintf(w, "dry run: nothing changed; the new cluster would be member %d alone at index %d\n", r.Member.ID, s.LastIndex)
		return
	}
	fmt.Fprintf(w, "recovered %s as a new one-member cluster: member %d (peer %s) at index %d; the old wal/ and snap/ are in %s\n",
		dataDir, r.Member.ID, r.Member.PeerAddr, s.LastIndex, r.Aside)
	fmt.Fprintf(w, "start it with --id %d --peers %d=%s on this data dir, then add members under new ids\n", r.Member.ID, r.Member.ID, r.Member.PeerAddr)
}

// RecoverForceNewCluster makes a stopped survivor of a cluster that lost
// its quorum the only member of a new cluster, keeping its whole log
// (etcd's --force-new-cluster): the state is its snapshot and every entry
// after it, committed or not, applied in order; every other old member is
// recorded as removed. What is lost: writes acknowledged at indexes above
// the survivor's last log index. The data dir must not be open by a node.
func RecoverForceNewCluster(o RecoverOptions) (*RecoverReport, error) {
	schema := ledger.DefaultSchema()
	if o.SchemaPath != "" {
		s, err := ledger.LoadSchema(o.SchemaPath)
		if err != nil {
			return nil, err
		}
		schema = s
	}
	if _, err := os.Stat(filepath.Join(o.DataDir, "wal")); err != nil {
		return nil, fmt.Errorf("recover: %s holds no wal/ (%v): give the stopped survivor's --data-dir", o.DataDir, err)
	}
	lock, err := wal.LockDir(filepath.Join(o.DataDir, "wal"))
	if err != nil {
		return nil, fmt.Errorf("recover %s: %w", o.DataDir, err)
	}
	defer lock.Close()
	if err := checkSchemaMatches(o.DataDir, schema); err != nil {
		return nil, err
	}
	sm := NewStateMachine(schema, ledger.Options{IDsPerGeneration: o.IDsPerGeneration})
	s, err := replica.ReadSurvivor(o.DataDir, sm)
	if err != nil {
		return nil, err
	}
	var self replica.Member
	for _, m := range s.Members {
		if m.ID == o.ID {
			self = m
		}
	}
	if self.ID == 0 {
		return nil, fmt.Errorf("--id %d is not a member in %s, whose membership (as of index %d) is %s: give the survivor's own id",
			o.ID, o.DataDir, s.LastIndex, formatMembers(s.Members))
	}
	if o.PeerAddr != "" {
		self.PeerAddr = o.PeerAddr
	}
	if o.ClientAddr != "" {
		self.ClientAddr = o.ClientAddr
	}
	if self.PeerAddr == "" {
		return nil, fmt.Errorf("the membership in %s has no peer address for member %d: give --peer-addr", o.DataDir, o.ID)
	}
	rep := &RecoverReport{Survivor: *s, Member: self}
	if o.DryRun {
		return rep, nil
	}
	var state bytes.Buffer
	if err := sm.Snapshot(&state); err != nil {
		return nil, err
	}
	aside, err := replica.ForceNewCluster(o.DataDir, self, s, state.Bytes())
	rep.Aside = aside
	if err != nil {
		return rep, fmt.Errorf("recover %s: %w (the old wal/ and snap/ are in %s: move them back to undo)", o.DataDir, err, aside)
	}
	return rep, nil
}
