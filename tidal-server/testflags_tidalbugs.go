//go:build tidalbugs

package main

import (
	"log/slog"

	"github.com/spf13/pflag"
	"github.com/tidaldb/tidal/tidal-server/peer"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/wal"
)

func init() { runTestFlags = registerTestFlags }

// registerTestFlags adds the tidalbugs build's hidden run flags.
//
//   - --test-newer-format makes the process stand for a future release
//     (setTestNewerFormat). The lifecycle suite starts a tidalbugs build
//     with it for the "newer" node.
func registerTestFlags(f *pflag.FlagSet) (apply func(log *slog.Logger)) {
	var newerFormat bool
	f.BoolVar(&newerFormat, "test-newer-format", false, "TEST ONLY: act as a future release: write WAL segments and snapshots one format version up, speak a peer protocol that no longer talks to this release's, read one entry format more")
	_ = f.MarkHidden("test-newer-format")
	return func(log *slog.Logger) {
		if newerFormat {
			setTestNewerFormat(log)
		}
	}
}

// setTestNewerFormat makes this process stand for a future release whose
// formats this one cannot read: WAL segments and snapshot files one
// version up, an entry format more, and a peer protocol that refuses this
// release's. The lifecycle suite shows with it that a downgrade, and a
// mix across an incompatible protocol, refuse clearly.
func setTestNewerFormat(log *slog.Logger) {
	wal.SetTestNewerFormat()
	replica.SetTestNewerFormat()
	replica.SetTestNewerEntryFormat()
	peer.SetTestNewerProtocol()
	log.Warn("TEST ONLY: acting as a newer release (--test-newer-format); never run a real node like this",
		"wal_format", wal.FormatVersion+1, "snapshot_format", replica.SnapshotFormatVersion+1,
		"entry_format", replica.ReadableEntryFormat(), "peer_protocol", peer.ProtocolVersion+1)
}
