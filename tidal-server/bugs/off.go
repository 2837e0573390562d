//go:build !tidalbugs

package bugs

import "log/slog"

// Active reports whether d is switched on: never, in a normal build.
func Active(Defect) bool { return false }

// Announce does nothing in a normal build: TIDAL_BUGS is not read.
func Announce(*slog.Logger) error { return nil }
