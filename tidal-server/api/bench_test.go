package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// ackBackend acknowledges every write at once and folds nothing, so a
// benchmark through it times the API layer alone: content-type and size
// checks, decoding, validation, stamping, the in-flight bound, metrics.
type ackBackend struct{ fakeBackend }

func (a *ackBackend) WriteSignals(ctx context.Context, events []ledger.Event) (WriteAck, error) {
	return WriteAck{Index: 1, Term: 1, Node: 1}, nil
}
func (a *ackBackend) CheckSignals(events []ledger.Event) error             { return nil }
func (a *ackBackend) Read(fn func(*ledger.Ledger, *vectors.Store, uint64)) {}
func (a *ackBackend) Status() replica.Status                               { return replica.Status{} }

// BenchmarkPostSignals posts 100-event batches (the ingestion target's
// request shape) through the handler in-process and reports events/s: the
// API layer's own ceiling, before the log, fsync or replication.
func BenchmarkPostSignals(b *testing.B) {
	const perBatch = 100
	be := &ackBackend{fakeBackend: *newFake(ledger.DefaultSchema())}
	h := New(be, Options{})
	bodies := make([][]byte, 64)
	for i := range bodies {
		var buf bytes.Buffer
		buf.WriteString(`{"events":[`)
		for j := 0; j < perBatch; j++ {
			if j > 0 {
				buf.WriteByte(',')
			}
			fmt.Fprintf(&buf, `{"id":"bench-%d-%d","entity":%d,"signal":"view","weight":1.5,"ts":1700000000%03d}`, i, j, 1000+i*perBatch+j, j)
		}
		buf.WriteString(`]}`)
		bodies[i] = buf.Bytes()
	}
	b.SetBytes(int64(len(bodies[0])))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/v1/signals", bytes.NewReader(bodies[i%len(bodies)]))
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != http.StatusNoContent {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
			i++
		}
	})
	b.ReportMetric(float64(b.N*perBatch)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N*perBatch), "cpu-ns/event")
}

// BenchmarkDecodeSignals times DecodeSignals alone on a 100-event batch
// and reports ns/event: the decoding and validation share of the above.
func BenchmarkDecodeSignals(b *testing.B) {
	const perBatch = 100
	var buf bytes.Buffer
	buf.WriteString(`{"events":[`)
	for j := 0; j < perBatch; j++ {
		if j > 0 {
			buf.WriteByte(',')
		}
		fmt.Fprintf(&buf, `{"id":"bench-%d","entity":%d,"signal":"view","weight":1.5,"ts":1700000000%03d}`, j, 1000+j, j)
	}
	buf.WriteString(`]}`)
	body, schema := buf.Bytes(), ledger.DefaultSchema()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	cpu0 := processCPU()
	for b.Loop() {
		if _, err := DecodeSignals(body, schema, 10000); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perBatch), "ns/event")
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N*perBatch), "cpu-ns/event")
}

// processCPU is the user + system CPU time this process has used: on the
// shared 2-core machine wall-clock ns/op swings several-fold with other
// engineers' load, CPU time per op far less.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecodeVector decodes one 1536-dim vector as the JSON an
// embedding put carries (5 significant digits, as tidal-stress sends) and
// as application/octet-stream.
func BenchmarkDecodeVector(b *testing.B) {
	const dim = 1536
	var js bytes.Buffer
	js.WriteString(`{"vector":[`)
	bin := make([]byte, 0, 4*dim)
	for i := range dim {
		if i > 0 {
			js.WriteByte(',')
		}
		x := float32(i%97)/97 - 0.5
		fmt.Fprintf(&js, "%.5g", x)
		bin = binary.LittleEndian.AppendUint32(bin, math.Float32bits(x))
	}
	js.WriteString(`]}`)
	b.Run("json", func(b *testing.B) {
		body := js.Bytes()
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			err := decodeBody(body, func(d *decoder, name []byte) error {
				_, err := d.vector("vector", dim)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("binary", func(b *testing.B) {
		b.SetBytes(int64(len(bin)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := binaryVector(bin, dim); err != nil {
				b.Fatal(err)
			}
		}
	})
}
