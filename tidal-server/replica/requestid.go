package replica

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tidaldb/tidal/tidal-server/atomicfile"
)

// Request ids tie a proposal (and a ReadIndex) to the waiter on this node
// that made it: apply wakes the waiter whose id its entry carries. An id
// must therefore never be handed out twice by this node while an entry
// carrying it may still be applied — and entries outlive the process that
// proposed them. So ids are
//
//	epoch << requestCounterBits | counter
//
// where the epoch is persisted in the data dir and raised (durably) at
// every start, before the first id is handed out, and whenever the counter
// runs out. Nothing here reads a clock: a clock stepped back across a
// restart once let a new proposal take the id of an old one still in the
// log, and the old entry's apply acknowledged the new write.
//
// Data dirs written before the epoch file existed used ids seeded from the
// wall clock in nanoseconds (about 2^60.6 in 2025); epochs start at 1, so
// new ids stay far below those for the next million restarts.
const (
	requestCounterBits = 40
	requestEpochFile   = "request-epoch"
)

type requestIDs struct {
	path string
	last atomic.Uint64 // the last id handed out

	mu        sync.Mutex    // serializes raising the persisted epoch
	persisted atomic.Uint64 // highest epoch made durable
}

// openRequestIDs raises the epoch persisted in dataDir by one and hands out
// ids from it.
func openRequestIDs(dataDir string) (*requestIDs, error) {
	g := &requestIDs{path: filepath.Join(dataDir, requestEpochFile)}
	prev, err := readRequestEpoch(g.path)
	if err != nil {
		return nil, err
	}
	epoch := prev + 1
	if err := writeRequestEpoch(g.path, epoch); err != nil {
		return nil, err
	}
	g.persisted.Store(epoch)
	g.last.Store(epoch << requestCounterBits)
	return g, nil
}

// next returns a fresh id. Only when the counter of the current epoch runs
// out (after 2^40 ids) does it write: the next epoch, made durable before
// any id of it is used.
func (g *requestIDs) next() (uint64, error) {
	id := g.last.Add(1)
	epoch := id >> requestCounterBits
	if epoch <= g.persisted.Load() {
		return id, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if epoch > g.persisted.Load() {
		if err := writeRequestEpoch(g.path, epoch); err != nil {
			return 0, err
		}
		g.persisted.Store(epoch)
	}
	return id, nil
}

// readRequestEpoch returns the epoch in path, or 0 when there is none yet
// (a new data dir, or one from before the file existed).
func readRequestEpoch(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read request id epoch: %w", err)
	}
	epoch, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		// Guessing would risk handing out ids an unapplied entry still
		// carries. The file is written by rename, so this is damage, not
		// a torn write.
		return 0, fmt.Errorf("%s: expected a decimal request id epoch, found %q; it must be at least the largest epoch this node ever used (request id >> %d of any of its entries)", path, b, requestCounterBits)
	}
	if epoch >= 1<<(64-requestCounterBits)-1 {
		return 0, fmt.Errorf("%s: request id epoch %d is exhausted", path, epoch)
	}
	return epoch, nil
}

// writeRequestEpoch replaces path durably (atomicfile: temporary file,
// fsync, rename, fsync of the directory).
func writeRequestEpoch(path string, epoch uint64) error {
	if err := atomicfile.Write(path, []byte(strconv.FormatUint(epoch, 10)+"\n"), 0o644); err != nil {
		return fmt.Errorf("persist request id epoch %d to %s: %w", epoch, path, err)
	}
	return nil
}
