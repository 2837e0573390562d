package peer

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

// countingGroup is a Handler with node ids as raft ids that counts what
// reaches it into a counter shared by all groups.
type countingGroup struct{ n *atomic.Int64 }

func (c countingGroup) Receive(context.Context, []byte) error { c.n.Add(1); return nil }
func (countingGroup) ReportUnreachable(uint64)                {}
func (countingGroup) ReportSnapshot(uint64, bool)             {}
func (countingGroup) NodeOf(id uint64) (uint64, bool)         { return id, true }

// byteListener counts the bytes read on the connections it accepts.
type byteListener struct {
	net.Listener
	read atomic.Int64
}

func (l *byteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &byteConn{Conn: c, n: &l.read}, nil
}

type byteConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *byteConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// BenchmarkGroupsOneConnection streams heartbeats from node 1 to node 2
// over loopback (plaintext), round-robin over 1 or 64 groups sharing the
// one connection, through the whole receive path. One op is one message.
// Reported: frames/s and messages per frame (how well the sender
// coalesces across groups), and bytes per message on the wire (gRPC,
// HTTP/2 and frame overhead included) and in the frame alone. Heartbeats
// are the smallest raft messages, so framing overhead shows most here.
func BenchmarkGroupsOneConnection(b *testing.B) {
	for _, groups := range []int{1, 64} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			view := members([]uint64{1, 2})
			var got atomic.Int64
			t1 := benchNode(b, 1, Options{Membership: view}, &countingInbound{done: make(chan struct{}, 1)})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			bl := &byteListener{Listener: lis}
			t2, err := New(2, &countingInbound{done: make(chan struct{}, 1)},
				Options{Membership: view, SpoolDir: filepath.Join(b.TempDir(), "spool")}, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			go t2.Serve(bl)
			defer t2.Stop()
			senders := make([]replica.Transport, groups)
			for g := range groups {
				id := uint64(g + 1)
				t2.Register(id, countingGroup{&got})
				senders[g] = t1.Register(id, countingGroup{new(atomic.Int64)})
			}
			t1.SetPeer(2, lis.Addr().String())
			hb := marshal(b, heartbeat(1, 2, 7))
			out := []replica.Outbound{{To: 2, Data: hb}}
			// Warm up: every group's first message through (so the
			// peer's answer is in), then count from zero.
			for _, s := range senders {
				s.Send(out)
			}
			for got.Load() < int64(groups) {
				time.Sleep(100 * time.Microsecond)
			}
			frames0, bytes0 := histCount(t1.metrics.batchSize.WithLabelValues("2")), bl.read.Load()
			got.Store(0)

			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				senders[i%groups].Send(out)
				// Stay under the sender's queue (4096): a full queue drops.
				for int64(i)-got.Load() > 2048 {
					time.Sleep(10 * time.Microsecond)
				}
			}
			for got.Load() < int64(b.N) {
				time.Sleep(10 * time.Microsecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			frames := histCount(t1.metrics.batchSize.WithLabelValues("2")) - frames0
			wire := bl.read.Load() - bytes0
			b.ReportMetric(float64(frames)/elapsed.Seconds(), "frames/s")
			b.ReportMetric(float64(b.N)/float64(frames), "msgs/frame")
			b.ReportMetric(float64(wire)/float64(b.N), "wireB/msg")
			// The frame alone, at the batch size seen.
			per := max(1, b.N/int(frames))
			batch := make([]outMsg, per)
			for i := range batch {
				batch[i] = outMsg{group: uint64(i%groups + 1), to: 2, data: hb}
			}
			b.ReportMetric(float64(len(encodeFrame(batch)))/float64(per), "frameB/msg")
		})
	}
}

func histCount(o prometheus.Observer) uint64 {
	var d dto.Metric
	if err := o.(prometheus.Metric).Write(&d); err != nil {
		panic(err)
	}
	return d.GetHistogram().GetSampleCount()
}

// BenchmarkFrameCodec encodes and decodes a frame of 64 heartbeats of 1
// group (the legacy format) or of 64 groups (the grouped format).
func BenchmarkFrameCodec(b *testing.B) {
	hb := marshal(b, heartbeat(1, 2, 7))
	for _, groups := range []int{1, 64} {
		b.Run(fmt.Sprintf("groups=%d", groups), func(b *testing.B) {
			batch := make([]outMsg, 64)
			for i := range batch {
				batch[i] = outMsg{group: uint64(i%groups + 1), to: 2, data: hb}
			}
			b.ReportMetric(float64(len(encodeFrame(batch)))/float64(len(batch)), "frameB/msg")
			b.ReportAllocs()
			for range b.N {
				if _, err := decodeFrame(encodeFrame(batch)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
