// Package control serves the relay's HTTP JSON API and holds its Go client.
//
// The server owns a registry of named relays and at most one mesh (whose
// relays also appear in the registry, named "peer:a:b" and "client:a", so
// faults can be added to a single mesh link by name). Every change call
// returns when the change acts on existing connections, with the time it
// did so ("at").
//
// Errors are {"error":{"code","message","field"}} with tidal-server's codes
// (one vocabulary for both: see the Code constants): 400 invalid_argument
// for malformed input (field names the culprit), 404 not_found for an
// unknown relay, fault, node or route, 409 conflict for a duplicate name, a
// port that cannot be bound (message carries the OS reason) or a mesh that
// exists, 413 too_large for a body over 1 MiB, 503 unavailable for a relay
// closed under the call, 500 internal for anything else.
package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tidaldb/tidal/tcp-relay/mesh"
	"github.com/tidaldb/tidal/tcp-relay/relay"
)

// RelayConfig creates a relay. Listen may use port 0; the reply carries
// the bound address.
type RelayConfig struct {
	Name     string `json:"name" yaml:"name"`
	Listen   string `json:"listen" yaml:"listen"`
	Upstream string `json:"upstream" yaml:"upstream"`
	// Faults are installed at creation (config files use this).
	Faults []relay.Spec `json:"faults,omitempty" yaml:"faults,omitempty"`
}

// RelayInfo describes a relay.
type RelayInfo struct {
	Name     string       `json:"name"`
	Listen   string       `json:"listen"`
	Upstream string       `json:"upstream"`
	Mesh     bool         `json:"mesh,omitempty"` // owned by the mesh: cannot be deleted alone
	Faults   []relay.Spec `json:"faults"`
	Stats    relay.Stats  `json:"stats"`
}

// FaultChange is the reply to adding or removing a fault.
type FaultChange struct {
	Fault *relay.Spec `json:"fault,omitempty"`
	At    time.Time   `json:"at"`
}

// MeshConfig creates the mesh.
type MeshConfig struct {
	Nodes map[string]mesh.Node `json:"nodes" yaml:"nodes"`
	// Host is the address the mesh's relays listen on (default 127.0.0.1);
	// "0.0.0.0" when the relay runs in a container that other containers
	// dial.
	Host string `json:"host,omitempty" yaml:"host,omitempty"`
	// ClientPorts fixes the port of each named node's client relay, so a
	// container runtime can publish it before the mesh exists.
	ClientPorts map[string]int `json:"client_ports,omitempty" yaml:"client_ports,omitempty"`
}

// MeshNode is one node of the mesh as seen through its relays.
type MeshNode struct {
	mesh.Node
	// ClientAddr is where clients dial this node.
	ClientAddr string `json:"client_addr"`
	// Peers maps each other node to the address this node must dial to
	// reach it.
	Peers map[string]string `json:"peers"`
}

// MeshInfo describes the mesh.
type MeshInfo struct {
	Nodes   map[string]MeshNode `json:"nodes"`
	Grudge  mesh.Grudge         `json:"grudge"`
	History []mesh.Change       `json:"history"`
}

// PartitionRequest imposes a partition shape. Kind is one of halves,
// isolate (node), oneway (from, to), bridge, majorities-ring, groups
// (groups). Order optionally fixes the node order for halves, bridge
// and majorities-ring (default: sorted names).
type PartitionRequest struct {
	Kind   string     `json:"kind"`
	Groups [][]string `json:"groups,omitempty"`
	Node   string     `json:"node,omitempty"`
	From   string     `json:"from,omitempty"`
	To     string     `json:"to,omitempty"`
	Order  []string   `json:"order,omitempty"`
}

// MeshFaultRequest adds a link fault on from->to, or on every peer link
// when both are empty.
type MeshFaultRequest struct {
	From  string     `json:"from,omitempty"`
	To    string     `json:"to,omitempty"`
	Fault relay.Spec `json:"fault"`
}

// Server is the control plane. Create with NewServer; serve Handler().
type Server struct {
	log *slog.Logger
	reg *prometheus.Registry

	mu     sync.Mutex
	relays map[string]*relay.Relay
	mesh   *mesh.Mesh
}

