package process

import (
	"bytes"
	"sync"
)

// Output is a child's output held in memory, safe for the goroutines that
// write it (exec.Cmd's copiers, a command's own) and the one reading it
// meanwhile: what a test gives a short-lived program as its Stdout and
// Stderr to quote when it fails. Long-lived processes log to a file
// (Spec.LogPath) instead. The zero Output is empty and ready.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

// String is everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
