package workload

import (
	"sync"

	"github.com/tidaldb/tidal/harness/history"
)

// keySlots hands counter keys to workers so that the linearizability
// search of every key stays small.
//
// There are Keys slots; worker i always works on slot i mod Keys, which
// bounds how many workers ever share a key. A slot holds one key at a
// time and moves on to a fresh one (the next unused CounterBase+n) once
// its key has been given OpsPerKey ops or InfosPerKey of its adds ended
// info. Porcupine's search on a key is exponential in the number of
// operations that may be concurrent at any point, and an info add is
// concurrent with everything after it: with a fixed handful of keys a
// long faulty run piles dozens of them on each key and the search never
// finishes. Retiring keys trades that for more, shorter keys, which cost
// one final read each.
type keySlots struct {
	opsPerKey, infosPerKey int

	mu    sync.Mutex
	slots []keySlot
	next  uint64 // keys handed out so far: CounterBase .. CounterBase+next-1
}

type keySlot struct {
	key        uint64 // 0: none yet
	ops, infos int
}

func newKeySlots(cfg *Config) *keySlots {
	return &keySlots{opsPerKey: cfg.OpsPerKey, infosPerKey: cfg.InfosPerKey, slots: make([]keySlot, cfg.Keys)}
}

// take returns the key worker slot's next op goes to, counting the op.
func (k *keySlots) take(worker int) uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := &k.slots[worker%len(k.slots)]
	if s.key == 0 || s.ops >= k.opsPerKey || s.infos >= k.infosPerKey {
		*s = keySlot{key: CounterBase + k.next}
		k.next++
	}
	s.ops++
	return s.key
}

// done notes the outcome of an op on key by worker; an add that ended
// info counts towards retiring the key (a read that ended info
// constrains nothing and costs the search nothing).
func (k *keySlots) done(worker int, key uint64, f string, t history.Type) {
	if f != history.FAdd || t != history.Info {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if s := &k.slots[worker%len(k.slots)]; s.key == key {
		s.infos++
	}
}

// used lists every key handed out so far, in order.
func (k *keySlots) used() []uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make([]uint64, k.next)
	for i := range out {
		out[i] = CounterBase + uint64(i)
	}
	return out
}
