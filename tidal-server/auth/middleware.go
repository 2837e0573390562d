package auth

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Error codes of the JSON error body for authentication failures. They
// extend the API's codes (tidal-server/api/errors.go) and keep its shape,
// {"error":{"code","message","field"}}; the shape is mirrored here rather
// than imported so that auth does not depend on the API and its backends.
const (
	CodeUnauthenticated  = "unauthenticated"
	CodePermissionDenied = "permission_denied"
)

// Via says how a principal authenticated.
type Via string

const (
	ViaCert  Via = "cert"
	ViaToken Via = "token"
)

// Principal is an authenticated client.
type Principal struct {
	Name string
	Role Role
	Via  Via
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalFrom returns the principal Handler put in a request's context;
// false for an open route (no authentication asked) or outside Handler.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Options configure Handler.
type Options struct {
	// Policy says which role each route needs. Required.
	Policy *Policy
	// Tokens are the bearer tokens accepted; nil accepts none.
	Tokens *Tokens
	// Realm is the realm of WWW-Authenticate; default "tidal".
	Realm string
}

// Handler authenticates and authorizes every request before next sees it.
//
// Authentication, in order (as etcd does, a token wins over a
// certificate; a bad token is refused, never passed over for the cert):
//  1. Authorization: Bearer SECRET, looked up in Options.Tokens;
//  2. the client certificate the TLS handshake verified against the
//     cluster CA (its tidal://client/NAME?role=ROLE identity).
//
// An open route is served without looking at credentials. Otherwise no
// credentials, or credentials that name no client, get 401 with
// WWW-Authenticate: Bearer; a role below the route's gets 403. The
// principal is in the request's context for next (PrincipalFrom).
//
// Handler is meant for a TLS listener: over plain HTTP a bearer token
// crosses the network in clear.
func Handler(next http.Handler, opts Options) http.Handler {
	if opts.Policy == nil {
		panic("auth.Handler: Options.Policy is required")
	}
	if opts.Realm == "" {
		opts.Realm = "tidal"
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rule := opts.Policy.Need(r)
		if rule.Open {
			next.ServeHTTP(w, r)
			return
		}
		p, err := authenticate(r, opts.Tokens)
		if err != nil {
			challenge := fmt.Sprintf("Bearer realm=%q", opts.Realm)
			if err.invalid {
				challenge += `, error="invalid_token"`
			}
			w.Header().Set("WWW-Authenticate", challenge)
			writeError(w, http.StatusUnauthorized, CodeUnauthenticated, err.msg)
			return
		}
		if !p.Role.Allows(rule.Role) {
			writeError(w, http.StatusForbidden, CodePermissionDenied,
				fmt.Sprintf("%s %s needs role %s; %s %q has role %s", r.Method, r.URL.Path, rule.Role, p.Via, p.Name, p.Role))
			return
		}
		next.ServeHTTP(w, r.WithContext(WithPrincipal(r.Context(), p)))
	})
}

type authError struct {
	msg     string
	invalid bool // credentials were given but are not valid
}

func authenticate(r *http.Request, tokens *Tokens) (Principal, *authError) {
	h, given := r.Header["Authorization"]
	return authenticateCredentials(h, given, r.TLS, tokens)
}

// Authenticate applies Handler's rules to credentials that came another
// way than an HTTP request: the gRPC ingest stream's "authorization"
// metadata (its values, authorization) and its connection's TLS state (nil
// without TLS). It returns the principal, or why none: the error's text
// is the same as the HTTP 401's, and AuthError.Invalid says credentials
// were given but are not valid.
func Authenticate(authorization []string, cs *tls.ConnectionState, tokens *Tokens) (Principal, error) {
	p, err := authenticateCredentials(authorization, len(authorization) > 0, cs, tokens)
	if err != nil {
		return p, &AuthError{Msg: err.msg, Invalid: err.invalid}
	}
	return p, nil
}

// AuthError is Authenticate's refusal.
type AuthError struct {
	Msg     string
	Invalid bool // credentials were given but are not valid
}

func (e *AuthError) Error() string { return e.Msg }

func authenticateCredentials(h []string, given bool, cs *tls.ConnectionState, tokens *Tokens) (Principal, *authError) {
	if given {
		if len(h) != 1 {
			return Principal{}, &authError{msg: fmt.Sprintf("expected one Authorization header, found %d", len(h)), invalid: true}
		}
		scheme, secret, _ := strings.Cut(strings.TrimSpace(h[0]), " ")
		if !strings.EqualFold(scheme, "Bearer") {
			return Principal{}, &authError{msg: fmt.Sprintf("Authorization: expected scheme Bearer, found %q", clip(scheme)), invalid: true}
		}
		secret = strings.TrimSpace(secret)
		if secret == "" {
			return Principal{}, &authError{msg: "Authorization: Bearer without a token", invalid: true}
		}
		if tokens == nil {
			return Principal{}, &authError{msg: "bearer tokens are not accepted by this node (no --tokens file); use a client certificate", invalid: true}
		}
		tok, ok := tokens.Lookup(secret)
		if !ok {
			return Principal{}, &authError{msg: "bearer token not recognised", invalid: true}
		}
		return Principal{Name: tok.Name, Role: tok.Role, Via: ViaToken}, nil
	}
	if cs != nil && len(cs.VerifiedChains) > 0 && len(cs.VerifiedChains[0]) > 0 {
		name, role, err := ClientFromCert(cs.VerifiedChains[0][0])
		if err != nil {
			return Principal{}, &authError{msg: "client certificate refused: " + err.Error()}
		}
		return Principal{Name: name, Role: role, Via: ViaCert}, nil
	}
	return Principal{}, &authError{msg: "credentials required: a client certificate signed by the cluster CA, or Authorization: Bearer TOKEN"}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"`
	} `json:"error"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	var body errorBody
	body.Error.Code = code
	body.Error.Message = msg
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}
