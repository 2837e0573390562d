package replica

import (
	"bytes"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// The snapshot encoder pauses after every `every` bytes (a
// busy encoder kept the Ready loop's ticker from firing during GC), and
// passes every byte through unchanged.
func TestPacedBufferPausesEveryNBytes(t *testing.T) {
	var out bytes.Buffer
	var pauses []time.Duration
	p := &pacedBuffer{Buffer: &out, every: 10, pause: time.Millisecond, sleep: func(d time.Duration) { pauses = append(pauses, d) }}
	for _, n := range []int{3, 7, 25, 4} { // 39 bytes, then one by WriteString: pauses at 10, 20, 30, 40
		if _, err := p.Write(bytes.Repeat([]byte{byte(n)}, n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.WriteString("x"); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 40 {
		t.Fatalf("expected 40 bytes through, found %d", out.Len())
	}
	if len(pauses) != 4 || pauses[0] != time.Millisecond {
		t.Fatalf("expected 4 pauses of 1ms, found %v", pauses)
	}
}

// A state machine patches what it wrote into the snapshot buffer
// (server.encodeInto fills in a section's length afterwards), so the paced
// buffer must keep the buffer's Bytes, Len and WriteString.
var _ interface {
	io.Writer
	io.StringWriter
	Len() int
	Bytes() []byte
} = (*pacedBuffer)(nil)

// The encoder's buffer is reported while it grows (SnapshotMemory's
// Encoding): at every pause the held counter is the buffer's capacity.
func TestPacedBufferReportsItsCapacity(t *testing.T) {
	var out bytes.Buffer
	var held atomic.Int64
	p := &pacedBuffer{Buffer: &out, every: 1 << 10, sleep: func(time.Duration) {}, held: &held}
	p.Write(make([]byte, 100))
	if held.Load() != 0 {
		t.Fatalf("before the first pause: expected nothing reported, found %d", held.Load())
	}
	p.Write(make([]byte, 5<<10))
	if got := held.Load(); got != int64(out.Cap()) || got < 5<<10 {
		t.Fatalf("after 5 KiB: expected the buffer's capacity %d reported, found %d", out.Cap(), got)
	}
}