// NewServer returns a server with no relays.
func NewServer(log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{log: log, relays: map[string]*relay.Relay{}, reg: prometheus.NewRegistry()}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), metrics{s})
	return s
}

// Error codes of the JSON error body: tidal-server's (tidal-server/api),
// so a client, a script or an operator reads one vocabulary for both
// binaries. They are part of the API and never change meaning.
const (
	CodeInvalid     = "invalid_argument"
	CodeNotFound    = "not_found"
	CodeConflict    = "conflict"
	CodeTooLarge    = "too_large"
	CodeUnavailable = "unavailable"
	CodeInternal    = "internal"
)

// Error is the API's error body; the client returns it as an error. Field
// is always present ("" when no single field is at fault), as in
// tidal-server's errors.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%d %s: %s (field %s)", e.Status, e.Code, e.Message, e.Field)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

func badRequest(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: field, Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *Error {
	return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

func conflict(format string, args ...any) *Error {
	return &Error{Status: http.StatusConflict, Code: CodeConflict, Message: fmt.Sprintf(format, args...)}
}

// classify maps errors from relay and mesh onto API errors.
func classify(err error) *Error {
	var e *Error
	var fe *relay.FieldError
	switch {
	case errors.As(err, &e):
		return e
	case errors.As(err, &fe):
		return badRequest(fe.Field, "%s", fe.Msg)
	case errors.Is(err, relay.ErrNoFault), errors.Is(err, mesh.ErrUnknownNode):
		return notFound("%v", err)
	case errors.Is(err, relay.ErrFaultExists):
		return conflict("%v", err)
	case errors.Is(err, mesh.ErrBadShape):
		return badRequest("kind", "%v", err)
	case errors.Is(err, syscall.EADDRINUSE), errors.Is(err, syscall.EADDRNOTAVAIL), errors.Is(err, syscall.EACCES):
		return conflict("%v", err)
	case errors.Is(err, relay.ErrClosed):
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error()}
	}
	return &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Message: err.Error()}
}

