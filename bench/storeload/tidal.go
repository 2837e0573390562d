package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidaldb/tidal/bench/closedloop"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// tidalTarget writes POST /v1/signals to the tidal leader through
// tidal-server/client, without retries (a failed write is an error, not a
// slower success). The client keeps one keep-alive connection per worker.
// With grpcEndpoints it writes on the leader's gRPC ingest stream instead:
// grpcStreams streams, worker w on stream w mod grpcStreams.
type tidalTarget struct {
	endpoints     []string
	grpcEndpoints []string
	grpcStreams   int
	timeout       time.Duration
	batch         int
	events        *events
	c             *client.Client
	streams       []*client.IngestStream
	workers       int
	tls           []client.Option // a secured cluster's client TLS; nil: plaintext
}

// leader asks every node for its status: the leader is the node whose own
// id is the leader id it reports.
func (t *tidalTarget) leader(ctx context.Context) (string, error) {
	var errs []error
	for _, ep := range t.endpoints {
		c := client.New(ep, append([]client.Option{client.WithRetries(0), client.WithTimeout(t.timeout)}, t.tls...)...)
		st, err := c.Status(ctx)
		c.CloseIdleConnections()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		if st.Leader != 0 && st.Node == st.Leader {
			return ep, nil
		}
	}
	return "", fmt.Errorf("expected one of the tidal nodes %v to report itself leader, found none: %w", t.endpoints, errors.Join(errs...))
}

// signalWriter is either transport's writer.
type signalWriter interface {
	WriteSignals(ctx context.Context, events []client.Event) (client.Ack, error)
}

func (t *tidalTarget) connect(ctx context.Context, leader string, workers int) (func(int) closedloop.Op, error) {
	t.workers = workers
	t.c = client.New(leader, append([]client.Option{client.WithRetries(0), client.WithTimeout(t.timeout)}, t.tls...)...)
	if t.grpcEndpoints != nil {
		addr := ""
		for i, ep := range t.endpoints {
			if ep == leader {
				addr = t.grpcEndpoints[i]
			}
		}
		for range t.grpcStreams {
			s, err := client.NewIngestStream(addr, append([]client.Option{client.WithRetries(0), client.WithTimeout(t.timeout)}, t.tls...)...)
			if err != nil {
				return nil, err
			}
			t.streams = append(t.streams, s)
		}
	}
	return func(worker int) closedloop.Op {
		r := t.events.rng(worker)
		batch := make([]client.Event, t.batch)
		var w signalWriter = t.c
		if len(t.streams) > 0 {
			w = t.streams[worker%len(t.streams)]
		}
		return func(ctx context.Context, seq uint64) (int, error) {
			for i := range batch {
				batch[i] = t.events.event(worker, seq, i, t.events.entity(r))
			}
			if _, err := w.WriteSignals(ctx, batch); err != nil {
				return 0, err
			}
			return len(batch), nil
		}
	}, nil
}

// connections is the number of workers over HTTP (HTTP/1.1 has one
// request in flight per connection, and the client keeps them alive), the
// number of streams (one connection each) over gRPC.
func (t *tidalTarget) connections() int {
	if len(t.streams) > 0 {
		return len(t.streams)
	}
	return t.workers
}

func (t *tidalTarget) close() {
	if t.c != nil {
		t.c.CloseIdleConnections()
	}
	for _, s := range t.streams {
		s.Close()
	}
}
