package replica

import (
	"context"
	"fmt"
	"log/slog"
	"os"
)

// raftLogger adapts raft's logger to slog. raft logs at Info about every
// election and membership step; those are transitions worth keeping, so
// they pass through at the same levels.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) log(level slog.Level, msg string) {
	r.l.Log(context.Background(), level, msg, "component", "raft")
}

func (r raftLogger) Debug(v ...any) { r.log(slog.LevelDebug, fmt.Sprint(v...)) }
func (r raftLogger) Debugf(format string, v ...any) {
	r.log(slog.LevelDebug, fmt.Sprintf(format, v...))
}
func (r raftLogger) Error(v ...any) { r.log(slog.LevelError, fmt.Sprint(v...)) }
func (r raftLogger) Errorf(format string, v ...any) {
	r.log(slog.LevelError, fmt.Sprintf(format, v...))
}
func (r raftLogger) Info(v ...any) { r.log(slog.LevelInfo, fmt.Sprint(v...)) }
func (r raftLogger) Infof(format string, v ...any) {
	level := slog.LevelInfo
	if routineInfo[format] {
		level = slog.LevelDebug
	}
	if !r.l.Enabled(context.Background(), level) {
		return // not even formatted
	}
	r.log(level, fmt.Sprintf(format, v...))
}

// routineInfo are raft Info lines that are no transition: with
// AsyncStorageWrites raft says so whenever a storage-append response covers
// entries an earlier response already made stable, which on a busy node is
// every few writes (thousands of lines a minute, ~1.5% of a leader's CPU in
// a profile). They are logged at Debug.
var routineInfo = map[string]bool{
	"entry at index %d missing from unstable log; ignoring": true,
	"entry at index %d matched unstable snapshot; ignoring": true,
}

func (r raftLogger) Warning(v ...any) { r.log(slog.LevelWarn, fmt.Sprint(v...)) }
func (r raftLogger) Warningf(format string, v ...any) {
	r.log(slog.LevelWarn, fmt.Sprintf(format, v...))
}
func (r raftLogger) Fatal(v ...any) {
	r.log(slog.LevelError, fmt.Sprint(v...))
	os.Exit(1)
}
func (r raftLogger) Fatalf(format string, v ...any) {
	r.log(slog.LevelError, fmt.Sprintf(format, v...))
	os.Exit(1)
}
func (r raftLogger) Panic(v ...any) {
	s := fmt.Sprint(v...)
	r.log(slog.LevelError, s)
	panic(s)
}
func (r raftLogger) Panicf(format string, v ...any) {
	s := fmt.Sprintf(format, v...)
	r.log(slog.LevelError, s)
	panic(s)
}
