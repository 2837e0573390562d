package control

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/tidaldb/tidal/tcp-relay/mesh"
	"github.com/tidaldb/tidal/tcp-relay/relay"
)

// Client calls a control server. API errors come back as *Error.
type Client struct {
	base string
	hc   *http.Client
}

// NewClient returns a client for the server at addr ("127.0.0.1:8474" or
// "http://127.0.0.1:8474"). hc may be nil.
func NewClient(addr string, hc *http.Client) *Client {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	return &Client{base: strings.TrimRight(addr, "/"), hc: hc}
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: reading reply: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var eb struct{ Error *Error }
		if json.Unmarshal(data, &eb) != nil || eb.Error == nil {
			// Not our API answering (a proxy, a wrong address): name the
			// status in the same vocabulary, as tidal-server's client does.
			return &Error{Status: resp.StatusCode, Code: codeForStatus(resp.StatusCode), Message: fmt.Sprintf("%s %s: %s", method, path, bytes.TrimSpace(data))}
		}
		eb.Error.Status = resp.StatusCode
		return eb.Error
	}
	if out == nil {
		return nil
	}
	if s, ok := out.(*string); ok {
		*s = string(data)
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decoding reply: %w", method, path, err)
	}
	return nil
}

func esc(s string) string { return url.PathEscape(s) }

// Healthz checks the server is up.
func (c *Client) Healthz(ctx context.Context) error { return c.do(ctx, "GET", "/healthz", nil, nil) }

// Metrics returns the Prometheus exposition text.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	var s string
	err := c.do(ctx, "GET", "/metrics", nil, &s)
	return s, err
}

// Relays lists every relay, mesh relays included.
func (c *Client) Relays(ctx context.Context) ([]RelayInfo, error) {
	var out []RelayInfo
	return out, c.do(ctx, "GET", "/relays", nil, &out)
}

// CreateRelay creates a relay; the reply's Listen is the bound address.
func (c *Client) CreateRelay(ctx context.Context, cfg RelayConfig) (RelayInfo, error) {
	var out RelayInfo
	return out, c.do(ctx, "POST", "/relays", cfg, &out)
}

// Relay describes one relay.
func (c *Client) Relay(ctx context.Context, name string) (RelayInfo, error) {
	var out RelayInfo
	return out, c.do(ctx, "GET", "/relays/"+esc(name), nil, &out)
}

// DeleteRelay closes a relay and its connections.
func (c *Client) DeleteRelay(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/relays/"+esc(name), nil, nil)
}

// Faults lists a relay's faults.
func (c *Client) Faults(ctx context.Context, relayName string) ([]relay.Spec, error) {
	var out []relay.Spec
	return out, c.do(ctx, "GET", "/relays/"+esc(relayName)+"/faults", nil, &out)
}

// AddFault installs a fault; it returns once the fault acts on existing
// connections.
func (c *Client) AddFault(ctx context.Context, relayName string, f relay.Spec) (FaultChange, error) {
	var out FaultChange
	return out, c.do(ctx, "POST", "/relays/"+esc(relayName)+"/faults", f, &out)
}

// RemoveFault removes a fault.
func (c *Client) RemoveFault(ctx context.Context, relayName, fault string) (FaultChange, error) {
	var out FaultChange
	return out, c.do(ctx, "DELETE", "/relays/"+esc(relayName)+"/faults/"+esc(fault), nil, &out)
}

// CreateMesh creates the mesh.
func (c *Client) CreateMesh(ctx context.Context, cfg MeshConfig) (MeshInfo, error) {
	var out MeshInfo
	return out, c.do(ctx, "POST", "/mesh", cfg, &out)
}

// Mesh describes the mesh: addresses, grudge, history.
func (c *Client) Mesh(ctx context.Context) (MeshInfo, error) {
	var out MeshInfo
	return out, c.do(ctx, "GET", "/mesh", nil, &out)
}

// DeleteMesh closes the mesh and its relays.
func (c *Client) DeleteMesh(ctx context.Context) error { return c.do(ctx, "DELETE", "/mesh", nil, nil) }

// Partition imposes a partition shape.
func (c *Client) Partition(ctx context.Context, req PartitionRequest) (mesh.Change, error) {
	var out mesh.Change
	return out, c.do(ctx, "POST", "/mesh/partition", req, &out)
}

// Heal removes the mesh partition.
func (c *Client) Heal(ctx context.Context) (mesh.Change, error) {
	var out mesh.Change
	return out, c.do(ctx, "POST", "/mesh/heal", nil, &out)
}

// AddMeshFault adds a link fault on one link or (from, to empty) all.
func (c *Client) AddMeshFault(ctx context.Context, req MeshFaultRequest) (mesh.Change, error) {
	var out mesh.Change
	return out, c.do(ctx, "POST", "/mesh/faults", req, &out)
}

// RemoveMeshFault removes a link fault from one link or (from, to empty) all.
func (c *Client) RemoveMeshFault(ctx context.Context, from, to, fault string) (mesh.Change, error) {
	var out mesh.Change
	q := url.Values{}
	if from != "" || to != "" {
		q.Set("from", from)
		q.Set("to", to)
	}
	path := "/mesh/faults/" + esc(fault)
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return out, c.do(ctx, "DELETE", path, nil, &out)
}

// Reset removes every fault everywhere and heals the mesh.
func (c *Client) Reset(ctx context.Context) (FaultChange, error) {
	var out FaultChange
	return out, c.do(ctx, "POST", "/reset", nil, &out)
}

// codeForStatus is the error code a status stands for when the body
// carries none.
func codeForStatus(status int) string {
	switch status {
	case http.StatusBadRequest:
		return CodeInvalid
	case http.StatusNotFound:
		return CodeNotFound
	case http.StatusConflict:
		return CodeConflict
	case http.StatusRequestEntityTooLarge:
		return CodeTooLarge
	case http.StatusServiceUnavailable:
		return CodeUnavailable
	}
	return CodeInternal
}
