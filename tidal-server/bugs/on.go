//go:build tidalbugs

package bugs

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
)

// EnvVar switches defects on: a comma-separated list of names.
const EnvVar = "TIDAL_BUGS"

var names = map[string]Defect{
	"ack-before-commit":         AckBeforeCommit,
	"apply-twice-after-restart": ApplyTwiceAfterRestart,
	"local-linearizable-reads":  LocalLinearizableReads,
	"drop-dedup-on-restart":     DropDedupOnRestart,
}

// active is written once, before main runs, and only read afterwards.
var active, parseErr = parse(os.Getenv(EnvVar))

// Active reports whether d was named in TIDAL_BUGS at start.
func Active(d Defect) bool { return active[d] }

// Announce logs the active defects loudly, or returns an error naming an
// unknown one (the node then refuses to start).
func Announce(log *slog.Logger) error {
	if parseErr != nil {
		return parseErr
	}
	var on []string
	for name, d := range names {
		if active[d] {
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
