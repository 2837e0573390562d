package stress

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"

	"github.com/tidaldb/tidal/tidal-server/client"
)

// Mix says which requests a run sends.
type Mix string

// The mixes tidal-stress knows.
const (
	MixWrites Mix = "writes" // signal batches, or embedding puts when EmbeddingDim > 0
	MixReads  Mix = "reads"  // GET /v1/entities/{id}
	MixMixed  Mix = "mixed"  // both; Config.ReadFraction of the ops are reads
)

// ParseMix checks a --mix value.
func ParseMix(s string) (Mix, error) {
	switch m := Mix(s); m {
	case MixWrites, MixReads, MixMixed:
		return m, nil
	}
	return "", fmt.Errorf("mix: expected writes, reads or mixed, found %q", s)
}

// opKind separates reads from writes in the stage statistics.
type opKind int

const (
	kindWrite opKind = iota
	kindRead
	numKinds
)

func (k opKind) String() string {
	if k == kindRead {
		return "read"
	}
	return "write"
}

// signalNames are the default schema's signals; writes cycle through them
// so that every aggregate the server keeps sees traffic.
var signalNames = [...]string{"view", "like", "share", "skip"}

// workload turns an op (its sequence number and a random source) into an
// HTTP request. It holds only immutable data once built, so every worker
// shares one.
type workload struct {
	targets      []string // base URLs, "http://host:port"
	mix          Mix
	readFraction float64
	batch        int
	entities     uint64
	consistency  string
	runID        string
	// vectors are pre-encoded JSON arrays ("[0.1,...]"), shared read-only by
	// every request body that carries one: an embedding put costs one small
	// allocation instead of re-encoding 1536 floats.
	vectors [][]byte
	// binaryVectors: vectors are raw little-endian float32s sent as
	// application/octet-stream with the id in the query.
	binaryVectors bool
}

// vectorVariants is how many distinct embeddings a run writes; enough that
// a server cannot short-cut identical payloads, few enough to pre-encode.
const vectorVariants = 16

func newWorkload(cfg Config) *workload {
	w := &workload{
		mix:           cfg.Mix,
		readFraction:  cfg.ReadFraction,
		batch:         cfg.Batch,
		entities:      cfg.Entities,
		consistency:   cfg.Consistency,
		runID:         cfg.RunID,
		binaryVectors: cfg.BinaryVectors,
	}
	for _, t := range cfg.Targets {
		w.targets = append(w.targets, baseURL(t, cfg.TLS != nil))
	}
	if cfg.EmbeddingDim > 0 {
		rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x7ec7))
		for range vectorVariants {
			if cfg.BinaryVectors {
				w.vectors = append(w.vectors, encodeUnitVectorBinary(rng, cfg.EmbeddingDim))
			} else {
				w.vectors = append(w.vectors, encodeUnitVector(rng, cfg.EmbeddingDim))
			}
		}
	}
	return w
}

// baseURL accepts "host:port" or a URL and returns the URL without a
// trailing slash; a bare host:port gets https:// when secure.
func baseURL(addr string, secure bool) string {
	addr = strings.TrimRight(addr, "/")
	if !strings.Contains(addr, "://") {
		if secure {
			return "https://" + addr
		}
		addr = "http://" + addr
	}
	return addr
}

// encodeUnitVector draws a random direction (normalised, so any norm bound
// the server enforces holds) and encodes it with 5 significant digits:
// shorter bodies, and a 1536-dim embedding does not need more.
func encodeUnitVector(rng *rand.Rand, dim int) []byte {
	v := make([]float64, dim)
	var sumSq float64
	for i := range v {
		v[i] = rng.NormFloat64()
		sumSq += v[i] * v[i]
	}
	norm := math.Sqrt(sumSq)
	if norm == 0 { // every draw zero: practically impossible, but never send the zero vector
		v[0], norm = 1, 1
	}
	buf := make([]byte, 0, dim*10)
	buf = append(buf, '[')
	for i, x := range v {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = strconv.AppendFloat(buf, x/norm, 'g', 5, 32)
	}
	return append(buf, ']')
}

// encodeUnitVectorBinary is encodeUnitVector as little-endian float32s.
func encodeUnitVectorBinary(rng *rand.Rand, dim int) []byte {
	v := make([]float64, dim)
	var sumSq float64
	for i := range v {
		v[i] = rng.NormFloat64()
		sumSq += v[i] * v[i]
	}
	norm := math.Sqrt(sumSq)
	if norm == 0 {
		v[0], norm = 1, 1
	}
	buf := make([]byte, 0, 4*dim)
	for _, x := range v {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(float32(x/norm)))
	}
	return buf
}

