package client

import (
	"context"
	"errors"
	"testing"
	"time"
)

// pauseBeforeRetry, shared by the HTTP calls and the ingest stream: it
// waits out the backoff, gives up at once when ctx's deadline falls before
// the retry (the server's longer Retry-After counting), and when ctx ends.
func TestPauseBeforeRetry(t *testing.T) {
	c := New("127.0.0.1:1", WithBackoff(time.Millisecond, time.Millisecond))
	if !c.pauseBeforeRetry(context.Background(), 1, errors.New("refused")) {
		t.Fatal("no deadline: expected the pause to end in a retry")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	busy := &APIError{Status: 503, RetryAfter: 2 * time.Hour}
	if c.pauseBeforeRetry(ctx, 1, busy) {
		t.Fatal("a Retry-After past ctx's deadline: expected no retry")
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	slow := New("127.0.0.1:1", WithBackoff(time.Hour, time.Hour))
	if slow.pauseBeforeRetry(done, 1, errors.New("refused")) {
		t.Fatal("ctx ended: expected no retry")
	}
}
