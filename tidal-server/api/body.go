package api

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"time"
)

// Request bodies are read under three bounds, so that no client can hold a
// node's memory or a handler for long:
//
//   - size: a body over MaxBodyBytes is 413; a declared Content-Length
//     over it is refused before a byte is read;
//   - bytes in flight: the body is charged to the node's byte budget
//     before it is read (see admission.go); 503 when it does not fit;
//   - time: the whole body must arrive within BodyReadTimeout, and after
//     BodyRateGrace it must keep an average of at least MinBodyRate bytes
//     a second since the handler began reading it. Either cut answers 408
//     and closes the connection. Both are enforced with the connection's
//     read deadline (http.ResponseController), so a client that sends
//     nothing at all is cut as surely as one that sends slowly.
//
// The deadline ends with the body: a write waiting for commit must not be
// cut by it. On HTTP/1.1 net/http clears the connection's read deadline
// itself when the body reaches EOF (before its background read, whose
// failure would cancel the request's context); finish clears it for
// HTTP/2 streams and for bodies that end without EOF being seen.

// unreadDrainTime bounds how long net/http may spend discarding a small
// body the handler refused without reading (it does so to keep the
// connection); a larger one closes the connection instead.
const unreadDrainTime = time.Second

// errBodyTooSlow is a body cut by its deadline or its minimum rate.
type errBodyTooSlow struct {
	rate     bool // cut by the minimum rate; otherwise by the deadline
	got      int64
	declared int64 // Content-Length, -1 when not declared
	elapsed  time.Duration
	opts     *Options
}

func (e *errBodyTooSlow) Error() string {
	of := ""
	if e.declared >= 0 {
		of = fmt.Sprintf(" of %d", e.declared)
	}
	if e.rate {
		return fmt.Sprintf("request body too slow: %d%s bytes in %v, below the minimum of %d bytes/s after %v (--min-body-rate)",
			e.got, of, e.elapsed.Round(time.Millisecond), e.opts.MinBodyRate, e.opts.BodyRateGrace)
	}
	return fmt.Sprintf("request body not complete within %v (--http-read-timeout): %d%s bytes arrived",
		e.opts.BodyReadTimeout, e.got, of)
}

// bodyReader enforces the time bounds on one body.
type bodyReader struct {
	body     io.Reader
	rc       *http.ResponseController
	opts     *Options
	start    time.Time
	n        int64
	declared int64

	deadlines bool      // the connection takes read deadlines
	set       time.Time // the deadline last set; zero = none
	// unsupported is told once that the connection took no deadline.
	unsupported func(error)
}

// deadline is when the body must next make progress, and whether the
// minimum rate (rather than the overall deadline) sets it: with n bytes
// read, the rate is kept until start + grace + n/rate.
func (b *bodyReader) deadline() (time.Time, bool) {
	d := b.start.Add(b.opts.BodyReadTimeout)
	if b.opts.MinBodyRate > 0 {
		credit := time.Duration(float64(b.n) / float64(b.opts.MinBodyRate) * float64(time.Second))
		if r := b.start.Add(b.opts.BodyRateGrace + credit); r.Before(d) {
			return r, true
		}
	}
	return d, false
}

func (b *bodyReader) tooSlow(byRate bool) error {
	return &errBodyTooSlow{rate: byRate, got: b.n, declared: b.declared, elapsed: time.Since(b.start), opts: b.opts}
}

func (b *bodyReader) Read(p []byte) (int, error) {
	d, byRate := b.deadline()
	if !time.Now().Before(d) {
		return 0, b.tooSlow(byRate)
	}
	if b.deadlines && !d.Equal(b.set) {
		if err := b.rc.SetReadDeadline(d); err != nil {
			// Not a connection (httptest's recorder, or a wrapper without
			// Unwrap): the bounds are checked between reads only, and a
			// body that stalls is not cut.
			b.deadlines = false
			if b.unsupported != nil {
				b.unsupported(err)
			}
		} else {
			b.set = d
		}
	}
	n, err := b.body.Read(p)
	b.n += int64(n)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		_, byRate := b.deadline()
		return n, b.tooSlow(byRate)
	}
	return n, err
}

// finish clears the read deadline the body set.
func (b *bodyReader) finish() {
	if b.deadlines && !b.set.IsZero() {
		b.rc.SetReadDeadline(time.Time{})
	}
}

// warnNoDeadlines logs, once per handler, that request bodies cannot be
// given read deadlines: stalled bodies are then bounded only by the
// server's own timeouts.
func (h *handler) warnNoDeadlines(err error) {
	h.noDeadlines.Do(func() {
		h.opts.Logger.Warn("request bodies get no read deadline: the response writer does not support it; a stalled body is cut only by the server's own timeouts", "err", err)
	})
}

// refuseUnread prepares a refusal answered before the body was read: a
// small body is left for net/http to discard (keeping the connection) but
// only for unreadDrainTime; a large or undeclared one closes the
// connection rather than be read for nothing.
func refuseUnread(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength == 0 {
		return
	}
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(unreadDrainTime))
	if r.ProtoMajor == 1 && (r.ContentLength < 0 || r.ContentLength > 256<<10) {
		w.Header().Set("Connection", "close")
	}
}

