package faultfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// The control API lets another process drive a mount (tidal-chaos faultfs
// ...). JSON over HTTP, on TCP or a unix socket:
//
//	GET    /             {"backing", "mountpoint"}
//	GET    /stats        Stats
//	GET    /faults       Faults armed now
//	POST   /faults       Faults: arm the kinds present; replies with Faults
//	DELETE /faults       ?kind=fsync-error&kind=...: clear those, all if none
//	POST   /power-cut    PowerCutOptions (or no body): PowerCutReport
//	POST   /sync         make everything durable (what syncfs would do)
//
// Errors are {"error":{"code","message","field"}}, as the relay's control
// API: 400 bad_request, 405, 500 internal.

// Info describes a mount.
type Info struct {
	Backing    string `json:"backing"`
	Mountpoint string `json:"mountpoint"`
}

// Error is the control API's error body; the client returns it as an error.
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%d %s: %s (field %s)", e.Status, e.Code, e.Message, e.Field)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

// slowDiskJSON is SlowDisk on the wire: latency in milliseconds, as the
// relay's faults spell it.
type slowDiskJSON struct {
	Ops        []Op    `json:"ops,omitempty"`
	LatencyMS  float64 `json:"latency_ms,omitempty"`
	Stall      bool    `json:"stall,omitempty"`
	MaxStallMS float64 `json:"max_stall_ms,omitempty"`
}

// MarshalJSON writes the latency as latency_ms.
func (s SlowDisk) MarshalJSON() ([]byte, error) {
	return json.Marshal(slowDiskJSON{Ops: s.Ops, LatencyMS: float64(s.Latency) / float64(time.Millisecond), Stall: s.Stall,
		MaxStallMS: float64(s.MaxStall) / float64(time.Millisecond)})
}

// UnmarshalJSON reads latency_ms.
func (s *SlowDisk) UnmarshalJSON(b []byte) error {
	var j slowDiskJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = SlowDisk{Ops: j.Ops, Latency: time.Duration(j.LatencyMS * float64(time.Millisecond)), Stall: j.Stall,
		MaxStall: time.Duration(j.MaxStallMS * float64(time.Millisecond))}
	return nil
}

// Handler serves the control API for f.
func (f *FS) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, Info{Backing: f.Backing(), Mountpoint: f.Mountpoint()})
	})
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, f.Stats())
	})
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, f.Faults())
	})
	mux.HandleFunc("POST /faults", func(w http.ResponseWriter, r *http.Request) {
		var faults Faults
		if err := decode(r, &faults, false); err != nil {
			fail(w, err)
			return
		}
		if err := f.Set(faults); err != nil {
			var fe *FieldError
			if errors.As(err, &fe) {
				err = badRequest(fe.Field, "%s", fe.Msg)
			}
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, f.Faults())
	})
	mux.HandleFunc("DELETE /faults", func(w http.ResponseWriter, r *http.Request) {
		var kinds []Kind
		for _, k := range r.URL.Query()["kind"] {
			kind, err := ParseKind(k)
			if err != nil {
				fail(w, badRequest("kind", "%v", err))
				return
			}
			kinds = append(kinds, kind)
		}
		f.Clear(kinds...)
		reply(w, http.StatusOK, f.Faults())
	})
	mux.HandleFunc("POST /power-cut", func(w http.ResponseWriter, r *http.Request) {
		var o PowerCutOptions
		if err := decode(r, &o, true); err != nil {
			fail(w, err)
			return
		}
		rep, err := f.PowerCut(o)
		if err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, rep)
	})
	mux.HandleFunc("POST /sync", func(w http.ResponseWriter, r *http.Request) {
		if err := f.Sync(); err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, struct{}{})
	})
	return mux
}

func decode(r *http.Request, v any, emptyOK bool) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return badRequest("", "read body: %v", err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		if emptyOK {
			return nil
		}
		return badRequest("", "expected a JSON body")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("", "decode body: %v", err)
	}
	return nil
}

func badRequest(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: "bad_request", Field: field, Message: fmt.Sprintf(format, args...)}
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
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Status: http.StatusInternalServerError, Code: "internal", Message: err.Error()}
	}
	reply(w, e.Status, map[string]*Error{"error": e})
}

// Listen listens on a control address: "host:port" for TCP, or
// "unix:/path/to.sock" for a unix socket (a stale socket file is removed).
func Listen(addr string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("faultfs: control socket %s: %w", p, err)
		}
		return net.Listen("unix", p)
	}
	return net.Listen("tcp", addr)
}

// Client drives a mount through its control API. API errors come back as
// *Error.
type Client struct {
	base string
	hc   *http.Client
}

// NewClient returns a client for the control address addr: "host:port",
// "http://host:port" or "unix:/path/to.sock".
func NewClient(addr string) *Client {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", p)
		}}
		return &Client{base: "http://faultfs", hc: &http.Client{Transport: tr}}
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return &Client{base: strings.TrimRight(addr, "/"), hc: http.DefaultClient}
}

// Info describes the mount.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var i Info
	return i, c.do(ctx, http.MethodGet, "/", nil, &i)
}

// Stats returns the mount's counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	return s, c.do(ctx, http.MethodGet, "/stats", nil, &s)
}

// Faults returns the armed faults.
func (c *Client) Faults(ctx context.Context) (Faults, error) {
	var f Faults
	return f, c.do(ctx, http.MethodGet, "/faults", nil, &f)
}

// Set arms the kinds of fault present in f and returns the armed faults.
func (c *Client) Set(ctx context.Context, f Faults) (Faults, error) {
	var out Faults
	return out, c.do(ctx, http.MethodPost, "/faults", f, &out)
}

// Clear disarms kinds of fault (all when none are given) and returns the
// armed faults.
func (c *Client) Clear(ctx context.Context, kinds ...Kind) (Faults, error) {
	q := url.Values{}
	for _, k := range kinds {
		q.Add("kind", string(k))
	}
	path := "/faults"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out Faults
	return out, c.do(ctx, http.MethodDelete, path, nil, &out)
}

// PowerCut cuts power (see FS.PowerCut).
func (c *Client) PowerCut(ctx context.Context, o PowerCutOptions) (PowerCutReport, error) {
	var rep PowerCutReport
	return rep, c.do(ctx, http.MethodPost, "/power-cut", o, &rep)
}

// Sync makes everything durable (see FS.Sync).
func (c *Client) Sync(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/sync", nil, nil)
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
		return fmt.Errorf("faultfs control: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("faultfs control: %s %s: read reply: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		var eb struct{ Error *Error }
		if json.Unmarshal(data, &eb) != nil || eb.Error == nil {
			return &Error{Status: resp.StatusCode, Code: "unexpected", Message: fmt.Sprintf("%s %s: %s", method, path, bytes.TrimSpace(data))}
		}
		eb.Error.Status = resp.StatusCode
		return eb.Error
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("faultfs control: %s %s: decode reply: %w", method, path, err)
	}
	return nil
}
