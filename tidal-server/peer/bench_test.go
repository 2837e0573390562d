package peer

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// countingInbound counts what reaches raft and signals when it has want.
type countingInbound struct {
	n    atomic.Int64
	want atomic.Int64
	done chan struct{}
}

func (c *countingInbound) Receive(context.Context, []byte) error {
	if c.n.Add(1) == c.want.Load() {
		c.done <- struct{}{}
	}
	return nil
}
func (c *countingInbound) ReportUnreachable(uint64)         {}
func (c *countingInbound) ReportSnapshot(uint64, bool)      {}
func (c *countingInbound) MemberStatus(uint64) (bool, bool) { return false, false }
func (c *countingInbound) ReportRemoved(uint64)             {}

// BenchmarkTransport streams 1 KiB-entry appends (16 entries each) from
// member 1 to member 2 over loopback, plaintext and mutual TLS, through
// the whole receive path (batch decode, header scan, admission). The
// difference is the cost of TLS on the peer plane.
func BenchmarkTransport(b *testing.B) {
	for _, mode := range []string{"plaintext", "tls"} {
		b.Run(mode, func(b *testing.B) {
			view := members([]uint64{1, 2})
			o1, o2 := Options{Membership: view}, Options{Membership: view}
			if mode == "tls" {
				p := newPKI(b)
				o1, o2 = p.secured(b, 1, o1), p.secured(b, 2, o2)
			}
			in := &countingInbound{done: make(chan struct{}, 1)}
			t1 := benchNode(b, 1, o1, &countingInbound{done: make(chan struct{}, 1)})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			o2.SpoolDir = filepath.Join(b.TempDir(), "spool")
			t2, err := New(2, in, o2, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			go t2.Serve(lis)
			defer t2.Stop()
			t1.SetPeer(2, lis.Addr().String())

			msg := marshal(b, appendMessage(16, 1024))
			out := []replica.Outbound{{To: 2, Data: msg}}
			// Warm the connection up.
			in.want.Store(1)
			t1.Send(out)
			<-in.done
			in.n.Store(0)

			b.SetBytes(int64(len(msg)))
			b.ResetTimer()
			in.want.Store(int64(b.N))
			for i := 0; i < b.N; i++ {
				t1.Send(out)
				// Stay under the sender's queue (4096): a full queue drops.
				for int64(i)-in.n.Load() > 2048 {
					time.Sleep(10 * time.Microsecond)
				}
			}
			<-in.done
		})
	}
}

func benchNode(b *testing.B, id uint64, opts Options, in *countingInbound) *Transport {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	opts.SpoolDir = filepath.Join(b.TempDir(), "spool")
	tr, err := New(id, in, opts, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	go tr.Serve(lis)
	b.Cleanup(tr.Stop)
	return tr
}
