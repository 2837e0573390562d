// Command storeload drives closed-loop writes against an etcd cluster or a
// tidal-server cluster with the same loop (bench/closedloop), the same
// events and the same clock, and prints what it measured as JSON: the
// load tool of the side-by-side benchmark (`./ci/bench -side-by-side`).
//
//	storeload -system etcd  -endpoints 127.0.0.1:2379,127.0.0.1:2479,127.0.0.1:2579 -clients 64
//	storeload -system tidal -endpoints 127.0.0.1:7070,127.0.0.1:7071,127.0.0.1:7072 -clients 64 [-batch 100]
//	storeload -system tidal -endpoints ... -protocol grpc -grpc-endpoints 127.0.0.1:7080,127.0.0.1:7081,127.0.0.1:7082
//
// It asks every endpoint who leads and sends every write to the leader
// (so neither system pays a follower's forwarding hop), and checks again
// afterwards that the leader did not change during the run.
//
// One write is one event {id, entity, signal}: tidal gets it as a
// one-event POST /v1/signals through tidal-server/client (-protocol http)
// or as a one-event request on the gRPC ingest stream (-protocol grpc:
// client.IngestStream, the workers sharing -grpc-streams streams); etcd gets it as
// a Put of its JSON under /tidal-bench/signals/<entity>. Ids are unique per
// run; entities are drawn uniformly from -entities.
//
// This is its own Go module (see go.mod) so that etcd's client stays out
// of the main module's dependencies.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tidaldb/tidal/bench/closedloop"
	"github.com/tidaldb/tidal/tidal-server/client"
)

// target is one system under load.
type target interface {
	// leader returns the endpoint of the current leader.
	leader(ctx context.Context) (string, error)
	// connect prepares writes to the leader for the given number of
	// workers and returns each worker's op.
	connect(ctx context.Context, leader string, workers int) (func(worker int) closedloop.Op, error)
	connections() int
	close()
}

type options struct {
	system     string
	endpoints  []string
	clients    int
	batch      int
	etcdConns  int
	entities   uint64
	warmup     time.Duration
	duration   time.Duration
	timeout    time.Duration
	jsonPath   string
	nonceSeed  uint64
	signalName string
	// protocol is how tidal is written: http (POST /v1/signals) or grpc
	// (the ingest stream at grpcEndpoints, in -endpoints' order).
	protocol      string
	grpcEndpoints []string
	grpcStreams   int
	// certsDir, when set, makes the tidal writes TLS: trust
	// certsDir/ca.crt and present client.<certName>.crt (a secured
	// cluster), over HTTPS or on the ingest stream; http1 keeps
	// HTTPS on HTTP/1.1, one connection per worker, instead of HTTP/2's
	// one multiplexed one (the stream is always HTTP/2).
	certsDir string
	certName string
	http1    bool
}