// AddRelay creates and starts a relay with its initial faults.
func (s *Server) AddRelay(cfg RelayConfig) (RelayInfo, error) {
	if cfg.Name == "" {
		return RelayInfo{}, badRequest("name", "missing relay name")
	}
	if err := relay.CheckName(cfg.Name); err != nil {
		return RelayInfo{}, classify(err)
	}
	if cfg.Listen == "" {
		return RelayInfo{}, badRequest("listen", "missing listen address (host:port, port 0 for any)")
	}
	if cfg.Upstream == "" {
		return RelayInfo{}, badRequest("upstream", "missing upstream address (host:port)")
	}
	var faults []relay.Fault
	for i, sp := range cfg.Faults {
		f, err := sp.Fault()
		if err != nil {
			e := classify(err)
			e.Field = fmt.Sprintf("faults[%d].%s", i, e.Field)
			return RelayInfo{}, e
		}
		faults = append(faults, f)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.relays[cfg.Name]; ok {
		return RelayInfo{}, conflict("relay %q already exists", cfg.Name)
	}
	r, err := relay.Listen(relay.Config{Name: cfg.Name, Listen: cfg.Listen, Upstream: cfg.Upstream, Logger: s.log})
	if err != nil {
		return RelayInfo{}, classify(err)
	}
	if _, err := r.Apply(nil, faults); err != nil {
		r.Close()
		return RelayInfo{}, classify(err)
	}
	s.relays[cfg.Name] = r
	s.log.Info("relay created", "relay", cfg.Name, "listen", r.Addr().String(), "upstream", cfg.Upstream)
	return s.info(r), nil
}

func (s *Server) info(r *relay.Relay) RelayInfo {
	in := RelayInfo{Name: r.Name(), Listen: r.Addr().String(), Upstream: r.Upstream(), Faults: []relay.Spec{}, Stats: r.Stats()}
	in.Mesh = strings.HasPrefix(in.Name, "peer:") || strings.HasPrefix(in.Name, "client:")
	for _, f := range r.Faults() {
		in.Faults = append(in.Faults, f.Spec())
	}
	return in
}

func (s *Server) relay(name string) (*relay.Relay, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.relays[name]
	if !ok {
		return nil, notFound("no relay %q", name)
	}
	return r, nil
}

// CreateMesh starts the mesh's relays and registers them.
func (s *Server) CreateMesh(cfg MeshConfig) (MeshInfo, error) {
	if len(cfg.Nodes) < 2 {
		return MeshInfo{}, badRequest("nodes", "expected at least 2 nodes, found %d", len(cfg.Nodes))
	}
	for name, n := range cfg.Nodes {
		if n.Peer == "" {
			return MeshInfo{}, badRequest("nodes."+name+".peer", "missing peer address")
		}
		if n.Client == "" {
			return MeshInfo{}, badRequest("nodes."+name+".client", "missing client address")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mesh != nil {
		return MeshInfo{}, conflict("a mesh already exists (DELETE /mesh first)")
	}
	m, err := mesh.New(mesh.Config{Nodes: cfg.Nodes, Host: cfg.Host, ClientPorts: cfg.ClientPorts, Logger: s.log})
	if err != nil {
		if e := classify(err); e.Status != http.StatusInternalServerError {
			return MeshInfo{}, e
		}
		return MeshInfo{}, badRequest("nodes", "%v", err)
	}
	s.mesh = m
	for _, r := range m.Relays() {
		s.relays[r.Name()] = r
	}
	s.log.Info("mesh created", "nodes", m.Nodes())
	return meshInfo(m), nil
}

// Mesh returns the mesh, or nil.
func (s *Server) Mesh() *mesh.Mesh {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mesh
}

func meshInfo(m *mesh.Mesh) MeshInfo {
	in := MeshInfo{Nodes: map[string]MeshNode{}, Grudge: m.Grudge(), History: m.History()}
	if in.History == nil {
		in.History = []mesh.Change{}
	}
	for _, n := range m.Nodes() {
		node, _ := m.Node(n)
		ca, _ := m.ClientAddr(n)
		mn := MeshNode{Node: node, ClientAddr: ca, Peers: map[string]string{}}
		for _, to := range m.Nodes() {
			if a, err := m.PeerAddr(n, to); err == nil {
				mn.Peers[to] = a
			}
		}
		in.Nodes[n] = mn
	}
	return in
}

// Reset removes every fault from every relay and heals the mesh. It fails
// only for a relay closed under it, and names it.
func (s *Server) Reset() (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	if s.mesh != nil {
		if _, err := s.mesh.Reset(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range s.relays {
		if _, err := r.RemoveAll(); err != nil {
			errs = append(errs, err)
		}
	}
	return time.Now(), errors.Join(errs...)
}

// Close closes every relay.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for name, r := range s.relays {
		errs = append(errs, r.Close())
		delete(s.relays, name)
	}
	s.mesh = nil
	return errors.Join(errs...)
}

// Handler returns the API's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /relays", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		out := []RelayInfo{}
		for _, name := range slices.Sorted(maps.Keys(s.relays)) {
			out = append(out, s.info(s.relays[name]))
		}
		s.mu.Unlock()
		reply(w, http.StatusOK, out)
	})
	mux.HandleFunc("POST /relays", func(w http.ResponseWriter, r *http.Request) {
		var cfg RelayConfig
		if !decode(w, r, &cfg) {
			return
		}
		in, err := s.AddRelay(cfg)
		respond(w, http.StatusCreated, in, err)
	})
	mux.HandleFunc("GET /relays/{name}", func(w http.ResponseWriter, r *http.Request) {
		rl, err := s.relay(r.PathValue("name"))
		if err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, s.info(rl))
	})
	mux.HandleFunc("DELETE /relays/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		s.mu.Lock()
		rl, ok := s.relays[name]
		switch {
		case !ok:
			s.mu.Unlock()
			fail(w, notFound("no relay %q", name))
			return
		case s.info(rl).Mesh:
			s.mu.Unlock()
			fail(w, conflict("relay %q belongs to the mesh; DELETE /mesh removes it", name))
			return
		}
		delete(s.relays, name)
		s.mu.Unlock()
		rl.Close()
		reply(w, http.StatusOK, map[string]string{"deleted": name})
	})
	mux.HandleFunc("GET /relays/{name}/faults", func(w http.ResponseWriter, r *http.Request) {
		rl, err := s.relay(r.PathValue("name"))
		if err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, s.info(rl).Faults)
	})
	mux.HandleFunc("POST /relays/{name}/faults", func(w http.ResponseWriter, r *http.Request) {
		rl, err := s.relay(r.PathValue("name"))
		if err != nil {
			fail(w, err)
			return
		}
		var sp relay.Spec
		if !decode(w, r, &sp) {
			return
		}
		f, err := sp.Fault()
		if err != nil {
			fail(w, err)
			return
		}
		if f.Name == mesh.PartitionFault {
			fail(w, badRequest("name", "%q is reserved for mesh partitions", f.Name))
			return
		}
		at, err := rl.AddFault(f)
		spec := f.Spec()
		respond(w, http.StatusCreated, FaultChange{Fault: &spec, At: at}, err)
	})
	mux.HandleFunc("DELETE /relays/{name}/faults/{fault}", func(w http.ResponseWriter, r *http.Request) {
		rl, err := s.relay(r.PathValue("name"))
		if err != nil {
			fail(w, err)
			return
		}
		at, err := rl.RemoveFault(r.PathValue("fault"))
		respond(w, http.StatusOK, FaultChange{At: at}, err)
	})
	mux.HandleFunc("POST /mesh", func(w http.ResponseWriter, r *http.Request) {
		var cfg MeshConfig
		if !decode(w, r, &cfg) {
			return
		}
		in, err := s.CreateMesh(cfg)
		respond(w, http.StatusCreated, in, err)
	})
	mux.HandleFunc("GET /mesh", s.withMesh(func(w http.ResponseWriter, _ *http.Request, m *mesh.Mesh) {
		reply(w, http.StatusOK, meshInfo(m))
	}))
	mux.HandleFunc("DELETE /mesh", s.withMesh(func(w http.ResponseWriter, _ *http.Request, m *mesh.Mesh) {
		s.mu.Lock()
		for _, r := range m.Relays() {
			delete(s.relays, r.Name())
		}
		s.mesh = nil
		s.mu.Unlock()
		m.Close()
		reply(w, http.StatusOK, map[string]string{"deleted": "mesh"})
	}))
	mux.HandleFunc("POST /mesh/partition", s.withMesh(func(w http.ResponseWriter, r *http.Request, m *mesh.Mesh) {
		var req PartitionRequest
		if !decode(w, r, &req) {
			return
		}
		ch, err := partition(m, req)
		respond(w, http.StatusOK, ch, err)
	}))
	mux.HandleFunc("POST /mesh/heal", s.withMesh(func(w http.ResponseWriter, _ *http.Request, m *mesh.Mesh) {
		ch, err := m.Heal()
		respond(w, http.StatusOK, ch, err)
	}))
	mux.HandleFunc("POST /mesh/faults", s.withMesh(func(w http.ResponseWriter, r *http.Request, m *mesh.Mesh) {
		var req MeshFaultRequest
		if !decode(w, r, &req) {
			return
		}
		if (req.From == "") != (req.To == "") {
			fail(w, badRequest("to", "expected both from and to (one link) or neither (all links), found from=%q to=%q", req.From, req.To))
			return
		}
		f, err := req.Fault.Fault()
		if err != nil {
			e := classify(err)
			e.Field = "fault." + e.Field
			fail(w, e)
			return
		}
		ch, err := m.AddLinkFault(req.From, req.To, f)
		respond(w, http.StatusCreated, ch, err)
	}))
	mux.HandleFunc("DELETE /mesh/faults/{fault}", s.withMesh(func(w http.ResponseWriter, r *http.Request, m *mesh.Mesh) {
		q := r.URL.Query()
		ch, err := m.RemoveLinkFault(q.Get("from"), q.Get("to"), r.PathValue("fault"))
		respond(w, http.StatusOK, ch, err)
	}))
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, _ *http.Request) {
		at, err := s.Reset()
		respond(w, http.StatusOK, FaultChange{At: at}, err)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, notFound("no route %s %s", r.Method, r.URL.Path))
	})
	return mux
}

