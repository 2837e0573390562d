package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/tidaldb/tidal/harness/history"
)

// api speaks etcd's v3 API through its gRPC gateway: JSON over HTTP/1.1
// (etcd 3.4 serves /v3/kv/*, /v3/maintenance/*, /v3/cluster/member/* on
// its client port). The harness's main module so stays free of etcd's
// client and its gRPC versions; docs/ARCHITECTURE.md ("etcd") records why.
type api struct {
	base string // http://host:port
	hc   *http.Client
}

func newAPI(addr string, timeout time.Duration) *api {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	return &api{base: "http://" + addr, hc: &http.Client{Transport: tr, Timeout: timeout}}
}

func (a *api) close() { a.hc.CloseIdleConnections() }

// Error is an error etcd answered with: the gRPC status code and message
// the gateway relays.
type Error struct {
	HTTPStatus int
	Code       int    `json:"code"`
	Message    string `json:"message"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("etcd: %s (grpc code %d, http %d)", e.Message, e.Code, e.HTTPStatus)
}

// Answer returns the gateway's HTTP status and the gRPC code's name
// ("Unknown", "Unavailable"), for the history (history.Answered).
// A refusal of the gateway's own (code 0) has no gRPC code.
func (e *Error) Answer() (status int, code string) {
	if e.Code == 0 {
		return e.HTTPStatus, ""
	}
	return e.HTTPStatus, GRPCCodeName(e.Code)
}

// grpcCodeNames are the names of the gRPC status codes (google.golang.org/
// grpc/codes), indexed by code; the gateway relays only the number.
var grpcCodeNames = [...]string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
	"Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"}

// GRPCCodeName names gRPC code c, or "code N" for one gRPC does not define.
func GRPCCodeName(c int) string {
	if c >= 0 && c < len(grpcCodeNames) {
		return grpcCodeNames[c]
	}
	return fmt.Sprintf("code %d", c)
}

// gRPC codes etcd answers with that say the request was refused before
// it was proposed: the operation certainly did not happen.
const (
	codeInvalidArgument   = 3
	codeNotFound          = 5
	codePermissionDenied  = 7
	codeResourceExhausted = 8 // "etcdserver: too many requests", checked before proposing
	codeOutOfRange        = 11
	codeUnauthenticated   = 16
)

// Outcome classifies a write's error: fail only when etcd said, or the
// transport shows, that the request was never applied; every other error
// — a timeout of ours or etcd's ("request timed out", "leader changed"),
// a connection cut after the request went out — is info.
func Outcome(err error) history.Type {
	if err == nil {
		return history.OK
	}
	var ee *Error
	if errors.As(err, &ee) {
		switch ee.Code {
		case codeInvalidArgument, codePermissionDenied, codeResourceExhausted, codeOutOfRange, codeUnauthenticated:
			return history.Fail
		}
		if ee.Code == 0 && ee.HTTPStatus >= 400 && ee.HTTPStatus < 500 {
			return history.Fail // the gateway refused the request itself
		}
		return history.Info
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return history.Fail // never connected: nothing was sent
	}
	return history.Info
}

func (a *api) call(ctx context.Context, path string, req, resp any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	r, err := a.hc.Do(hr)
	if err != nil {
		return err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return fmt.Errorf("POST %s: reading the answer: %w", path, err)
	}
	if r.StatusCode != http.StatusOK {
		e := &Error{HTTPStatus: r.StatusCode}
		if json.Unmarshal(b, e) != nil || e.Message == "" {
			e.Message = fmt.Sprintf("POST %s: %s: %.200s", path, r.Status, b)
		}
		return e
	}
	// A gRPC error may also arrive in a 200 stream-style body.
	var probe struct {
		Error *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &probe) == nil && probe.Error != nil {
		return &Error{HTTPStatus: r.StatusCode, Code: probe.Error.Code, Message: probe.Error.Message}
	}
	if resp == nil {
		return nil
	}
	if err := json.Unmarshal(b, resp); err != nil {
		return fmt.Errorf("POST %s: expected JSON, found %.200s: %w", path, b, err)
	}
	return nil
}

// u64 is a uint64 the gateway writes as a JSON string.
type u64 uint64

func (u *u64) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' {
		s = s[1 : len(s)-1]
	}
	if s == "" || s == "null" {
		*u = 0
		return nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	*u = u64(v)
	return err
}

func (u u64) MarshalJSON() ([]byte, error) { return json.Marshal(strconv.FormatUint(uint64(u), 10)) }

type header struct {
	ClusterID u64 `json:"cluster_id"`
	MemberID  u64 `json:"member_id"`
	Revision  u64 `json:"revision"`
	RaftTerm  u64 `json:"raft_term"`
}

type keyValue struct {
	Key            []byte `json:"key"`
	Value          []byte `json:"value"`
	CreateRevision u64    `json:"create_revision"`
	ModRevision    u64    `json:"mod_revision"`
}

type rangeRequest struct {
	Key          []byte `json:"key"`
	RangeEnd     []byte `json:"range_end,omitempty"`
	Limit        int64  `json:"limit,omitempty"`
	Revision     int64  `json:"revision,omitempty"`
	Serializable bool   `json:"serializable,omitempty"`
	KeysOnly     bool   `json:"keys_only,omitempty"`
}

type rangeResponse struct {
	Header header     `json:"header"`
	KVs    []keyValue `json:"kvs"`
	More   bool       `json:"more"`
	Count  u64        `json:"count"`
}

type putRequest struct {
	Key   []byte `json:"key"`
	Value []byte `json:"value"`
}

type compare struct {
	Key    []byte `json:"key"`
	Result string `json:"result"` // EQUAL
	Target string `json:"target"` // VALUE, VERSION
	Value  []byte `json:"value,omitempty"`
	// Version 0 compares "the key does not exist".
	Version *int64 `json:"version,omitempty"`
}

type requestOp struct {
	RequestPut   *putRequest   `json:"requestPut,omitempty"`
	RequestRange *rangeRequest `json:"requestRange,omitempty"`
}

type txnRequest struct {
	Compare []compare   `json:"compare,omitempty"`
	Success []requestOp `json:"success,omitempty"`
	Failure []requestOp `json:"failure,omitempty"`
}

type txnResponse struct {
	Header    header `json:"header"`
	Succeeded bool   `json:"succeeded"`
}

type statusResponse struct {
	Header           header   `json:"header"`
	Version          string   `json:"version"`
	Leader           u64      `json:"leader"`
	RaftIndex        u64      `json:"raftIndex"`
	RaftTerm         u64      `json:"raftTerm"`
	RaftAppliedIndex u64      `json:"raftAppliedIndex"`
	Errors           []string `json:"errors"`
	IsLearner        bool     `json:"isLearner"`
}

type member struct {
	ID         u64      `json:"ID"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	IsLearner  bool     `json:"isLearner"`
}

