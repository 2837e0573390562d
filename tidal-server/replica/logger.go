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
	level := slog.LevelWarn
	if deferredCampaign[format] {
		level = slog.LevelInfo
	}
	r.log(level, fmt.Sprintf(format, v...))
}

// deferredCampaign are raft warnings about an election raft merely puts
// off: a node whose committed configuration entries are not applied yet
// skips this election timeout and campaigns at the next one. Every fresh
// cluster passes through it (the bootstrap members are committed before
// the first apply), so at Warn it would tell an operator something is
// wrong when nothing is; a node that never campaigns shows up in
// /cluster/status and /readyz instead.
var deferredCampaign = map[string]bool{
	"%x cannot campaign at term %d since there are still pending configuration changes to apply": true,
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