// readJSONBody checks the content type, then reads the body under the
// bounds above. The caller must call release once the request is
// answered: the body's bytes stay charged to the budget until then.
func (h *handler) readJSONBody(w http.ResponseWriter, r *http.Request) (body []byte, release func(), err error) {
	body, _, release, err = h.readBodyOf(w, r, false)
	return body, release, err
}

// Media types of request bodies. A vector may also come as raw
// little-endian float32s: decoding 1,536 JSON
// numbers was 29% of a node's CPU on embedding writes.
const (
	mediaJSON   = "application/json"
	mediaBinary = "application/octet-stream"
)

// readBodyOf is readJSONBody that, when binary is set, also accepts an
// application/octet-stream body; it returns the body's media type.
func (h *handler) readBodyOf(w http.ResponseWriter, r *http.Request, binary bool) (body []byte, mt string, release func(), err error) {
	ct := r.Header.Get("Content-Type")
	mt, _, perr := mime.ParseMediaType(ct)
	if ct == "" || perr != nil || (mt != mediaJSON && (!binary || mt != mediaBinary)) {
		refuseUnread(w, r)
		expected := mediaJSON
		if binary {
			expected = mediaJSON + " or " + mediaBinary
		}
		return nil, "", nil, &Error{Status: http.StatusUnsupportedMediaType, Code: CodeMediaType, Field: "Content-Type",
			Message: fmt.Sprintf("expected %s, found %q", expected, ct)}
	}
	body, release, err = h.readBody(w, r)
	return body, mt, release, err
}

// readBody reads the body (content type already checked) under the bounds
// above.
func (h *handler) readBody(w http.ResponseWriter, r *http.Request) (body []byte, release func(), err error) {
	limit := h.opts.MaxBodyBytes
	tooLarge := func() error {
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, Field: "body",
			Message: fmt.Sprintf("request body exceeds %d bytes (--max-body-bytes)", limit)}
	}
	if r.ContentLength > limit {
		refuseUnread(w, r)
		return nil, nil, tooLarge()
	}
	var charged int64
	charge := func(n int64) error {
		if !h.bytes.tryAcquire(n) {
			return &errBytesInFlight{want: n, used: h.bytes.used.Load(), limit: h.bytes.limit}
		}
		charged += n
		h.metrics.inflightBytes.Add(float64(n))
		return nil
	}
	release = func() {
		h.bytes.release(charged)
		h.metrics.inflightBytes.Sub(float64(charged))
	}
	br := &bodyReader{body: r.Body, rc: http.NewResponseController(w), opts: &h.opts, start: time.Now(),
		declared: r.ContentLength, deadlines: true, unsupported: h.warnNoDeadlines}
	// A body that failed is not read further: on HTTP/1.1 the connection
	// closes after the answer (net/http would otherwise try to discard
	// the rest), on HTTP/2 the stream ends. Its deadline stays set.
	fail := func(err error) ([]byte, func(), error) {
		release()
		if r.ProtoMajor == 1 {
			w.Header().Set("Connection", "close")
		}
		var slow *errBodyTooSlow
		if errors.As(err, &slow) {
			reason := "deadline"
			if slow.rate {
				reason = "rate"
			}
			h.metrics.bodyCut.WithLabelValues(reason).Inc()
			return nil, nil, &Error{Status: http.StatusRequestTimeout, Code: CodeBodyTimeout, Field: "body", Message: slow.Error()}
		}
		var ae *Error
		var eb *errBytesInFlight
		if errors.As(err, &ae) || errors.As(err, &eb) {
			return nil, nil, err
		}
		return nil, nil, invalid("body", "reading request body: %v", err)
	}

	if r.ContentLength >= 0 {
		// Declared: charge it all before reading a byte, read exactly
		// that much (net/http holds the body to its Content-Length).
		if err := charge(r.ContentLength); err != nil {
			release()
			refuseUnread(w, r)
			return nil, nil, err
		}
		body = make([]byte, r.ContentLength)
		if _, err := io.ReadFull(br, body); err != nil {
			return fail(err)
		}
		br.finish()
		return body, release, nil
	}
	// Undeclared (chunked): grow the buffer by doubling up to the limit,
	// charging each growth before allocating it; at the limit, one more
	// byte (read aside, uncharged) proves 413.
	body = make([]byte, 0)
	for {
		if len(body) == cap(body) {
			if int64(len(body)) == limit {
				var one [1]byte
				n, err := br.Read(one[:])
				switch {
				case n > 0:
					return fail(tooLarge())
				case err == io.EOF:
					br.finish()
					return body, release, nil
				case err != nil:
					return fail(err)
				}
				continue
			}
			grow := min(max(int64(cap(body)), 32<<10), limit-int64(cap(body)))
			if err := charge(grow); err != nil {
				return fail(err)
			}
			next := make([]byte, len(body), int64(cap(body))+grow)
			copy(next, body)
			body = next
		}
		n, err := br.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if err == io.EOF {
			br.finish()
			return body, release, nil
		}
		if err != nil {
			return fail(err)
		}
	}
}
