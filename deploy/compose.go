package deploy

import (
	"bytes"
	"fmt"
	"net"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tidaldb/tidal/tidal-server/server"
)

// Compose is the subset of the Compose specification the deployment uses;
// any other field is an error (a typo must not silently do nothing).
type Compose struct {
	Name     string                     `yaml:"name"`
	Services map[string]*ComposeService `yaml:"services"`
	Volumes  map[string]*struct{}       `yaml:"volumes"`
	// Extensions are the x- keys (anchors for the shared node settings).
	Extensions map[string]any `yaml:",inline"`
}

// ComposeService is one node.
type ComposeService struct {
	Image           string   `yaml:"image"`
	Restart         string   `yaml:"restart"`
	StopGracePeriod string   `yaml:"stop_grace_period"`
	ReadOnly        bool     `yaml:"read_only"`
	CapDrop         []string `yaml:"cap_drop"`
	SecurityOpt     []string `yaml:"security_opt"`
	Hostname        string   `yaml:"hostname"`
	Command         []string `yaml:"command"`
	Ports           []string `yaml:"ports"`
	Volumes         []string `yaml:"volumes"`
}

// LoadCompose decodes a compose file strictly.
func LoadCompose(data []byte) (*Compose, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Compose
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("compose.yaml: %w", err)
	}
	for k := range c.Extensions {
		if !strings.HasPrefix(k, "x-") {
			return nil, fmt.Errorf("compose.yaml: field %s: not a Compose top-level field this deployment uses (name, services, volumes, x-*)", k)
		}
	}
	return &c, nil
}

// CheckCompose checks the compose file's invariants against srv.
func CheckCompose(c *Compose, srv Server) *Report {
	r := &Report{}
	names := make([]string, 0, len(c.Services))
	for n := range c.Services {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) < 1 || len(names)%2 == 0 {
		r.problem("compose.yaml: services", "expected an odd number of nodes (a quorum tolerates (n-1)/2 failures), found %d: %v", len(names), names)
	}
	type node struct {
		name, host string
		id         uint64
		peerPort   string
	}
	byID := map[uint64]node{}
	var peersLists []string
	hostPorts := map[string]string{}
	dataVolumes := map[string]string{}
	for _, name := range names {
		s := c.Services[name]
		at := func(field string) string { return "compose.yaml: services." + name + "." + field }
		if repo, _, _ := strings.Cut(s.Image, ":"); path.Base(repo) != "tidal-server" {
			r.problem(at("image"), "expected the tidal-server image (make images), found %q", s.Image)
		}
		checkRun(r, srv, at("command"), at("command"), s.Command)
		flags := runFlags(r, at("command"), s.Command)
		id, err := strconv.ParseUint(flags["id"], 10, 64)
		if err != nil || id == 0 {
			r.problem(at("command --id"), "expected a member id > 0, found %q", flags["id"])
		} else if o, dup := byID[id]; dup {
			r.problem(at("command --id"), "member %d is also %s", id, o.name)
		}
		host := name
		if s.Hostname != "" && s.Hostname != name {
			r.problem(at("hostname"), "expected the service name %s (peers dial it), found %q", name, s.Hostname)
		}
		chost, cport, err := net.SplitHostPort(flags["client-addr"])
		if err != nil || chost != "0.0.0.0" {
			r.problem(at("command --client-addr"), "expected 0.0.0.0:PORT (reachable from the published port), found %q", flags["client-addr"])
		}
		phost, pport, err := net.SplitHostPort(flags["peer-addr"])
		if err != nil || phost != "0.0.0.0" {
			r.problem(at("command --peer-addr"), "expected 0.0.0.0:PORT (reachable from the other nodes), found %q", flags["peer-addr"])
		}
		byID[id] = node{name: name, host: host, id: id, peerPort: pport}
		peersLists = append(peersLists, flags["peers"])

		// Published: the client port, on loopback only.
		if len(s.Ports) != 1 {
			r.problem(at("ports"), "expected one published port (the client API), found %q", s.Ports)
		}
		for _, p := range s.Ports {
			parts := strings.Split(p, ":")
			if len(parts) != 3 || parts[0] != "127.0.0.1" {
				r.problem(at("ports"), "%q: expected 127.0.0.1:HOST:CONTAINER (never every interface of the host)", p)
				continue
			}
			if parts[2] != cport {
				r.problem(at("ports"), "%q: expected the container side to be the client port %s", p, cport)
			}
			if o, dup := hostPorts[parts[1]]; dup {
				r.problem(at("ports"), "%q: host port %s is also published by %s", p, parts[1], o)
			}
			hostPorts[parts[1]] = name
			// The client address the node publishes (what `status`
			// dials to reach the leader) is where clients reach it.
			if want := parts[0] + ":" + parts[1]; flags["advertise-client-addr"] != want {
				r.problem(at("command --advertise-client-addr"), "expected %s (the published client port), found %q", want, flags["advertise-client-addr"])
			}
		}

		// Volumes: its own named volume at --data-dir; certs read-only.
		var dataOK, certsOK bool
		certsDir, tls := flags["certs-dir"]
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			if len(parts) < 2 {
				r.problem(at("volumes"), "%q: expected SOURCE:TARGET[:ro]", v)
				continue
			}
			src, target := parts[0], parts[1]
			ro := len(parts) == 3 && parts[2] == "ro"
			if target == flags["data-dir"] {
				if _, named := c.Volumes[src]; !named {
					r.problem(at("volumes"), "%q: expected --data-dir on a named volume declared under volumes:", v)
				} else if o, dup := dataVolumes[src]; dup {
					r.problem(at("volumes"), "%q: volume %s also holds %s's data", v, src, o)
				}
				dataVolumes[src] = name
				dataOK = true
			}
			if tls && (certsDir == target || strings.HasPrefix(certsDir, target+"/")) {
				if !ro {
					r.problem(at("volumes"), "%q: expected the certificates mounted read-only (:ro)", v)
				}
				certsOK = true
			}
		}
		if !dataOK {
			r.problem(at("volumes"), "expected a named volume at --data-dir %q (data must outlive the container)", flags["data-dir"])
		}
		if tls && !certsOK {
			r.problem(at("volumes"), "expected --certs-dir %q mounted from the host", certsDir)
		}
	}

	// Every node has the same --peers: each member at its service's name
	// and peer port.
	for i, p := range peersLists {
		if p != peersLists[0] {
			r.problem("compose.yaml: services."+names[i]+".command --peers", "expected the same list on every node, found %q and %q on %s", p, peersLists[0], names[0])
		}
	}
	if len(peersLists) > 0 {
		members, err := server.ParsePeers(peersLists[0])
		if err != nil {
			r.problem("compose.yaml: command --peers", "%v", err)
		}
		var listed []uint64
		for _, m := range members {
			listed = append(listed, m.ID)
			n, ok := byID[m.ID]
			if !ok {
				r.problem("compose.yaml: command --peers", "member %d: no service runs --id=%d", m.ID, m.ID)
				continue
			}
			if want := net.JoinHostPort(n.host, n.peerPort); m.PeerAddr != want {
				r.problem("compose.yaml: command --peers", "member %d: expected %s (service %s's name and --peer-addr port), found %s", m.ID, want, n.name, m.PeerAddr)
			}
		}
		var ids []uint64
		for id := range byID {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		slices.Sort(listed)
		if !slices.Equal(ids, listed) {
			r.problem("compose.yaml: command --peers", "expected members %v (the services' ids), found %v", ids, listed)
		}
	}
	return r
}
