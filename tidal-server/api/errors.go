package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// Error codes of the JSON error body. They are part of the API: clients
// branch on them, so they never change meaning.
const (
	CodeInvalid     = "invalid_argument"
	CodeConflict    = "conflict"
	CodeTooLarge    = "too_large"
	CodeMediaType   = "unsupported_media_type"
	CodeUnavailable = "unavailable"
	CodeMemory      = "memory_limit" // 503: an embedding write past --max-memory
	CodeTimeout     = "timeout"
	CodeBodyTimeout = "request_timeout" // 408: the body came too slowly
	CodeNotFound    = "not_found"
	CodeMethod      = "method_not_allowed"
	CodeInternal    = "internal"
)

// Error is an API error: an HTTP status, a stable code, a message for
// people and, for bad input, the field at fault ("events[3].weight").
type Error struct {
	Status     int
	Code       string
	Message    string
	Field      string
	RetryAfter int // seconds; 0 = no header
}

func (e *Error) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

func invalid(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Field: field, Message: fmt.Sprintf(format, args...)}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"` // always present: "" when no single field is at fault
	} `json:"error"`
}

// toAPIError maps any error a handler meets to the status DESIGN.md fixes.
func toAPIError(err error) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	var ee *ledger.EventError
	if errors.As(err, &ee) {
		return invalid(fmt.Sprintf("events[%d].%s", ee.Index, ee.Err.Field), "%s", ee.Err.Message)
	}
	var ce *ledger.ConflictError
	if errors.As(err, &ce) {
		return &Error{Status: http.StatusConflict, Code: CodeConflict, Field: fmt.Sprintf("events[%d].id", ce.Index), Message: strings.TrimPrefix(ce.Error(), fmt.Sprintf("events[%d].id: ", ce.Index))}
	}
	var fe *vectors.FieldError
	if errors.As(err, &fe) {
		return invalid(fe.Field, "%s", fe.Message)
	}
	var lfe *ledger.FieldError
	if errors.As(err, &lfe) {
		return invalid(lfe.Field, "%s", lfe.Message)
	}
	var me *replica.MembershipError
	if errors.As(err, &me) {
		if me.NotFound {
			return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: me.Msg}
		}
		return &Error{Status: http.StatusConflict, Code: CodeConflict, Message: me.Msg}
	}
	// Conflicts from other packages (embedding write ids) name their field.
	var conflict interface{ Conflict() string }
	if errors.As(err, &conflict) {
		return &Error{Status: http.StatusConflict, Code: CodeConflict, Field: conflict.Conflict(), Message: err.Error()}
	}
	var ew *errExpectedWait
	if errors.As(err, &ew) {
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error(), RetryAfter: ew.retryAfter()}
	}
	var em *errMemory
	if errors.As(err, &em) {
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeMemory, Message: err.Error(), RetryAfter: memoryRetryAfter}
	}
	var eb *errBytesInFlight
	var ec *errClock
	if errors.As(err, &eb) || errors.As(err, &ec) {
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error(), RetryAfter: 1}
	}
	var te *replica.TransferError
	if errors.As(err, &te) {
		// raft drops every proposal while its leader hands leadership
		// off, and abandons the transfer after an election timeout:
		// certainly not applied, retry after that.
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error(), RetryAfter: retryAfterSeconds(te.RetryAfter)}
	}
	switch {
	case errors.Is(err, replica.ErrTransferAbandoned):
		// The target did not take over and was silent. Not a 503: a
		// client retrying it would have the leader refuse every write
		// and membership change for another election timeout.
		return &Error{Status: http.StatusConflict, Code: CodeConflict, Message: err.Error()}
	case errors.Is(err, ErrQueueFull), errors.Is(err, replica.ErrOverloaded):
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error(), RetryAfter: 1}
	case errors.Is(err, replica.ErrNoLeader), errors.Is(err, replica.ErrNoQuorum):
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error(), RetryAfter: 1}
	case errors.Is(err, replica.ErrConfChangeDropped):
		// Another membership change was still being applied: this one was
		// certainly not made, and will be taken once that one is applied.
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error(), RetryAfter: 1}
	case errors.Is(err, replica.ErrUnknownOutcome):
		return &Error{Status: http.StatusGatewayTimeout, Code: CodeTimeout, Message: err.Error() + "; retry with the same ids"}
	case errors.Is(err, replica.ErrStopped), errors.Is(err, replica.ErrFenced), errors.Is(err, replica.ErrRemoved):
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error()}
	case errors.Is(err, errDeadline):
		return &Error{Status: http.StatusGatewayTimeout, Code: CodeTimeout, Message: err.Error()}
	case errors.Is(err, context.DeadlineExceeded):
		// A write whose deadline passed inside the backend may still
		// commit: the outcome is unknown, exactly as ErrUnknownOutcome.
		return &Error{Status: http.StatusGatewayTimeout, Code: CodeTimeout, Message: err.Error() + "; the outcome is unknown, retry with the same ids"}
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads this answer, and it is not
		// a server fault worth a 500 in the logs and metrics.
		return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: err.Error()}
	}
	return &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Message: err.Error()}
}

// retryAfterSeconds is d as a Retry-After value: whole seconds, rounded
// up, at least 1.
func retryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

var errDeadline = errors.New("deadline passed before the read could be served")

func writeError(w http.ResponseWriter, err error) *Error {
	ae := toAPIError(err)
	var body errorBody
	body.Error.Code = ae.Code
	body.Error.Message = ae.Message
	body.Error.Field = ae.Field
	if ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ae.RetryAfter))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(ae.Status)
	json.NewEncoder(w).Encode(body)
	return ae
}
