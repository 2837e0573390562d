package cluster

import (
	"bytes"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// startPoll is how often waitBound looks at the nodes it waits for.
const startPoll = 50 * time.Millisecond

// waitBound waits until every node in nodes has bound its client
// listener (the last one tidal-server binds), and fails at once with a
// *StartError when one exits first or when StartTimeout passes.
func (c *Cluster) waitBound(nodes []*Node) error {
	deadline := time.Now().Add(c.cfg.StartTimeout)
	pending := append([]*Node(nil), nodes...)
	for {
		var still []*Node
		for _, n := range pending {
			c.mu.Lock()
			h, marks, addr := n.handle, n.logs, n.ClientAddr
			c.mu.Unlock()
			select {
			case <-h.Exited():
				return startError(n.Name, h.PID(), true, marks)
			default:
			}
			if !bound(h, addr) {
				still = append(still, n)
			}
		}
		if pending = still; len(pending) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			n := pending[0]
			c.mu.Lock()
			h, marks := n.handle, n.logs
			c.mu.Unlock()
			e := startError(n.Name, h.PID(), false, marks)
			e.Quote = "not listening on " + n.ClientAddr + " after " + c.cfg.StartTimeout.String() + "; last output: " + e.Quote
			return e
		}
		time.Sleep(startPoll)
	}
}

// bound reports whether the node behind h listens on addr. A handle that
// can tell whether its own process holds the listener is asked; otherwise
// a dial has to do.
func bound(h Handle, addr string) bool {
	if lo, ok := h.(ListenerOwner); ok {
		up, err := lo.Listening(addr)
		return err == nil && up
	}
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// maxQuote bounds the quoted error.
const maxQuote = 600

// startError builds the error for a node that did not come up, quoting
// what it wrote to its logs since it was launched: its last error line
// (tidal-server prints "error: ..." before exiting), or else its last line.
func startError(name string, pid int, exited bool, marks []logMark) *StartError {
	e := &StartError{Node: name, PID: pid, Exited: exited, Quote: "(it wrote nothing)"}
	if len(marks) > 0 {
		e.Log = marks[0].path
	}
	var fallback, fallbackLog string
	found := false
	for _, m := range marks {
		out := since(m)
		if strings.Contains(out, "address already in use") {
			e.PortTaken = true
		}
		lastErr, last := "", ""
		for _, line := range strings.Split(out, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "=== ") { // the process backend's own markers
				continue
			}
			if looksLikeError(line) {
				lastErr = line
			}
			last = line
		}
		// The first log (stdout and stderr) holds the exit error; a
		// later one is read only when it has none.
		if lastErr != "" {
			e.Quote, e.Log, found = lastErr, m.path, true
			break
		}
		if fallback == "" && last != "" {
			fallback, fallbackLog = last, m.path
		}
	}
	if !found && fallback != "" {
		e.Quote, e.Log = fallback, fallbackLog
	}
	if len(e.Quote) > maxQuote {
		e.Quote = e.Quote[:maxQuote] + "..."
	}
	return e
}

// looksLikeError picks the lines worth quoting: "error: ..." from a
// command, an ERROR-level log record, a panic.
func looksLikeError(line string) bool {
	l := strings.ToLower(line)
	return strings.HasPrefix(l, "error") || strings.Contains(l, "level=error") || strings.Contains(l, `"level":"error"`) ||
		strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal")
}

// since returns what was appended to m's file after m was taken (at most
// the last 64 KiB of it).
func since(m logMark) string {
	f, err := os.Open(m.path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() <= m.size {
		return ""
	}
	from := max(m.size, st.Size()-64<<10)
	var buf bytes.Buffer
	_, _ = io.Copy(&buf, io.NewSectionReader(f, from, st.Size()-from))
	return buf.String()
}
