package report

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// What a run collects from its nodes at the end (audit, digest, metrics)
// goes into the store; the runners (harness/runner for tidal-chaos,
// harness/runbook for runbook pages) ask for it alike, with these.

// CollectAttempts is how many times a collector asks a node for its audit
// or digest before recording it unreadable.
const CollectAttempts = 3

// collectPause is the pause between two attempts.
const collectPause = time.Second

// Retry runs fn up to CollectAttempts times, a second apart, until it
// succeeds or ctx ends, and returns its last error.
func Retry(ctx context.Context, fn func() error) error {
	return retry(ctx, CollectAttempts, collectPause, fn)
}

func retry(ctx context.Context, attempts int, pause time.Duration, fn func() error) error {
	var err error
	for range attempts {
		if err = fn(); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
	return err
}

// Fetch GETs url with hc and hands the body of a 200 to fn; any other
// status, or fn's error, is the error.
func Fetch(ctx context.Context, hc *http.Client, url string, fn func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := fn(resp.Body); err != nil {
		return fmt.Errorf("GET %s: reading the body: %w", url, err)
	}
	return nil
}