// contentType is the Content-Type of a write's body.
func (w *workload) contentType() string {
	if w.vectors != nil && w.binaryVectors {
		return "application/octet-stream"
	}
	return "application/json"
}

// kind decides whether op seq is a read or a write.
func (w *workload) kind(rng *rand.Rand) opKind {
	switch w.mix {
	case MixReads:
		return kindRead
	case MixMixed:
		if rng.Float64() < w.readFraction {
			return kindRead
		}
	}
	return kindWrite
}

// events is how many events one op of this kind carries (0 for reads).
func (w *workload) events(k opKind) int {
	if k == kindRead {
		return 0
	}
	if w.vectors != nil {
		return 1
	}
	return w.batch
}

// request builds op seq's request. Targets are taken round-robin by seq, so
// a run spreads evenly over the nodes whatever the worker interleaving.
func (w *workload) request(seq uint64, k opKind, rng *rand.Rand) (method, url string, body io.Reader, size int64) {
	target := w.targets[seq%uint64(len(w.targets))]
	entity := 1 + rng.Uint64N(w.entities)
	switch {
	case k == kindRead:
		return http.MethodGet, target + "/v1/entities/" + strconv.FormatUint(entity, 10) + "?consistency=" + w.consistency, nil, 0
	case w.vectors != nil && w.binaryVectors:
		id := w.appendID(make([]byte, 0, 64), seq, 0)
		vec := w.vectors[seq%uint64(len(w.vectors))]
		return http.MethodPut, target + "/v1/entities/" + strconv.FormatUint(entity, 10) + "/embedding?id=" + neturl.QueryEscape(string(id)),
			bytes.NewReader(vec), int64(len(vec))
	case w.vectors != nil:
		head := make([]byte, 0, 64)
		head = append(head, `{"id":"`...)
		head = w.appendID(head, seq, 0)
		head = append(head, `","vector":`...)
		vec := w.vectors[seq%uint64(len(w.vectors))]
		return http.MethodPut, target + "/v1/entities/" + strconv.FormatUint(entity, 10) + "/embedding",
			io.MultiReader(bytes.NewReader(head), bytes.NewReader(vec), strings.NewReader("}")),
			int64(len(head) + len(vec) + 1)
	default:
		// A fresh buffer per op: the transport may still hold the body after
		// Do returns (it closes it asynchronously), so buffers are not reused.
		buf := make([]byte, 0, 16+w.batch*(len(w.runID)+64))
		buf = append(buf, `{"events":[`...)
		for i := range w.batch {
			if i > 0 {
				buf = append(buf, ',')
				entity = 1 + rng.Uint64N(w.entities)
			}
			buf = append(buf, `{"id":"`...)
			buf = w.appendID(buf, seq, i)
			buf = append(buf, `","entity":`...)
			buf = strconv.AppendUint(buf, entity, 10)
			buf = append(buf, `,"signal":"`...)
			buf = append(buf, signalNames[(seq+uint64(i))%uint64(len(signalNames))]...)
			buf = append(buf, `","weight":1}`...)
		}
		buf = append(buf, "]}"...)
		return http.MethodPost, target + "/v1/signals", bytes.NewReader(buf), int64(len(buf))
	}
}

// streamEvents builds op seq's signal write as events, for the gRPC ingest
// stream: the same ids, entities and signals request would encode as
// JSON, and the index of the target it is for.
func (w *workload) streamEvents(seq uint64, rng *rand.Rand) (int, []client.Event) {
	target := int(seq % uint64(len(w.targets)))
	out := make([]client.Event, w.batch)
	buf := make([]byte, 0, len(w.runID)+32)
	for i := range out {
		buf = w.appendID(buf[:0], seq, i)
		out[i] = client.Event{ID: string(buf), Entity: 1 + rng.Uint64N(w.entities),
			Signal: signalNames[(seq+uint64(i))%uint64(len(signalNames))], Weight: 1}
	}
	return target, out
}

// appendID appends the id of event i of op seq: unique within the run, and
// across runs through the run id, so no event is taken for a retry of an
// earlier run's.
func (w *workload) appendID(buf []byte, seq uint64, i int) []byte {
	buf = append(buf, w.runID...)
	buf = append(buf, '-')
	buf = strconv.AppendUint(buf, seq, 36)
	if w.batch > 1 && w.vectors == nil {
		buf = append(buf, '.')
		buf = strconv.AppendInt(buf, int64(i), 36)
	}
	return buf
}
