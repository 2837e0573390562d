package client

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Error codes the server puts in {"error":{"code":...}}.
const (
	CodeInvalidArgument      = "invalid_argument"
	CodeConflict             = "conflict"
	CodeTooLarge             = "too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeUnavailable          = "unavailable"
	CodeTimeout              = "timeout"
	CodeNotFound             = "not_found"
	CodeInternal             = "internal"
	// CodeUnauthenticated (401): no credentials, or ones the node does not
	// accept. CodePermissionDenied (403): the credentials' role is below
	// what the route needs.
	CodeUnauthenticated  = "unauthenticated"
	CodePermissionDenied = "permission_denied"
	// CodeTLSRequired is the client's own: a plain HTTP request reached a
	// node that serves HTTPS (net/http answers 400 without our JSON).
	CodeTLSRequired = "tls_required"
)

// APIError is a non-2xx answer from the server.
type APIError struct {
	Op      string // "POST /v1/signals"
	Status  int
	Code    string
	Message string
	Field   string // the offending request field, e.g. "events[3].weight"; may be empty
	// RetryAfter is the server's Retry-After (503), zero if it sent none.
	RetryAfter time.Duration
	// route is the *shard.NotLeader or *shard.EpochMismatch a 421
	// carried; nil otherwise.
	route error
}

// Route returns the routing answer of a 421 (Misdirected Request): a
// *shard.NotLeader or a *shard.EpochMismatch, nil for any other error.
func (e *APIError) Route() error { return e.route }

func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString("tidal: ")
	if e.Op != "" {
		b.WriteString(e.Op + ": ")
	}
	fmt.Fprintf(&b, "%d %s", e.Status, e.Code)
	if e.Field != "" {
		b.WriteString(": " + e.Field)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.RetryAfter > 0 {
		fmt.Fprintf(&b, " (retry after %s)", e.RetryAfter)
	}
	return b.String()
}

// Answer returns the HTTP status and the error code the server answered:
// what a recorder of outcomes (the chaos harness's history) keeps of it
// apart from the message.
func (e *APIError) Answer() (status int, code string) { return e.Status, e.Code }

// RequestError is what every failed call returns: the last attempt's error
// (an *APIError or a transport error) plus what the retries tell a caller
// who must decide whether the write happened.
type RequestError struct {
	Op       string
	Attempts int
	// Indefinite is true when some attempt may have reached the state
	// machine: a 504, a 5xx other than 503, a timeout or a connection lost
	// after the request was sent. A definite failure (every attempt was a
	// 4xx, a 503 — which the server answers before proposing — or a refused
	// connection) certainly changed nothing. Retries never turn an
	// indefinite outcome into a definite one: a 503 after a 504 is still
	// indefinite, because the first attempt may have landed.
	Indefinite bool
	Err        error
}

func (e *RequestError) Error() string {
	var b strings.Builder
	b.WriteString(e.Err.Error())
	if e.Attempts > 1 {
		fmt.Fprintf(&b, " (after %d attempts", e.Attempts)
		if e.Indefinite {
			b.WriteString("; outcome unknown")
		}
		b.WriteString(")")
	} else if e.Indefinite {
		b.WriteString(" (outcome unknown)")
	}
	if _, ok := e.Err.(*APIError); !ok {
		return "tidal: " + e.Op + ": " + b.String()
	}
	return b.String()
}

func (e *RequestError) Unwrap() error { return e.Err }

// errAttemptTimeout is the cause of an attempt cancelled by the per-attempt
// timeout rather than by the caller's context.
var errAttemptTimeout = errors.New("attempt timed out")

func apiError(err error) *APIError {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}

func hasStatus(err error, status int, code string) bool {
	ae := apiError(err)
	return ae != nil && (ae.Status == status || ae.Code == code)
}

// IsConflict reports whether err is a 409: an event id reused with a
// different payload.
func IsConflict(err error) bool { return hasStatus(err, http.StatusConflict, CodeConflict) }

// IsUnavailable reports whether err is a 503: no leader, not ready, or the
// proposal queue is full.
func IsUnavailable(err error) bool {
	return hasStatus(err, http.StatusServiceUnavailable, CodeUnavailable)
}

// IsTimeout reports whether the outcome is unknown because something timed
// out: a 504 from the server or the client's per-attempt timeout.
func IsTimeout(err error) bool {
	return hasStatus(err, http.StatusGatewayTimeout, CodeTimeout) || errors.Is(err, errAttemptTimeout)
}

// IsInvalid reports whether err is a 400: the request was malformed or
// failed validation (APIError.Field names what).
func IsInvalid(err error) bool { return hasStatus(err, http.StatusBadRequest, CodeInvalidArgument) }

// IsUnauthenticated reports whether err is a 401: credentials missing or
// not accepted.
func IsUnauthenticated(err error) bool {
	return hasStatus(err, http.StatusUnauthorized, CodeUnauthenticated)
}

// IsPermissionDenied reports whether err is a 403: the credentials' role
// does not allow the route.
func IsPermissionDenied(err error) bool {
	return hasStatus(err, http.StatusForbidden, CodePermissionDenied)
}

// IsNotFound reports whether err is a 404.
func IsNotFound(err error) bool { return hasStatus(err, http.StatusNotFound, CodeNotFound) }

// IsIndefinite reports whether a failed write may nevertheless have been
// applied (see RequestError.Indefinite; for a batch split over groups,
// WriteError.Indefinite). A nil error is not indefinite.
func IsIndefinite(err error) bool {
	var we *WriteError
	if errors.As(err, &we) {
		return we.Indefinite
	}
	var re *RequestError
	if errors.As(err, &re) {
		return re.Indefinite
	}
	return err != nil
}
