package auth

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// defaultRoutes is every route of the client API (DESIGN.md) with the
// role it needs; 0 means open.
var defaultRoutes = []struct {
	method, path string
	need         Role
}{
	{"GET", "/healthz", 0},
	{"HEAD", "/healthz", 0},
	{"GET", "/readyz", 0},
	{"GET", "/metrics", 0},
	{"GET", "/v1/entities/42", Reader},
	{"GET", "/v1/entities/42?consistency=local", Reader},
	{"POST", "/v1/query/nearest", Reader},
	{"GET", "/v1/top?signal=like&window=1h&k=3", Reader},
	{"GET", "/v1/events/ev-1", Reader},
	{"GET", "/v1/events/a/b", Reader},
	{"GET", "/v1/audit/events", Reader},
	{"GET", "/v1/audit/digest", Reader},
	{"GET", "/cluster/status", Reader},
	{"POST", "/v1/signals", Writer},
	{"PUT", "/v1/entities/42/embedding", Writer},
	{"POST", "/admin/members", Admin},
	{"DELETE", "/admin/members/4", Admin},
	{"POST", "/admin/transfer-leader", Admin},
	{"POST", "/admin/snapshot", Admin},
	{"GET", "/admin/backup", Admin},
	// Not routes of the API: closed to all but admin (fail closed), so a
	// route added to the API and forgotten here is not open.
	{"GET", "/admin", Admin},
	{"DELETE", "/v1/signals", Admin},
	{"GET", "/v1/signals", Admin},
	{"POST", "/v1/entities/42", Admin},
	{"GET", "/debug/pprof/", Admin},
	{"GET", "/", Admin},
	{"GET", "/nope", Admin},
	{"POST", "/healthz", Admin},
	// A path ServeMux would clean is redirected by the API's mux (the
	// same ServeMux rules): the policy asks for the role of the route the
	// redirect leads to, so the answer (a redirect) is no more than the
	// caller may see.
	{"GET", "/v1//top", Reader},
	{"GET", "/v1/../admin/backup", Admin},
	{"GET", "/v1/./../healthz", 0},
}

func TestDefaultPolicy(t *testing.T) {
	p, err := NewPolicy(DefaultRules(true))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range defaultRoutes {
		req := httptest.NewRequest(r.method, "http://x"+r.path, nil)
		rule := p.Need(req)
		if r.need == 0 && !rule.Open || r.need != 0 && (rule.Open || rule.Role != r.need) {
			t.Errorf("%s %s: rule %+v; expected %s", r.method, r.path, rule, needName(r.need))
		}
	}
}

func TestDefaultPolicyWithClosedProbes(t *testing.T) {
	p, err := NewPolicy(DefaultRules(false))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if rule := p.Need(httptest.NewRequest("GET", path, nil)); rule.Open || rule.Role != Reader {
			t.Errorf("GET %s with closed probes: rule %+v; expected reader", path, rule)
		}
	}
}

func TestNewPolicyRefusesBadRules(t *testing.T) {
	cases := []struct {
		rules []Rule
		want  string
	}{
		{[]Rule{{Pattern: "GET /x"}}, "expected a role"},
		{[]Rule{{Pattern: "GET /x", Role: Role(7)}}, "expected a role"},
		{[]Rule{{Pattern: "GET /x", Role: Reader, Open: true}}, "both set"},
		{[]Rule{{Pattern: "GET /x", Role: Reader}, {Pattern: "GET /x", Role: Admin}}, "listed twice"},
		{[]Rule{{Pattern: "GET x", Role: Reader}}, "policy rule 0"},
		{[]Rule{{Pattern: "GET /{a}/x", Role: Reader}, {Pattern: "GET /x/{b}", Role: Reader}}, "policy rule 1"},
	}
	for _, c := range cases {
		if _, err := NewPolicy(c.rules); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewPolicy(%+v) = %v; expected an error containing %q", c.rules, err, c.want)
		}
	}
}

func needName(r Role) string {
	if r == 0 {
		return "open"
	}
	return r.String()
}
