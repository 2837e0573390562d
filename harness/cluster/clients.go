package cluster

import (
	"fmt"
	"time"

	"github.com/tidaldb/tidal/tidal-server/client"
)

// Client returns a client for name through its client relay, as workload
// clients see the node: on a secured cluster it presents the writer's
// certificate (over TLS, HTTP/2) unless opts say otherwise (ClientAs).
func (c *Cluster) Client(name string, opts ...client.Option) *client.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(name)
	if err != nil {
		return client.New("127.0.0.1:1")
	}
	return client.New(n.ClientRelay, append(c.clientOptions(RoleWriter), opts...)...)
}

// IngestStream returns a streaming writer to name's gRPC ingest address
// (Config.GRPC), directly (the mesh relays the client port only): on a
// secured cluster it presents the writer's certificate unless opts say
// otherwise. The caller closes it.
func (c *Cluster) IngestStream(name string, opts ...client.Option) (*client.IngestStream, error) {
	c.mu.Lock()
	n, err := c.node(name)
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if n.GRPCAddr == "" {
		return nil, fmt.Errorf("cluster: %s serves no gRPC ingest stream (Config.GRPC is off)", name)
	}
	return client.NewIngestStream(n.GRPCAddr, append(c.clientOptions(RoleWriter), opts...)...)
}

// AdminClient talks to name directly, bypassing the mesh: the harness's
// own control traffic stands where Jepsen's control node stands. On a
// secured cluster it presents the admin's certificate.
func (c *Cluster) AdminClient(name string) *client.Client {
	return c.controlClient(name, RoleAdmin, false)
}

// ObserverClient talks to name directly, as a monitoring system would:
// on a secured cluster with the reader's bearer token (so every run also
// exercises token authentication).
func (c *Cluster) ObserverClient(name string) *client.Client {
	return c.controlClient(name, RoleReader, true)
}

type controlKey struct {
	name, role string
	token      bool
}

// controlClient returns the cached direct client for (name, role, token):
// pollers call it every tick, and a client per call would leave a
// keep-alive connection (and on a secured cluster cost a TLS handshake)
// per poll.
func (c *Cluster) controlClient(name, role string, token bool) *client.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(name)
	if err != nil {
		return client.New("127.0.0.1:1")
	}
	key := controlKey{name, role, token}
	if cl := c.control[key]; cl != nil {
		return cl
	}
	var opts []client.Option
	if c.sec != nil {
		opts = c.sec.Options(role, token)
	}
	cl := client.New(n.ClientAddr, append(opts, client.WithRetries(1), client.WithTimeout(2*time.Second))...)
	if c.control == nil {
		c.control = map[controlKey]*client.Client{}
	}
	c.control[key] = cl
	return cl
}
