//go:build !tidalbugs

package wal

import "log/slog"

// plantedDropLastEntry is the drop-last-record-on-recovery defect of a
// tidalbugs build (bugs_on.go); in a normal build it does nothing.
func plantedDropLastEntry(fileSystem, string, *slog.Logger) error { return nil }
