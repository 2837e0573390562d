package e2e

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Conn speaks HTTP/2 frame by frame over one TLS connection (ALPN h2),
// so a spec sees exactly what a node put on the wire: which frames a
// response had and their flags. net/http's client would hide the bug
// class this is for: a 204 with a body (HTTP/2 forbids it; clients reset
// the stream), which HTTP/1.1 tolerates.
type h2Conn struct {
	conn      *tls.Conn
	fr        *http2.Framer
	hbuf      bytes.Buffer
	enc       *hpack.Encoder
	authority string
	next      uint32
}

// h2Response is one response as frames.
type h2Response struct {
	Status string
	Header http.Header
	// HeadersEndStream: the HEADERS frame ended the stream (a response
	// without a body, as every 204 must be).
	HeadersEndStream bool
	DataFrames       int
	Body             []byte
	// Ended: END_STREAM was seen (on HEADERS, DATA or trailers).
	Ended bool
	// Reset is the RST_STREAM code if the stream was reset; GoAway if the
	// connection was.
	Reset  *http2.ErrCode
	GoAway *http2.GoAwayFrame
	// Frames lists the stream's frames, for failure messages.
	Frames []string
}

func (r h2Response) String() string {
	return fmt.Sprintf("status %s, frames [%s], body %q", r.Status, strings.Join(r.Frames, " "), r.Body)
}

// dialH2 connects to addr with cfg offering only h2, and exchanges the
// connection preface and SETTINGS.
func dialH2(addr string, cfg *tls.Config) (*h2Conn, error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	d := &net.Dialer{Timeout: 10 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("TLS dial %s: %w", addr, err)
	}
	if p := conn.ConnectionState().NegotiatedProtocol; p != "h2" {
		conn.Close()
		return nil, fmt.Errorf("%s: expected ALPN to negotiate h2, found %q", addr, p)
	}
	c := &h2Conn{conn: conn, fr: http2.NewFramer(conn, conn), authority: addr, next: 1}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	conn.SetDeadline(time.Now().Add(time.Minute))
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		conn.Close()
		return nil, err
	}
	if err := c.fr.WriteSettings(); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

func (c *h2Conn) Close() error { return c.conn.Close() }

// do sends one request on a new stream and reads frames until that stream
// ends (END_STREAM or RST_STREAM) or the connection goes away.
func (c *h2Conn) do(method, path string, header map[string]string, body []byte) (h2Response, error) {
	id := c.next
	c.next += 2
	c.hbuf.Reset()
	fields := []hpack.HeaderField{
		{Name: ":method", Value: method}, {Name: ":scheme", Value: "https"},
		{Name: ":authority", Value: c.authority}, {Name: ":path", Value: path},
	}
	if body != nil {
		fields = append(fields, hpack.HeaderField{Name: "content-type", Value: "application/json"},
			hpack.HeaderField{Name: "content-length", Value: strconv.Itoa(len(body))})
	}
	for k, v := range header {
		fields = append(fields, hpack.HeaderField{Name: strings.ToLower(k), Value: v})
	}
	for _, f := range fields {
		if err := c.enc.WriteField(f); err != nil {
			return h2Response{}, err
		}
	}
	c.conn.SetDeadline(time.Now().Add(time.Minute))
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true, EndStream: body == nil}); err != nil {
		return h2Response{}, err
	}
	if body != nil {
		if err := c.fr.WriteData(id, true, body); err != nil {
			return h2Response{}, err
		}
	}
	resp := h2Response{Header: http.Header{}}
	for !resp.Ended && resp.Reset == nil {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return resp, fmt.Errorf("stream %d: reading frames: %w (so far: %s)", id, err, resp)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := c.fr.WriteSettingsAck(); err != nil {
					return resp, err
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := c.fr.WritePing(true, f.Data); err != nil {
					return resp, err
				}
			}
		case *http2.GoAwayFrame:
			resp.GoAway = f
			resp.Frames = append(resp.Frames, fmt.Sprintf("GOAWAY(%v)", f.ErrCode))
			return resp, fmt.Errorf("stream %d: the node sent GOAWAY %v: %s", id, f.ErrCode, resp)
		case *http2.MetaHeadersFrame:
			if f.StreamID != id {
				continue
			}
			flags := ""
			if f.StreamEnded() {
				flags = "+END_STREAM"
				resp.Ended = true
			}
			resp.Frames = append(resp.Frames, "HEADERS"+flags)
			if resp.Status == "" {
				resp.Status = f.PseudoValue("status")
				resp.HeadersEndStream = f.StreamEnded()
				for _, hf := range f.RegularFields() {
					resp.Header.Add(hf.Name, hf.Value)
				}
			}
		case *http2.DataFrame:
			if f.StreamID != id {
				continue
			}
			resp.DataFrames++
			resp.Body = append(resp.Body, f.Data()...)
			flags := ""
			if f.StreamEnded() {
				flags = "+END_STREAM"
				resp.Ended = true
			}
			resp.Frames = append(resp.Frames, fmt.Sprintf("DATA(%d)%s", len(f.Data()), flags))
			// Give the window back so a long answer is not stalled.
			if n := uint32(len(f.Data())); n > 0 {
				c.fr.WriteWindowUpdate(0, n)
				if !resp.Ended {
					c.fr.WriteWindowUpdate(id, n)
				}
			}
		case *http2.RSTStreamFrame:
			if f.StreamID != id {
				continue
			}
			code := f.ErrCode
			resp.Reset = &code
			resp.Frames = append(resp.Frames, fmt.Sprintf("RST_STREAM(%v)", code))
		}
	}
	return resp, nil
}
