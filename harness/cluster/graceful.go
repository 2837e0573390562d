package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"time"
)

// ExitReporter is a Handle that can say how its process ended: the exit
// code (-1 when a signal ended it) and os/exec's wording of the status.
// ok is false while the process runs, or when the backend cannot tell.
type ExitReporter interface {
	ExitCode() (code int, text string, ok bool)
}

// StopStatus stops name gracefully (SIGTERM, then wait for the process to
// exit; ctx bounds the drain, after which the process is killed) and
// returns its exit code and status text. A graceful stop should end with
// exit status 0: tidal-server hands off leadership, drains in-flight
// requests and exits clean; 1 is a failure while serving, 4 a fence, 5 a
// removal. code is -1 with the reason in text when the backend cannot
// report statuses, or a signal ended the process.
func (c *Cluster) StopStatus(ctx context.Context, name string) (code int, text string, err error) {
	n, h, err := c.handle(name, Running, Paused)
	if err != nil {
		return -1, "", err
	}
	err = h.Terminate(ctx)
	c.setState(n, Stopped)
	c.log.Info("node stopped (SIGTERM)", "node", name)
	code, text = -1, "unknown (the backend does not report exit statuses)"
	if r, ok := h.(ExitReporter); ok {
		if cd, tx, ok := r.ExitCode(); ok {
			code, text = cd, tx
		}
	}
	return code, text, err
}

// NodeLog is the path of name's structured log (its --log-file), where
// tidal-server writes raft's election steps as they happen.
func (c *Cluster) NodeLog(name string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(name)
	if err != nil {
		return "", err
	}
	return filepath.Join(n.Dir, "node.log"), nil
}

// WaitNodeReady waits until name answers /readyz with 200: it has a
// leader and has caught up with it. A rolling restart waits for this
// before it stops the next node.
func (c *Cluster) WaitNodeReady(ctx context.Context, name string) error {
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		last = c.AdminClient(name).Ready(cctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: %s: expected /readyz 200, last answer: %v: %w", name, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
