//go:build tidalbugs

package bugs

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync/atomic"
)

// EnvVar switches defects on: a comma-separated list of names.
const EnvVar = "TIDAL_BUGS"

var names = map[string]Defect{
	"ack-before-commit":             AckBeforeCommit,
	"apply-twice-after-restart":     ApplyTwiceAfterRestart,
	"local-linearizable-reads":      LocalLinearizableReads,
	"drop-dedup-on-restart":         DropDedupOnRestart,
	"ack-before-fsync":              AckBeforeFsync,
	"skip-dir-fsync":                SkipDirFsync,
	"drop-last-record-on-recovery":  DropLastRecordOnRecovery,
	"ignore-fsync-error":            IgnoreFsyncError,
	"never-fsync":                   NeverFsync,
	"drop-vectors-in-snapshot":      DropVectorsInSnapshot,
	"window-off-by-one-bucket":      WindowOffByOneBucket,
	"decay-wrong-half-life":         DecayWrongHalfLife,
	"ignore-embedding-overwrite":    IgnoreEmbeddingOverwrite,
	"vote-before-sync":              VoteBeforeSync,
	"internal-error-on-valid-write": InternalErrorOnValidWrite,
	"drain-ack-before-fsync":        DrainAckBeforeFsync,
}

// active is set once, before main runs, from TIDAL_BUGS; only Enable (unit
// tests of the hooks) changes it afterwards, hence the atomics.
var active [lastDefect + 1]atomic.Bool

var parseErr = func() error {
	on, err := parse(os.Getenv(EnvVar))
	for d := range on {
		active[d].Store(true)
	}
	return err
}()

// Active reports whether d was named in TIDAL_BUGS at start (or switched
// on by Enable).
func Active(d Defect) bool { return d <= lastDefect && active[d].Load() }

// Enable switches defects on in this process and returns a function that
// puts back what was there before. It is for the unit tests of the hooks
// (a test cannot set TIDAL_BUGS before its own process starts); a node
// reads TIDAL_BUGS only.
func Enable(ds ...Defect) (restore func()) {
	var was [lastDefect + 1]bool
	for d := range active {
		was[d] = active[d].Load()
	}
	for _, d := range ds {
		active[d].Store(true)
	}
	return func() {
		for d := range active {
			active[d].Store(was[d])
		}
	}
}

// Announce logs the active defects loudly, or returns an error naming an
// unknown one (the node then refuses to start).
func Announce(log *slog.Logger) error {
	if parseErr != nil {
		return parseErr
	}
	var on []string
	for name, d := range names {
		if Active(d) {
			on = append(on, name)
		}
	}
	if len(on) > 0 {
		log.Warn("PLANTED DEFECTS ACTIVE: this tidalbugs build is deliberately incorrect", "TIDAL_BUGS", strings.Join(slices.Sorted(slices.Values(on)), ","))
	}
	return nil
}

func parse(s string) (map[Defect]bool, error) {
	out := map[Defect]bool{}
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		d, ok := names[name]
		if !ok {
			return nil, fmt.Errorf("%s: unknown defect %q; expected a comma-separated list of %s", EnvVar, name, strings.Join(slices.Sorted(maps.Keys(names)), ", "))
		}
		out[d] = true
	}
	return out, nil
}