func partition(m *mesh.Mesh, req PartitionRequest) (mesh.Change, error) {
	switch req.Kind {
	case "halves":
		return m.Halves(req.Order...)
	case "isolate":
		if req.Node == "" {
			return mesh.Change{}, badRequest("node", "isolate needs the node to isolate")
		}
		return m.Isolate(req.Node)
	case "oneway":
		if req.From == "" || req.To == "" {
			return mesh.Change{}, badRequest("from", "oneway needs from and to")
		}
		return m.OneWay(req.From, req.To)
	case "bridge":
		return m.Bridge(req.Order...)
	case "majorities-ring":
		return m.MajoritiesRing(req.Order...)
	case "groups":
		if len(req.Groups) == 0 {
			return mesh.Change{}, badRequest("groups", "groups needs the groups, e.g. [[\"a\",\"b\"],[\"c\"]]")
		}
		ch, err := m.Partition(req.Groups...)
		if errors.Is(err, mesh.ErrBadShape) {
			return ch, badRequest("groups", "%v", err)
		}
		return ch, err
	case "":
		return mesh.Change{}, badRequest("kind", "missing; expected halves, isolate, oneway, bridge, majorities-ring or groups")
	}
	return mesh.Change{}, badRequest("kind", "expected halves, isolate, oneway, bridge, majorities-ring or groups, found %q", req.Kind)
}