func main() {
	var o options
	var endpoints string
	flag.StringVar(&o.system, "system", "", "etcd or tidal")
	flag.StringVar(&endpoints, "endpoints", "", "comma-separated client addresses (host:port) of every member")
	flag.IntVar(&o.clients, "clients", 1, "closed-loop workers, each with one write in flight")
	flag.IntVar(&o.batch, "batch", 1, "events per request (tidal only)")
	// One clientv3 client (one gRPC connection, requests multiplexed over
	// HTTP/2) is how an application uses etcd, and it was the fastest of 1,
	// clients/10 and one per worker at 256 workers on this machine.
	flag.IntVar(&o.etcdConns, "etcd-conns", 1, "gRPC connections the etcd workers share (0: one per worker)")
	flag.Uint64Var(&o.entities, "entities", 100000, "entity ids are drawn uniformly from 1..entities")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "writes completing before this are not counted")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "the measured window")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Second, "bound on each write (a write past it counts as an error)")
	flag.StringVar(&o.jsonPath, "json", "", "write the result here instead of standard output")
	flag.StringVar(&o.signalName, "signal", "view", "signal type of every event")
	var grpcEndpoints string
	flag.StringVar(&o.protocol, "protocol", "http", "tidal only: http (POST /v1/signals, one connection per worker) or grpc (the gRPC ingest stream)")
	flag.StringVar(&grpcEndpoints, "grpc-endpoints", "", "tidal -protocol grpc: every member's --grpc-addr, in the order of -endpoints")
	flag.IntVar(&o.grpcStreams, "grpc-streams", 1, "tidal -protocol grpc: streams (each on its own connection) the workers share")
	flag.StringVar(&o.certsDir, "certs-dir", "", "tidal only: speak TLS trusting DIR/ca.crt and presenting DIR/client.NAME.crt (-cert-name), over HTTPS (HTTP/2 unless -http1) or on the ingest stream (-protocol grpc)")
	flag.StringVar(&o.certName, "cert-name", "writer", "with -certs-dir: the client certificate to present")
	flag.BoolVar(&o.http1, "http1", false, "with -certs-dir and -protocol http: HTTP/1.1 over TLS, one connection per worker (default HTTP/2, one connection)")
	flag.Parse()
	o.endpoints = splitList(endpoints)
	o.grpcEndpoints = splitList(grpcEndpoints)
	o.nonceSeed = rand.Uint64()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "storeload:", err)
		os.Exit(1)
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func run(ctx context.Context, o options) error {
	if len(o.endpoints) == 0 {
		return errors.New("-endpoints: expected at least one address, found none")
	}
	if o.batch < 1 {
		return fmt.Errorf("-batch: expected at least 1, found %d", o.batch)
	}
	if o.system != "tidal" && (o.certsDir != "" || o.http1) {
		return fmt.Errorf("-certs-dir and -http1: for -system tidal only, found -system %q", o.system)
	}
	var t target
	events := newEvents(o.nonceSeed, o.entities, o.signalName)
	switch o.system {
	case "etcd":
		if o.batch != 1 {
			return fmt.Errorf("-batch %d: etcd is measured with single-event writes only", o.batch)
		}
		conns := o.etcdConns
		if conns <= 0 {
			conns = o.clients
		}
		t = &etcdTarget{endpoints: o.endpoints, conns: conns, timeout: o.timeout, events: events}
	case "tidal":
		opts, err := tidalCredentials(o)
		if err != nil {
			return err
		}
		tt := &tidalTarget{endpoints: o.endpoints, timeout: o.timeout, batch: o.batch, events: events, opts: opts, http1: o.http1}
		switch o.protocol {
		case "http", "":
		case "grpc":
			if o.http1 {
				// The stream is gRPC, which is HTTP/2 only.
				return errors.New("-http1 and -protocol grpc: expected one, found both (the ingest stream is always HTTP/2)")
			}
			if len(o.grpcEndpoints) != len(o.endpoints) {
				return fmt.Errorf("-grpc-endpoints: expected one address per -endpoints address (%d), found %d", len(o.endpoints), len(o.grpcEndpoints))
			}
			tt.grpcEndpoints, tt.grpcStreams = o.grpcEndpoints, max(o.grpcStreams, 1)
		default:
			return fmt.Errorf("-protocol: expected http or grpc, found %q", o.protocol)
		}
		t = tt
	default:
		return fmt.Errorf("-system: expected etcd or tidal, found %q", o.system)
	}
	defer t.close()

	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	leader, err := t.leader(lctx)
	cancel()
	if err != nil {
		return err
	}
	newOp, err := t.connect(ctx, leader, o.clients)
	if err != nil {
		return err
	}
	cpu0 := cpuSeconds()
	res, err := closedloop.Run(ctx, closedloop.Config{
		Clients: o.clients, Warmup: o.warmup, Duration: o.duration, OpTimeout: o.timeout,
	}, newOp)
	if err != nil {
		return err
	}
	out := closedloop.Record{System: o.system, Protocol: protocolOf(o), Leader: leader, Batch: o.batch, Connections: t.connections(),
		ToolCPUSeconds: cpuSeconds() - cpu0, Result: res}
	if _, ok := t.(*etcdTarget); ok {
		_, v := etcdPut(events.event(0, 0, 0, o.entities))
		out.ValueBytes = len(v)
	}
	lctx, cancel = context.WithTimeout(ctx, 30*time.Second)
	after, err := t.leader(lctx)
	cancel()
	out.LeaderChanged = err != nil || after != leader

	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if o.jsonPath == "" {
		_, err = os.Stdout.Write(data)
		return err
	}
	return os.WriteFile(o.jsonPath, data, 0o644)
}

// protocolOf names what the writes travelled on, for the record.
func protocolOf(o options) string {
	if o.system == "etcd" || o.protocol == "grpc" {
		return "grpc"
	}
	return "http"
}

// cpuSeconds is this process's user + system CPU time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// events makes the events both systems write: the same ids, entities and
// encoding for the same worker and sequence number.
type events struct {
	nonce    string
	entities uint64
	signal   string
}

func newEvents(seed, entities uint64, signal string) *events {
	return &events{nonce: strconv.FormatUint(seed, 36), entities: max(entities, 1), signal: signal}
}

// rng is a worker's entity source: deterministic per worker and run.
func (e *events) rng(worker int) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(worker), 0x5eed))
}

// event is worker's event number seq (of a request, position i in it).
func (e *events) event(worker int, seq uint64, i int, entity uint64) client.Event {
	return client.Event{
		ID:     e.nonce + "-" + strconv.Itoa(worker) + "-" + strconv.FormatUint(seq, 10) + "-" + strconv.Itoa(i),
		Entity: entity,
		Signal: e.signal,
	}
}

// entity draws the next entity id of a worker.
func (e *events) entity(r *rand.Rand) uint64 { return r.Uint64N(e.entities) + 1 }

// etcdPut is the key and value etcd stores for an event: its JSON, the
// same bytes tidal receives inside its request.
func etcdPut(ev client.Event) (key string, value []byte) {
	data, _ := json.Marshal(ev) // a struct of strings and integers cannot fail
	return "/tidal-bench/signals/" + strconv.FormatUint(ev.Entity, 10), data
}
