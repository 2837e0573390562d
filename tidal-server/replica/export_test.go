package replica

import (
	"testing"
	"time"
)

// SetWallClock makes the package read now instead of time.Now until the
// test ends: a clock that steps back across a restart.
func SetWallClock(t testing.TB, now func() time.Time) {
	prev := wallClock
	wallClock = now
	t.Cleanup(func() { wallClock = prev })
}
