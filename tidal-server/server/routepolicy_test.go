package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/api"
	"github.com/tidaldb/tidal/tidal-server/auth"
)

// wildcard is a ServeMux wildcard segment, {name} or {name...}.
var wildcard = regexp.MustCompile(`\{[^}]*\}`)

// routeRequest is a request the ServeMux pattern matches: its method and
// its path with every wildcard filled in.
func routeRequest(pattern string) (*http.Request, string) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = http.MethodGet, pattern
	}
	path = wildcard.ReplaceAllString(path, "x1")
	return httptest.NewRequest(method, "http://node"+path, nil), path
}

// routesWithoutTheirRule are the API routes the policy governs by no rule
// of their own: only by the fail-closed default (admin) or by another
// route's pattern. Everything under /admin/ is the "/admin/" rule's.
func routesWithoutTheirRule(p *auth.Policy, patterns []string) []string {
	var out []string
	for _, pattern := range patterns {
		req, path := routeRequest(pattern)
		rule := p.Need(req)
		if rule.Pattern == pattern || rule.Pattern == "/admin/" && strings.HasPrefix(path, "/admin/") {
			continue
		}
		out = append(out, fmt.Sprintf("%s (governed by %q)", pattern, rule.Pattern))
	}
	return out
}

// The lifecycle suite's 401/403 matrix walks the
// policy's rules; this ties them to the API's own route table, so a
// route added to the API without its rule (it would need admin by the
// fail-closed default: a new read route refused to readers) fails here,
// and the matrix then covers every route the API serves.
func TestEveryAPIRouteHasItsPolicyRule(t *testing.T) {
	patterns := api.Patterns()
	for _, want := range []string{"POST /v1/signals", "GET /admin/backup", "GET /metrics"} {
		if !slices.Contains(patterns, want) {
			t.Fatalf("api.Patterns() lacks %q: %v", want, patterns)
		}
	}
	for _, openProbes := range []bool{true, false} {
		p, err := auth.NewPolicy(auth.DefaultRules(openProbes))
		if err != nil {
			t.Fatal(err)
		}
		if missing := routesWithoutTheirRule(p, patterns); len(missing) > 0 {
			t.Errorf("open probes %v: API routes without a rule of their own in auth.DefaultRules: %v", openProbes, missing)
		}
		// The check says false for a route the policy does not list,
		// and for one another rule's pattern happens to match.
		if got := routesWithoutTheirRule(p, []string{"GET /v1/new-read", "GET /v1/events/{id}/more", "DELETE /admin/members/{id}"}); len(got) != 2 {
			t.Errorf("open probes %v: expected the two routes outside /admin/ reported, found %v", openProbes, got)
		}
	}
}
