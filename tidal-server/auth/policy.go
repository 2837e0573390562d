package auth

import (
	"fmt"
	"net/http"
)

// Rule says what a route needs. Pattern is an http.ServeMux pattern
// ("GET /v1/top", "/admin/"), matched exactly as the API's own mux
// matches it. Either Open is set (no credentials needed) or Role is the
// least role allowed.
type Rule struct {
	Pattern string
	Role    Role
	Open    bool
}

// Policy maps a request to the role it needs. A request no rule matches
// needs Admin: a route added to the API but not to the policy is closed,
// not open.
type Policy struct {
	mux   *http.ServeMux
	rules map[string]Rule
	list  []Rule
}

// DefaultRules is the client plane's route table (DESIGN.md):
//
//	open     GET /healthz, /readyz, /metrics (unless openProbes is false: then reader)
//	reader   GET /v1/entities/{entity}, /v1/top, /v1/events/{id...},
//	         /v1/audit/events, /v1/audit/digest, /cluster/status;
//	         POST /v1/query/nearest (a read that carries its vector in a body)
//	writer   POST /v1/signals, PUT /v1/entities/{entity}/embedding
//	admin    everything under /admin/ (members, transfer-leader, snapshot,
//	         backup), and any route not listed here
func DefaultRules(openProbes bool) []Rule {
	probe := func(p string) Rule {
		if openProbes {
			return Rule{Pattern: p, Open: true}
		}
		return Rule{Pattern: p, Role: Reader}
	}
	return []Rule{
		probe("GET /healthz"),
		probe("GET /readyz"),
		probe("GET /metrics"),
		{Pattern: "GET /v1/entities/{entity}", Role: Reader},
		{Pattern: "POST /v1/query/nearest", Role: Reader},
		{Pattern: "GET /v1/top", Role: Reader},
		{Pattern: "GET /v1/events/{id...}", Role: Reader},
		{Pattern: "GET /v1/audit/events", Role: Reader},
		{Pattern: "GET /v1/audit/digest", Role: Reader},
		{Pattern: "GET /cluster/status", Role: Reader},
		{Pattern: "POST /v1/signals", Role: Writer},
		{Pattern: "PUT /v1/entities/{entity}/embedding", Role: Writer},
		{Pattern: "/admin/", Role: Admin},
	}
}

// NewPolicy builds a policy from rules. A rule with neither Open nor a
// valid Role, with both, or a pattern ServeMux refuses (malformed, or in
// conflict with another) is an error.
func NewPolicy(rules []Rule) (*Policy, error) {
	p := &Policy{mux: http.NewServeMux(), rules: make(map[string]Rule, len(rules))}
	for i, r := range rules {
		switch {
		case r.Open && r.Role != 0:
			return nil, fmt.Errorf("policy rule %d (%q): open and role %s both set; choose one", i, r.Pattern, r.Role)
		case !r.Open && !r.Role.Valid():
			return nil, fmt.Errorf("policy rule %d (%q): expected a role (reader, writer, admin) or open, found %s", i, r.Pattern, r.Role)
		}
		if _, dup := p.rules[r.Pattern]; dup {
			return nil, fmt.Errorf("policy rule %d (%q): pattern listed twice", i, r.Pattern)
		}
		if err := register(p.mux, r.Pattern); err != nil {
			return nil, fmt.Errorf("policy rule %d (%q): %v", i, r.Pattern, err)
		}
		p.rules[r.Pattern] = r
		p.list = append(p.list, r)
	}
	return p, nil
}

// register adds a pattern to mux, turning ServeMux's panic on a bad or
// conflicting pattern into an error.
func register(mux *http.ServeMux, pattern string) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	mux.Handle(pattern, http.NotFoundHandler())
	return nil
}

// Rules returns the policy's rules in the order given.
func (p *Policy) Rules() []Rule { return append([]Rule(nil), p.list...) }

// Need returns the rule that governs r: the matching rule, or an Admin
// rule with an empty pattern when none matches.
func (p *Policy) Need(r *http.Request) Rule {
	_, pattern := p.mux.Handler(r)
	if rule, ok := p.rules[pattern]; ok {
		return rule
	}
	return Rule{Role: Admin}
}
