package server

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

// A data dir holds
//
//	schema.fingerprint   the schema it was created with (this file)
//	wal/                 the raft log (package wal), every group's
//	snap/                group 1's raft snapshots (package replica)
//	request-epoch        group 1's request id epoch (package replica)
//	groups/<g>/          any other group's snap/ and request-epoch
//	                     (replica.GroupDir)
//
// Every metadata file is written with wal.WriteFileAtomic and every
// directory created with wal.MkdirAllDurable, so a crash or an I/O error
// leaves the old file or the new one, never an empty one.
const schemaFileName = "schema.fingerprint"

// prepareDataDir creates dir durably, removes the temporary files of
// writes a crash interrupted (logging each), and pins or checks the schema.
func prepareDataDir(dir string, schema ledger.Schema, log *slog.Logger) error {
	if err := wal.MkdirAllDurable(dir); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	// Before anything is written: a data dir a newer release wrote is
	// refused as it is.
	if err := replica.CheckDataDirFormat(dir); err != nil {
		return err
	}
	if _, err := wal.RemoveTemporaries(dir, log); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	return checkSchemaMatches(dir, schema)
}

// checkSchemaMatches pins the schema a data dir was created with:
// replaying a log under another schema would fold events differently than
// the nodes that acknowledged them.
func checkSchemaMatches(dir string, schema ledger.Schema) error {
	want := schemaFingerprint(schema)
	path := filepath.Join(dir, schemaFileName)
	got, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if err := wal.WriteFileAtomic(path, []byte(want+"\n")); err != nil {
			return fmt.Errorf("pin the schema: %w", err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	found := strings.TrimSpace(string(got))
	if found == "" {
		// Only an older tidal-server, which wrote this file without
		// fsync, can have left it empty (after a crash or an I/O error).
		return fmt.Errorf("%s is empty: expected the fingerprint of the schema this data dir was created with. "+
			"If this node always ran the schema it runs now, remove the file and start again; it will be rewritten as %s", path, want)
	}
	if found != want {
		return fmt.Errorf("%s: data dir was created with schema %s, this node runs schema %s; start with the original --schema", path, found, want)
	}
	return nil
}

func schemaFingerprint(s ledger.Schema) string {
	var b strings.Builder
	fmt.Fprintf(&b, "dim=%d", s.EmbeddingDim)
	for _, sig := range s.Signals {
		fmt.Fprintf(&b, ";%s/%s", sig.Name, sig.HalfLife)
		for _, w := range sig.Windows {
			fmt.Fprintf(&b, "/%s=%s", w.Name, w.Duration)
		}
	}
	return b.String()
}

// checkPeersMatchDataDir refuses a --peers list that describes another
// cluster than the one the data dir holds. --peers is the initial cluster
// and, on later starts, an address book that may list members added since
// and omit members removed since; so the test is not equality but the
// overlap raft itself keeps between consecutive configurations, which is
// an overlap of voters: the voters both name must be a majority of the
// voters of each, and every id both name must have the same peer address.
// Learners are left out of both sides (an id the data dir knows as a
// learner does not count among --peers' voters either): they take no part
// in any quorum, and counting them let learners that were added but never
// started refuse the restart of a voter whose --peers matched every voter.
// A data dir left by a failed first start as a one-member cluster, started
// again with a three-member --peers, fails the test (1 of 3 is no
// majority) instead of running as a cluster of its own.
func checkPeersMatchDataDir(dataDir string, peers []replica.Member) error {
	stored, err := replica.ReadStoredConfig(dataDir)
	if err != nil {
		// Damage is reported, with file and offset, when the replica
		// opens the WAL.
		var ce *wal.CorruptionError
		if errors.As(err, &ce) {
			return nil
		}
		return fmt.Errorf("read the membership stored in %s: %w", dataDir, err)
	}
	return comparePeers(dataDir, stored, peers)
}

// comparePeers is checkPeersMatchDataDir's rule, given the configuration
// the data dir holds.
func comparePeers(dataDir string, stored replica.StoredConfig, peers []replica.Member) error {
	if len(stored.Members) == 0 {
		return nil // a new data dir: --peers bootstraps it
	}
	byID := map[uint64]replica.Member{}
	for _, m := range stored.Members {
		byID[m.ID] = m
	}
	for _, p := range peers {
		if m, ok := byID[p.ID]; ok && m.PeerAddr != p.PeerAddr {
			return fmt.Errorf("--peers gives member %d the peer address %s, but the data dir %s holds it at %s (membership as of log index %d: %s); "+
				"start with the address the cluster knows", p.ID, p.PeerAddr, dataDir, m.PeerAddr, stored.Index, formatMembers(stored.Members))
		}
	}
	voter := map[uint64]bool{}
	for _, id := range stored.Voters {
		voter[id] = true
	}
	if len(voter) == 0 {
		// No configuration names voters (raft never writes one without):
		// every member counts.
		for _, m := range stored.Members {
			voter[m.ID] = true
		}
	}
	var storedVoters, storedLearners, peerVoters, shared []uint64
	for _, m := range stored.Members {
		if voter[m.ID] {
			storedVoters = append(storedVoters, m.ID)
		} else {
			storedLearners = append(storedLearners, m.ID)
		}
	}
	for _, p := range peers {
		if _, ok := byID[p.ID]; ok && !voter[p.ID] {
			continue // a learner here
		}
		peerVoters = append(peerVoters, p.ID)
		if voter[p.ID] {
			shared = append(shared, p.ID)
		}
	}
	slices.Sort(peerVoters)
	slices.Sort(shared)
	if len(shared) < len(storedVoters)/2+1 || len(shared) < len(peerVoters)/2+1 {
		learners := ""
		if len(storedLearners) > 0 {
			learners = fmt.Sprintf(" (its learners %v count on neither side)", storedLearners)
		}
		return fmt.Errorf("--peers %s does not describe the cluster in the data dir %s, which holds members %s (as of log index %d): "+
			"expected --peers to share a majority of the data dir's voters %v, found voters %v in --peers%s; "+
			"they share %d voter(s) %v, less than a majority of each. Start with --peers matching the data dir; "+
			"or, if this node belongs to the --peers cluster, wipe the data dir and add the node to that cluster as a new member "+
			"(tidal-server members add, then run with --join)",
			formatMembers(peers), dataDir, formatMembers(stored.Members), stored.Index,
			storedVoters, peerVoters, learners, len(shared), shared)
	}
	return nil
}

// formatMembers renders members as --peers does: "1=host:port,2=...".
func formatMembers(ms []replica.Member) string {
	ms = slices.Clone(ms)
	slices.SortFunc(ms, func(a, b replica.Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = fmt.Sprintf("%d=%s", m.ID, m.PeerAddr)
	}
	return strings.Join(parts, ",")
}
