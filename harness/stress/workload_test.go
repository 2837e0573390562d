package stress

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/client"
)

func testWorkload(t *testing.T, c Config) *workload {
	t.Helper()
	c.Targets = []string{"127.0.0.1:1", "http://127.0.0.1:2/"}
	c.RunID = "run1"
	c, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return newWorkload(c)
}

type signalBody struct {
	Events []struct {
		ID     string  `json:"id"`
		Entity uint64  `json:"entity"`
		Signal string  `json:"signal"`
		Weight float64 `json:"weight"`
	} `json:"events"`
}

func TestSignalBatchBody(t *testing.T) {
	w := testWorkload(t, Config{Batch: 100, Entities: 50})
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]bool{}
	for seq := range uint64(3) {
		method, url, body, size := w.request(seq, kindWrite, rng)
		data, _ := io.ReadAll(body)
		if method != http.MethodPost || int64(len(data)) != size {
			t.Fatalf("expected a POST with a %d-byte body, found %s with %d bytes", size, method, len(data))
		}
		wantURL := []string{"http://127.0.0.1:1/v1/signals", "http://127.0.0.1:2/v1/signals"}[seq%2]
		if url != wantURL {
			t.Errorf("op %d: expected round-robin target %s, found %s", seq, wantURL, url)
		}
		var b signalBody
		if err := json.Unmarshal(data, &b); err != nil {
			t.Fatalf("expected a JSON batch, found %v in %s", err, data)
		}
		if len(b.Events) != 100 {
			t.Fatalf("expected 100 events, found %d", len(b.Events))
		}
		for _, e := range b.Events {
			if seen[e.ID] || !strings.HasPrefix(e.ID, "run1-") {
				t.Errorf("expected unique ids prefixed with the run id, found %q (repeat: %v)", e.ID, seen[e.ID])
			}
			seen[e.ID] = true
			if e.Entity < 1 || e.Entity > 50 || e.Weight != 1 {
				t.Errorf("expected entity in [1,50] with weight 1, found %+v", e)
			}
			if !strings.Contains("view like share skip", e.Signal) {
				t.Errorf("expected a schema signal, found %q", e.Signal)
			}
		}
	}
}

func TestEmbeddingBody(t *testing.T) {
	w := testWorkload(t, Config{EmbeddingDim: 1536, Seed: 7})
	rng := rand.New(rand.NewPCG(1, 2))
	method, url, body, size := w.request(4, kindWrite, rng)
	data, _ := io.ReadAll(body)
	if method != http.MethodPut || !strings.HasSuffix(url, "/embedding") || int64(len(data)) != size {
		t.Fatalf("expected a PUT …/embedding with a %d-byte body, found %s %s with %d bytes", size, method, url, len(data))
	}
	var b struct {
		ID     string    `json:"id"`
		Vector []float64 `json:"vector"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatalf("expected JSON, found %v", err)
	}
	var sumSq float64
	for _, x := range b.Vector {
		sumSq += x * x
	}
	if len(b.Vector) != 1536 || math.Abs(math.Sqrt(sumSq)-1) > 1e-3 || b.ID != "run1-4" {
		t.Errorf("expected id run1-4 and a unit vector of 1536, found id %q, %d components, norm %g", b.ID, len(b.Vector), math.Sqrt(sumSq))
	}
	if w.events(kindWrite) != 1 || w.events(kindRead) != 0 {
		t.Errorf("expected an embedding put to count as one event and a read as none")
	}
}

func TestReadRequestAndMix(t *testing.T) {
	w := testWorkload(t, Config{Mix: MixMixed, ReadFraction: 0.25, Consistency: "local"})
	rng := rand.New(rand.NewPCG(3, 4))
	reads := 0
	for range 10000 {
		if w.kind(rng) == kindRead {
			reads++
		}
	}
	if reads < 2200 || reads > 2800 {
		t.Errorf("expected about 2500 reads of 10000 at a 0.25 share, found %d", reads)
	}
	method, url, body, _ := w.request(0, kindRead, rng)
	if method != http.MethodGet || body != nil || !strings.Contains(url, "/v1/entities/") || !strings.HasSuffix(url, "?consistency=local") {
		t.Errorf("expected GET /v1/entities/N?consistency=local without body, found %s %s", method, url)
	}
}

// BenchmarkSignalBody times building one op's request body: the
// generator's own cost per op, which must stay far below the server's.
func BenchmarkSignalBody(b *testing.B) {
	for _, batch := range []int{1, 100} {
		b.Run("batch="+strconv.Itoa(batch), func(b *testing.B) {
			c, _ := Config{Targets: []string{"127.0.0.1:1"}, Batch: batch, RunID: "bench"}.withDefaults()
			w := newWorkload(c)
			rng := rand.New(rand.NewPCG(1, 2))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				_, _, body, size := w.request(uint64(i), kindWrite, rng)
				_ = body
				b.SetBytes(size)
			}
		})
	}
}

// BenchmarkSend compares the generator's raw request path with the
// project's Go client for one single-event write against a local server
// that answers 204 at once: the difference is generator overhead per op,
// which the raw path exists to keep low.
func BenchmarkSend(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	b.Run("raw", func(b *testing.B) {
		c, _ := Config{Targets: []string{srv.URL}, RunID: "bench", MaxInFlight: 16}.withDefaults()
		g := &generator{cfg: c, work: newWorkload(c), client: &http.Client{Transport: NewTransport(16)}}
		g.window.latency = newHistogram()
		st := newStageStats()
		rng := rand.New(rand.NewPCG(1, 2))
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			g.send(op{seq: uint64(i), due: time.Now(), stage: st}, rng)
		}
		if st.ok != int64(b.N) {
			b.Fatalf("expected %d ok, found %d (errors %+v)", b.N, st.ok, st.errs)
		}
	})
	b.Run("client", func(b *testing.B) {
		c := client.New(srv.URL, client.WithRetries(0))
		ctx := context.Background()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			ev := []client.Event{{ID: "bench-" + strconv.Itoa(i), Entity: uint64(i%1000 + 1), Signal: "view", Weight: 1}}
			if _, err := c.WriteSignals(ctx, ev); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// --binary-vectors: the put's body is 1536
// little-endian float32s of a unit vector, the id in the query.
func TestEmbeddingBodyBinary(t *testing.T) {
	w := testWorkload(t, Config{EmbeddingDim: 1536, Seed: 7, BinaryVectors: true})
	rng := rand.New(rand.NewPCG(1, 2))
	method, url, body, size := w.request(4, kindWrite, rng)
	data, _ := io.ReadAll(body)
	if method != http.MethodPut || !strings.HasSuffix(url, "/embedding?id=run1-4") || len(data) != 4*1536 || int64(len(data)) != size {
		t.Fatalf("expected a PUT …/embedding?id=run1-4 with 6144 bytes, found %s %s with %d bytes (size %d)", method, url, len(data), size)
	}
	var sumSq float64
	for i := 0; i < len(data); i += 4 {
		x := float64(math.Float32frombits(binary.LittleEndian.Uint32(data[i:])))
		sumSq += x * x
	}
	if math.Abs(math.Sqrt(sumSq)-1) > 1e-3 || w.contentType() != "application/octet-stream" {
		t.Errorf("expected a unit vector sent as application/octet-stream, found norm %g and %q", math.Sqrt(sumSq), w.contentType())
	}
}
