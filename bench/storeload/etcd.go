package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tidaldb/tidal/bench/closedloop"
)

// etcdTarget writes Puts to the etcd leader over conns gRPC connections,
// worker w on connection w mod conns.
type etcdTarget struct {
	endpoints []string
	conns     int
	timeout   time.Duration
	events    *events
	clients   []*clientv3.Client
}

func (t *etcdTarget) dial(endpoints []string) (*clientv3.Client, error) {
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: t.timeout,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", endpoints, err)
	}
	return c, nil
}

// leader asks every member for its status: the leader is the member whose
// own id is the leader id it reports.
func (t *etcdTarget) leader(ctx context.Context) (string, error) {
	c, err := t.dial(t.endpoints)
	if err != nil {
		return "", err
	}
	defer c.Close()
	var errs []error
	for _, ep := range t.endpoints {
		st, err := c.Status(ctx, ep)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", ep, err))
			continue
		}
		if st.Header != nil && st.Header.MemberId == st.Leader {
			return ep, nil
		}
	}
	return "", fmt.Errorf("expected one of the etcd members %v to report itself leader, found none: %w", t.endpoints, errors.Join(errs...))
}

func (t *etcdTarget) connect(ctx context.Context, leader string, workers int) (func(int) closedloop.Op, error) {
	for range min(t.conns, workers) {
		c, err := t.dial([]string{leader})
		if err != nil {
			return nil, err
		}
		t.clients = append(t.clients, c)
	}
	return func(worker int) closedloop.Op {
		kv := t.clients[worker%len(t.clients)]
		r := t.events.rng(worker)
		return func(ctx context.Context, seq uint64) (int, error) {
			key, value := etcdPut(t.events.event(worker, seq, 0, t.events.entity(r)))
			if _, err := kv.Put(ctx, key, string(value)); err != nil {
				return 0, err
			}
			return 1, nil
		}
	}, nil
}

func (t *etcdTarget) connections() int { return len(t.clients) }

func (t *etcdTarget) close() {
	for _, c := range t.clients {
		c.Close()
	}
}