func (s *Server) withMesh(h func(http.ResponseWriter, *http.Request, *mesh.Mesh)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		m := s.Mesh()
		if m == nil {
			fail(w, notFound("no mesh (POST /mesh creates one)"))
			return
		}
		h(w, r, m)
	}
}

// maxBody bounds request bodies; no valid request comes near it.
const maxBody = 1 << 20

// decode reads a JSON body strictly: unknown fields, trailing data and
// wrong types are 400s that name the field.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON object")
	}
	if err == nil {
		return true
	}
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	var me *http.MaxBytesError
	switch {
	case errors.As(err, &me):
		fail(w, &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, Field: "body", Message: fmt.Sprintf("body over the %d-byte limit", me.Limit)})
	case errors.As(err, &te):
		fail(w, badRequest(te.Field, "expected %s, found JSON %s", te.Type, te.Value))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		fail(w, badRequest(field, "unknown field %q", field))
	case errors.As(err, &se):
		fail(w, badRequest("body", "malformed JSON at byte %d: %v", se.Offset, err))
	case errors.Is(err, io.EOF):
		fail(w, badRequest("body", "expected a JSON object, found an empty body"))
	default:
		fail(w, badRequest("body", "malformed JSON: %v", err))
	}
	return false
}

func respond(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, status, v)
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func fail(w http.ResponseWriter, err error) {
	e := classify(err)
	reply(w, e.Status, map[string]*Error{"error": e})
}

// metrics exposes every relay's counters at scrape time, so there is one
// source of truth (the relay) and nothing to keep in sync.
type metrics struct{ s *Server }

var (
	descConns  = prometheus.NewDesc("tcprelay_connections_total", "Connections accepted and forwarded.", []string{"relay"}, nil)
	descActive = prometheus.NewDesc("tcprelay_connections_active", "Connections open now.", []string{"relay"}, nil)
	descBytes  = prometheus.NewDesc("tcprelay_bytes_total", "Bytes forwarded, by direction (upstream = towards the server).", []string{"relay", "direction"}, nil)
	descFaults = prometheus.NewDesc("tcprelay_faults_active", "Faults installed.", []string{"relay"}, nil)
)

func (metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descConns
	ch <- descActive
	ch <- descBytes
	ch <- descFaults
}

func (m metrics) Collect(ch chan<- prometheus.Metric) {
	m.s.mu.Lock()
	relays := slices.Collect(maps.Values(m.s.relays))
	m.s.mu.Unlock()
	for _, r := range relays {
		st := r.Stats()
		ch <- prometheus.MustNewConstMetric(descConns, prometheus.CounterValue, float64(st.ConnectionsTotal), r.Name())
		ch <- prometheus.MustNewConstMetric(descActive, prometheus.GaugeValue, float64(st.ConnectionsActive), r.Name())
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(st.BytesUpstream), r.Name(), "upstream")
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(st.BytesDownstream), r.Name(), "downstream")
		ch <- prometheus.MustNewConstMetric(descFaults, prometheus.GaugeValue, float64(st.FaultsActive), r.Name())
	}
}
