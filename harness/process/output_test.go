package process

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// Writers and a reader at once (run with -race to see the point): every
// write lands whole.
func TestOutputConcurrent(t *testing.T) {
	var o Output
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 100 {
				fmt.Fprintf(&o, "w%d-%d\n", w, i)
				_ = o.String()
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(o.String(), "\n"), "\n")
	if len(lines) != 400 {
		t.Fatalf("expected 400 whole lines, found %d", len(lines))
	}
}
