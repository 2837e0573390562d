package replica

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// raft's routine "missing from unstable log" line (thousands a minute on a
// busy node with AsyncStorageWrites) is logged at Debug; transitions stay
// at Info.
func TestRaftLoggerDemotesRoutineLines(t *testing.T) {
	var buf bytes.Buffer
	l := raftLogger{l: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	l.Infof("entry at index %d missing from unstable log; ignoring", 42)
	l.Infof("%x became leader at term %d", 1, 2)
	out := buf.String()
	if strings.Contains(out, "missing from unstable") || !strings.Contains(out, "became leader at term 2") {
		t.Fatalf("log at Info:\n%s\nexpected the leader line and not the unstable-log line", out)
	}
	buf.Reset()
	l = raftLogger{l: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	l.Infof("entry at index %d missing from unstable log; ignoring", 42)
	if !strings.Contains(buf.String(), "level=DEBUG") {
		t.Fatalf("log at Debug:\n%s\nexpected the unstable-log line at DEBUG", buf.String())
	}
}

// Regression: fresh start warns about pending configuration changes. A
// clean first start logged raft's "cannot campaign ... pending
// configuration changes" at WARN; it is a deferred election, logged at Info.
func TestRaftLoggerDeferredCampaignIsInfo(t *testing.T) {
	var buf bytes.Buffer
	l := raftLogger{l: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	l.Warningf("%x cannot campaign at term %d since there are still pending configuration changes to apply", 1, 1)
	l.Warningf("%x is unpromotable and can not campaign", 1)
	out := buf.String()
	if !strings.Contains(out, "level=INFO msg=\"1 cannot campaign at term 1") {
		t.Fatalf("log:\n%s\nexpected the deferred-campaign line at INFO", out)
	}
	if !strings.Contains(out, "level=WARN msg=\"1 is unpromotable") {
		t.Fatalf("log:\n%s\nexpected other raft warnings to stay at WARN", out)
	}
}
