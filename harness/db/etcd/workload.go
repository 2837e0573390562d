package etcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidaldb/tidal/harness/cluster"
	"github.com/tidaldb/tidal/harness/db"
	"github.com/tidaldb/tidal/harness/history"
	"github.com/tidaldb/tidal/harness/workload"
)

// History fs of the register workload (the append workload records
// history.FWrite with a history.WriteValue, which the ledger checker reads).
const (
	FGet = "get"
	FPut = "put"
	FCAS = "cas"
)

// RegisterValue is the value of a register op. Values are positive (by
// default each written once: Config.Values); 0 is a key that does not
// exist. put: Value. cas: Old -> Value (compare the value, then put).
// get: the completion's Value is what was read and Rev the key's mod
// revision (the revision of the write that produced it; 0 when the key
// does not exist, and in histories recorded before it was kept).
type RegisterValue struct {
	Key   string `json:"key"`
	Value int    `json:"value"`
	Old   int    `json:"old,omitempty"`
	Rev   int64  `json:"rev,omitempty"`
}

// Key prefixes: the workloads' keys never meet.
const (
	registerPrefix = "tidal/register/"
	appendPrefix   = "tidal/append/"
)

// Workload is the clients of one etcd run; it implements db.Workload.
//
// Every history it writes keeps the invariants of package workload: one
// op in flight per process; an op whose outcome is unknown completes info
// and retires its process; fail only when etcd said (or the transport
// shows) the request was not applied (Outcome). A read has no effect, so
// a read that did not complete ok is recorded fail.
type Workload struct {
	cfg      Config
	c        *Cluster
	rec      *history.Recorder
	duration time.Duration
	clients  map[string]*api // through the client relays

	nextProc atomic.Int64
	nextID   atomic.Int64
	rr       atomic.Uint64
	keys     *keySlots
	// nextValue numbers the written values when each is written once.
	nextValue atomic.Int64
	// leader is the member last seen leading ("" unknown), for the leader
	// selection; stale asks its refresher to look again now.
	leader atomic.Pointer[string]
	stale  chan struct{}
	// last is the newest value a worker saw on each key (read or
	// written): a cas compares against it, so that it has a chance of
	// holding with values written once.
	last   map[string]int
	mu     sync.Mutex
	counts map[string]*workload.Counts
	shed   atomic.Int64

	// watchers follow the append prefix on every node (append workload).
	watchers    []*watcher
	stopWatches context.CancelFunc
	watchDone   sync.WaitGroup
}

var _ db.Workload = (*Workload)(nil)

// Workload implements db.Cluster.
func (c *Cluster) Workload(rec *history.Recorder, d time.Duration) (db.Workload, error) {
	w := &Workload{cfg: c.cfg, c: c, rec: rec, duration: d, clients: map[string]*api{},
		keys: newKeySlots(c.cfg.Keys, c.cfg.OpsPerKey), counts: map[string]*workload.Counts{},
		stale: make(chan struct{}, 1), last: map[string]int{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		w.clients[n.name] = newAPI(n.clientRelay, time.Duration(c.cfg.OpTimeout))
		if c.cfg.Workload == Append {
			wt, err := newWatcher(n.name, n.clientRelay, n.dir)
			if err != nil {
				return nil, err
			}
			w.watchers = append(w.watchers, wt)
		}
	}
	if len(w.watchers) > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		w.stopWatches = cancel
		c.stops = append(c.stops, cancel)
		for _, wt := range w.watchers {
			w.watchDone.Add(1)
			go func() {
				defer w.watchDone.Done()
				wt.run(ctx)
			}()
		}
	}
	return w, nil
}

// Progress implements db.Workload.
func (w *Workload) Progress() workload.Progress {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := workload.Progress{ByF: map[string]workload.Counts{}, Shed: w.shed.Load(), Processes: w.nextProc.Load()}
	for f, c := range w.counts {
		p.ByF[f] = *c
	}
	return p
}

func (w *Workload) count(f string, t history.Type) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.counts[f]
	if c == nil {
		c = &workload.Counts{}
		w.counts[f] = c
	}
	switch t {
	case "":
		c.Invoked++
	case history.OK:
		c.OK++
	case history.Fail:
		c.Fail++
	case history.Info:
		c.Info++
	}
}