type memberListResponse struct {
	Header  header   `json:"header"`
	Members []member `json:"members"`
}

type memberAddResponse struct {
	Header  header   `json:"header"`
	Member  member   `json:"member"`
	Members []member `json:"members"`
}

func (a *api) rangeKeys(ctx context.Context, req rangeRequest) (*rangeResponse, error) {
	var resp rangeResponse
	return &resp, a.call(ctx, "/v3/kv/range", req, &resp)
}

func (a *api) put(ctx context.Context, key, value []byte) (*header, error) {
	var resp struct {
		Header header `json:"header"`
	}
	return &resp.Header, a.call(ctx, "/v3/kv/put", putRequest{Key: key, Value: value}, &resp)
}

func (a *api) txn(ctx context.Context, req txnRequest) (*txnResponse, error) {
	var resp txnResponse
	return &resp, a.call(ctx, "/v3/kv/txn", req, &resp)
}

func (a *api) status(ctx context.Context) (*statusResponse, error) {
	var resp statusResponse
	return &resp, a.call(ctx, "/v3/maintenance/status", struct{}{}, &resp)
}

func (a *api) members(ctx context.Context) (*memberListResponse, error) {
	var resp memberListResponse
	return &resp, a.call(ctx, "/v3/cluster/member/list", struct{}{}, &resp)
}

func (a *api) addMember(ctx context.Context, peerURL string) (*memberAddResponse, error) {
	var resp memberAddResponse
	return &resp, a.call(ctx, "/v3/cluster/member/add", map[string]any{"peerURLs": []string{peerURL}}, &resp)
}

func (a *api) removeMember(ctx context.Context, id uint64) error {
	return a.call(ctx, "/v3/cluster/member/remove", map[string]any{"ID": u64(id)}, nil)
}

func (a *api) moveLeader(ctx context.Context, to uint64) error {
	return a.call(ctx, "/v3/maintenance/transfer-leadership", map[string]any{"targetID": u64(to)}, nil)
}

// prefixEnd is the range end covering every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return []byte{0}
}
