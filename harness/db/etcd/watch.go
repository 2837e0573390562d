package etcd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"bytes"
)

// WatchFile is where a node's watcher writes what it saw, in the node's
// directory of the run store: one WatchLine a line.
const WatchFile = "watch.jsonl"

// WatchLine is one line of a watch file: an event (Key, Rev), a
// (re)connection starting at Start, or the End revision the watcher had
// reached when it was stopped (absent if it never reached the final
// revision it was waiting for).
type WatchLine struct {
	Key   string `json:"key,omitempty"`
	Rev   uint64 `json:"rev,omitempty"`
	Start uint64 `json:"start,omitempty"`
	End   uint64 `json:"end,omitempty"`
	Error string `json:"error,omitempty"`
}

// watcher follows the append prefix on one node, through its client relay,
// from revision 1, resuming after every cut at the revision after the
// last it saw: etcd promises every event once, in revision order, with
// no gaps, across such resumption.
type watcher struct {
	node string
	addr string
	f    *os.File
	enc  *json.Encoder

	mu   sync.Mutex
	last uint64 // highest revision delivered
	cond *sync.Cond
}

func newWatcher(node, addr, dir string) (*watcher, error) {
	f, err := os.Create(filepath.Join(dir, WatchFile))
	if err != nil {
		return nil, err
	}
	w := &watcher{node: node, addr: addr, f: f, enc: json.NewEncoder(f)}
	w.cond = sync.NewCond(&w.mu)
	return w, nil
}

func (w *watcher) write(l WatchLine) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.enc.Encode(l)
}

// run watches until ctx ends.
func (w *watcher) run(ctx context.Context) {
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	for ctx.Err() == nil {
		w.mu.Lock()
		start := w.last + 1
		w.mu.Unlock()
		w.write(WatchLine{Start: start})
		err := w.stream(ctx, hc, start)
		if ctx.Err() != nil {
			return
		}
		w.write(WatchLine{Error: fmt.Sprint(err)})
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (w *watcher) stream(ctx context.Context, hc *http.Client, start uint64) error {
	body, _ := json.Marshal(map[string]any{"create_request": map[string]any{
		"key": []byte(appendPrefix), "range_end": prefixEnd([]byte(appendPrefix)), "start_revision": u64(start)}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+w.addr+"/v3/watch", bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /v3/watch: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var msg struct {
			Result struct {
				Header   header `json:"header"`
				Canceled bool   `json:"canceled"`
				Reason   string `json:"cancel_reason"`
				Compact  u64    `json:"compact_revision"`
				Events   []struct {
					Type string   `json:"type"`
					KV   keyValue `json:"kv"`
				} `json:"events"`
			} `json:"result"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &msg); err != nil {
			return fmt.Errorf("watch: expected JSON, found %.200s: %w", sc.Bytes(), err)
		}
		if msg.Error != nil {
			return errors.New(msg.Error.Message)
		}
		if msg.Result.Canceled {
			return fmt.Errorf("watch canceled: %s (compact revision %d)", msg.Result.Reason, msg.Result.Compact)
		}
		w.mu.Lock()
		for _, e := range msg.Result.Events {
			rev := uint64(e.KV.ModRevision)
			w.enc.Encode(WatchLine{Key: string(e.KV.Key), Rev: rev})
			if rev > w.last {
				w.last = rev
			}
		}
		// A watch's progress: no event below the header revision is
		// still to come on this stream.
		w.cond.Broadcast()
		w.mu.Unlock()
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("watch stream ended")
}

// waitFor waits until the watcher has delivered revision rev or ctx ends.
func (w *watcher) waitFor(ctx context.Context, rev uint64) bool {
	done := make(chan struct{})
	go func() {
		<-ctx.Done()
		w.mu.Lock()
		w.cond.Broadcast()
		w.mu.Unlock()
		close(done)
	}()
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.last < rev && ctx.Err() == nil {
		w.cond.Wait()
	}
	return w.last >= rev
}

func (w *watcher) close(end uint64, reached bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if reached {
		w.enc.Encode(WatchLine{End: end})
	}
	return w.f.Close()
}