// Final implements db.Workload. The append workload's watchers are given
// until ctx ends (at most 30s) to deliver the cluster's final revision,
// then stopped; each records the revision it reached, or nothing if it
// did not (the watch checker then says unknown for it). The keys
// themselves are judged from every node's store (Collect).
func (w *Workload) Final(ctx context.Context) error {
	if len(w.watchers) == 0 {
		return nil
	}
	var final uint64
	for _, name := range w.c.RunningNames() {
		if st, err := w.c.status(ctx, name); err == nil && uint64(st.Header.Revision) > final {
			final = uint64(st.Header.Revision)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	reached := make([]bool, len(w.watchers))
	var wg sync.WaitGroup
	for i, wt := range w.watchers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// An append run writes nothing but appends: the cluster's
			// revision is its last append's.
			reached[i] = final > 0 && wt.waitFor(wctx, final)
		}()
	}
	wg.Wait()
	w.stopWatches()
	w.watchDone.Wait()
	var errs []error
	for i, wt := range w.watchers {
		if err := wt.close(final, reached[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Run implements db.Workload: workers issue ops, each to the member the
// selection picks, until the duration has passed or ctx ends.
func (w *Workload) Run(ctx context.Context) error {
	issue, cancel := context.WithTimeout(ctx, w.duration)
	defer cancel()
	if w.cfg.Select == Leader {
		var done sync.WaitGroup
		done.Add(1)
		go func() {
			defer done.Done()
			w.followLeader(issue)
		}()
		defer done.Wait()
		defer cancel()
	}
	steps := make([]func(), w.cfg.Concurrency)
	for i := range steps {
		wk := &worker{w: w, index: i, rng: rand.New(rand.NewPCG(w.cfg.Seed, uint64(i)))}
		wk.proc = w.newProcess()
		steps[i] = func() { wk.step(ctx) }
	}
	workload.Drive(issue, w.cfg.Rate, steps, func() { w.shed.Add(1) })
	for _, a := range w.clients {
		a.close()
	}
	if err := w.rec.Err(); err != nil {
		return fmt.Errorf("etcd workload: recording the history: %w", err)
	}
	return nil
}

func (w *Workload) newProcess() history.Process { return history.Process(w.nextProc.Add(1) - 1) }

// followLeader keeps the leader hint fresh until ctx ends: every half
// second, and at once when an op sent to the hinted leader did not
// complete ok (it may have lost leadership or be paused).
func (w *Workload) followLeader(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		name, err := w.c.leader(lctx)
		cancel()
		if err != nil {
			name = ""
		}
		w.leader.Store(&name)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.stale:
		}
	}
}

// target picks the member slot of worker index's next op by the run's
// selection ("" when no slot holds a member).
func (w *Workload) target(index int, rng *rand.Rand) string {
	names := w.c.Names()
	var members []string
	for _, n := range names {
		if w.c.State(n) != cluster.Removed {
			members = append(members, n)
		}
	}
	if len(members) == 0 {
		return ""
	}
	switch w.cfg.Select {
	case Random:
		return members[rng.IntN(len(members))]
	case Leader:
		if l := w.leader.Load(); l != nil && *l != "" && slices.Contains(members, *l) {
			return *l
		}
	case Bound:
		// The worker's slot among all slots, so that membership churn
		// elsewhere never moves it; a removed slot's workers spread
		// round-robin until it is a member again.
		if n := names[index%len(names)]; slices.Contains(members, n) {
			return n
		}
	}
	return members[int(w.rr.Add(1))%len(members)]
}

// missed tells the leader refresher that an op sent to node did not
// complete ok.
func (w *Workload) missed(node string) {
	if l := w.leader.Load(); w.cfg.Select != Leader || l == nil || *l != node {
		return
	}
	select {
	case w.stale <- struct{}{}:
	default:
	}
}

// value returns the next value to write: never written before on any key
// (Config.Values 0), or drawn from 1..Values.
func (w *Workload) value(rng *rand.Rand) int {
	if w.cfg.Values > 0 {
		return 1 + rng.IntN(w.cfg.Values)
	}
	return int(w.nextValue.Add(1))
}

// casOld is the value a cas compares against: the newest value a worker
// saw on key (or, with a value range, one drawn from it half the time).
func (w *Workload) casOld(key string, rng *rand.Rand) int {
	if w.cfg.Values > 0 && rng.IntN(2) == 0 {
		return 1 + rng.IntN(w.cfg.Values)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last[key]
}

func (w *Workload) saw(key string, v int) {
	w.mu.Lock()
	w.last[key] = v
	w.mu.Unlock()
}

type worker struct {
	w     *Workload
	index int
	rng   *rand.Rand
	proc  history.Process
}

func (wk *worker) step(ctx context.Context) {
	w := wk.w
	node := w.target(wk.index, wk.rng)
	if node == "" {
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
		return
	}
	var t history.Type
	if w.cfg.Workload == Append {
		t = wk.appendOp(ctx, node)
	} else {
		t = wk.registerOp(ctx, node)
	}
	if t != history.OK {
		w.missed(node)
	}
	if t == history.Info {
		wk.proc = w.newProcess()
	}
}

func (wk *worker) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, time.Duration(wk.w.cfg.OpTimeout))
}

// registerOp performs one get, put or cas on the worker's key slot.
func (wk *worker) registerOp(ctx context.Context, node string) history.Type {
	w := wk.w
	key := w.keys.take(wk.index)
	v := RegisterValue{Key: key}
	var f string
	switch r := wk.rng.IntN(10); {
	case r < 4:
		f = FGet
	case r < 7:
		f, v.Value = FPut, w.value(wk.rng)
	default:
		f, v.Old, v.Value = FCAS, w.casOld(key, wk.rng), w.value(wk.rng)
	}
	inv := w.rec.Invoke(wk.proc, f, v, node)
	w.count(f, "")
	octx, cancel := wk.opCtx(ctx)
	defer cancel()
	a := w.clients[node]
	var t history.Type
	var out any
	var err error
	var seq, term uint64
	switch f {
	case FGet:
		var resp *rangeResponse
		resp, err = a.rangeKeys(octx, rangeRequest{Key: []byte(key), Serializable: w.cfg.Reads == Serializable})
		if err == nil {
			got := RegisterValue{Key: key}
			if len(resp.KVs) > 0 {
				got.Rev = int64(resp.KVs[0].ModRevision)
				if got.Value, err = strconv.Atoi(string(resp.KVs[0].Value)); err != nil {
					err = fmt.Errorf("key %s: expected a number, found %q", key, resp.KVs[0].Value)
				}
			}
			if err == nil && got.Value != 0 {
				w.saw(key, got.Value)
			}
			out, seq, term = got, uint64(resp.Header.Revision), uint64(resp.Header.RaftTerm)
		}
		t = history.OK
		if err != nil {
			t = history.Fail // a read changes nothing: not ok is as good as not done
		}
	case FPut:
		var h *header
		h, err = a.put(octx, []byte(key), []byte(strconv.Itoa(v.Value)))
		t = Outcome(err)
		if err == nil {
			seq, term = uint64(h.Revision), uint64(h.RaftTerm)
		}
	case FCAS:
		var resp *txnResponse
		resp, err = a.txn(octx, txnRequest{
			Compare: []compare{{Key: []byte(key), Result: "EQUAL", Target: "VALUE", Value: []byte(strconv.Itoa(v.Old))}},
			Success: []requestOp{{RequestPut: &putRequest{Key: []byte(key), Value: []byte(strconv.Itoa(v.Value))}}},
		})
		t = Outcome(err)
		if err == nil {
			seq, term = uint64(resp.Header.Revision), uint64(resp.Header.RaftTerm)
			if !resp.Succeeded {
				t, err = history.Fail, fmt.Errorf("compare failed: %s is not %d", key, v.Old)
			}
		}
	}
	if t != history.OK {
		out, seq, term = nil, 0, 0
	} else if f != FGet {
		w.saw(key, v.Value)
	}
	w.rec.Complete(inv, t, out, err, seq, term)
	w.count(f, t)
	w.keys.done(wk.index, t)
	return t
}

// appendOp writes 1-3 fresh unique keys in one txn: one raft entry, so
// they land together or not at all.
func (wk *worker) appendOp(ctx context.Context, node string) history.Type {
	w := wk.w
	n := 1 + wk.rng.IntN(3)
	v := history.WriteValue{}
	var ops []requestOp
	for range n {
		id := fmt.Sprintf("e%d-%d", wk.proc, w.nextID.Add(1))
		v.Events = append(v.Events, history.Event{ID: id, Signal: "append"})
		ops = append(ops, requestOp{RequestPut: &putRequest{Key: []byte(appendPrefix + id), Value: []byte(id)}})
	}
	inv := w.rec.Invoke(wk.proc, history.FWrite, v, node)
	w.count(history.FWrite, "")
	octx, cancel := wk.opCtx(ctx)
	defer cancel()
	resp, err := w.clients[node].txn(octx, txnRequest{Success: ops})
	t := Outcome(err)
	var seq, term uint64
	if err == nil {
		seq, term = uint64(resp.Header.Revision), uint64(resp.Header.RaftTerm)
	}
	w.rec.Complete(inv, t, nil, err, seq, term)
	w.count(history.FWrite, t)
	return t
}

// keySlots hands out register keys: Keys slots, each serving a key for
// OpsPerKey ops (or a third as many info ops, which keep the search open)
// before moving on to a fresh key. Workers share slots by index.
type keySlots struct {
	mu     sync.Mutex
	perKey int
	next   int
	slots  []slot
}

type slot struct {
	key       int
	ops, info int
}

func newKeySlots(n, perKey int) *keySlots {
	k := &keySlots{perKey: perKey}
	for range n {
		k.slots = append(k.slots, slot{key: k.next})
		k.next++
	}
	return k
}

func (k *keySlots) take(worker int) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return registerPrefix + strconv.Itoa(k.slots[worker%len(k.slots)].key)
}

func (k *keySlots) done(worker int, t history.Type) {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := &k.slots[worker%len(k.slots)]
	s.ops++
	if t == history.Info {
		s.info++
	}
	if s.ops >= k.perKey || s.info >= max(1, k.perKey/30) {
		*s = slot{key: k.next}
		k.next++
	}
}
