package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/tidaldb/tidal/bench/closedloop"
	"github.com/tidaldb/tidal/tidal-server/certs"
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
	// opts are the credentials of a secured cluster (none: plaintext),
	// for HTTP and the stream alike; http1 keeps HTTPS on HTTP/1.1 (see
	// connections).
	opts  []client.Option
	http1 bool
}

// tidalCredentials are the client options -certs-dir and -http1 ask for:
// none for plaintext; TLS with the client certificate, over HTTP/2 as
// tidal-server/client speaks it by default, or over HTTP/1.1 through a
// transport that offers only http/1.1 by ALPN.
func tidalCredentials(o options) ([]client.Option, error) {
	if o.certsDir == "" {
		if o.http1 {
			return nil, errors.New("-http1: needs -certs-dir (plaintext is always HTTP/1.1)")
		}
		return nil, nil
	}
	cfg, err := certs.ClientTLS(o.certsDir, o.certName)
	if err != nil {
		return nil, fmt.Errorf("-certs-dir: %w", err)
	}
	opts := []client.Option{client.WithTLS(cfg)}
	if o.http1 {
		h1 := cfg.Clone()
		h1.NextProtos = []string{"http/1.1"}
		opts = append(opts, client.WithHTTPClient(&http.Client{Transport: &http.Transport{
			TLSClientConfig:     h1,
			MaxIdleConnsPerHost: 1024,
			DisableCompression:  true,
		}}))
	}
	return opts, nil
}

// leader asks every node for its status: the leader is the node whose own
// id is the leader id it reports.
func (t *tidalTarget) leader(ctx context.Context) (string, error) {
	var errs []error
	for _, ep := range t.endpoints {
		c := client.New(ep, append([]client.Option{client.WithRetries(0), client.WithTimeout(t.timeout)}, t.opts...)...)
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
	t.c = client.New(leader, append([]client.Option{client.WithRetries(0), client.WithTimeout(t.timeout)}, t.opts...)...)
	if t.grpcEndpoints != nil {
		addr := ""
		for i, ep := range t.endpoints {
			if ep == leader {
				addr = t.grpcEndpoints[i]
			}
		}
		for range t.grpcStreams {
			s, err := client.NewIngestStream(addr, append([]client.Option{client.WithRetries(0), client.WithTimeout(t.timeout)}, t.opts...)...)
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

// connections is the number of streams (one connection each) over gRPC;
// over HTTP the number of workers: HTTP/1.1 has one request in flight
// per connection, and the client keeps them alive. Over TLS with HTTP/2
// every worker shares one connection (Go's transport opens more only past
// the server's stream limit, 250 by default, above any client count the
// benchmark uses).
func (t *tidalTarget) connections() int {
	if len(t.streams) > 0 {
		return len(t.streams)
	}
	if len(t.opts) > 0 && !t.http1 {
		return 1
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
