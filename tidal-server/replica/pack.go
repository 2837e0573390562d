package replica

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"
)

// Packed proposals. With Config.PackProposals,
// proposals made on this node while another is being handed to raft are
// packed into one raft entry: one log entry, one WAL record, one
// replication message and one raft step for all of them, instead of one
// of each per write. There is no packing goroutine (a hand-off costs a
// scheduler slice on a loaded machine): the first proposer to find no
// pack in flight becomes the flusher, hands raft everything queued, and
// keeps flushing what queued meanwhile until the queue is empty. A lone
// proposal goes out as a plain envelope entry.
//
// The format is
//
//	u8 envelope | u64 origin node | u32 n | n × (u64 request id | u32 len | data)
//
// and every command of the entry is applied in order, at the entry's log
// index, as AppEntry{Sub: i, Subs: n, PackFormat: f}. There are two
// envelopes of this framing, which differ only in how the state machine
// places the commands inside the entry (AppEntry.PackFormat):
// packedSpansVersion, of entry format 3, and packedVersion, of entry
// format 2, whose rule the state machine keeps for entries written in it.
// A node packs with the newest envelope every current member advertised
// it reads (the minimum-entry-format rule, format.go): format 3, else
// format 2 — exactly what a node of the release before format 3 writes,
// so a mixed cluster applies every packed entry alike — else each command
// as its own format-1 entry. A release from before formats skipped
// unknown envelopes (and would diverge); it advertises nothing, so it
// counts as format 1 and is never sent a packed entry.
const (
	packedVersion      = 3 // entry format 2
	packedSpansVersion = 4 // entry format 3
	packedHeader       = 1 + 8 + 4
	packedItemHdr      = 8 + 4
	// maxPackBytes bounds one packed entry's size: well under
	// MaxSizePerMsg's default (1 MiB), and, at ≥ 28 bytes per encoded
	// event, far under ledger.MaxBatchLen events.
	maxPackBytes = 512 << 10
)

type packItem struct {
	req  uint64
	data []byte
	errc chan error // buffered: the flusher never blocks on it
}

type packer struct {
	mu      sync.Mutex
	pending []packItem
	busy    bool // a flusher is handing packs to raft
}

// proposePacked queues a proposal (its waiter already registered) and,
// when no flusher is active, flushes. It returns the channel on which a
// failure to hand the proposal to raft arrives.
func (r *Replica) proposePacked(req uint64, data []byte) chan error {
	errc := make(chan error, 1)
	p := &r.pack
	p.mu.Lock()
	p.pending = append(p.pending, packItem{req: req, data: data, errc: errc})
	lead := !p.busy
	p.busy = true
	p.mu.Unlock()
	if lead {
		r.flushPacks()
	}
	return errc
}

// packHandoffTimeout bounds how long the flusher waits for raft to take
// one pack. raft takes a proposal at once while it knows a leader (and
// Propose refuses at once while it knows none); the bound only matters
// across a leader change, when the pack's writes end as unknown outcomes,
// like a single proposal whose deadline passed inside node.Propose.
const packHandoffTimeout = 10 * time.Second

// flushPacks hands raft everything queued, one pack at a time, until the
// queue is empty. It does not use the flusher's own request context: a
// client that gave up must not fail the other writes of its pack, nor the
// packs after it.
func (r *Replica) flushPacks() {
	p := &r.pack
	for {
		p.mu.Lock()
		if len(p.pending) == 0 {
			p.busy = false
			p.mu.Unlock()
			return
		}
		n, size := 0, packedHeader
		for n < len(p.pending) && (n == 0 || size+packedItemHdr+len(p.pending[n].data) <= maxPackBytes) {
			size += packedItemHdr + len(p.pending[n].data)
			n++
		}
		items := p.pending[:n:n]
		p.pending = append([]packItem(nil), p.pending[n:]...)
		p.mu.Unlock()

		var envelope byte
		if len(items) > 1 {
			envelope = packedEnvelope(r.ClusterEntryFormat())
		}
		if len(items) > 1 && envelope == 0 {
			// A member may not read packed entries (an older release, or
			// one not heard from yet): the format-1 equivalent, one entry
			// per proposal.
			for _, it := range items {
				ctx, cancel := context.WithTimeout(r.haltCtx, packHandoffTimeout)
				err := r.node.Propose(ctx, r.envelope(it.req, it.data))
				cancel()
				if err != nil {
					it.errc <- r.proposeErr(err)
				}
			}
			continue
		}
		var buf []byte
		if len(items) == 1 {
			buf = r.envelope(items[0].req, items[0].data)
		} else {
			buf = make([]byte, 0, size)
			buf = append(buf, envelope)
			buf = binary.BigEndian.AppendUint64(buf, r.cfg.ID)
			buf = binary.BigEndian.AppendUint32(buf, uint32(len(items)))
			for _, it := range items {
				buf = binary.BigEndian.AppendUint64(buf, it.req)
				buf = binary.BigEndian.AppendUint32(buf, uint32(len(it.data)))
				buf = append(buf, it.data...)
			}
		}
		r.metrics.PackSize.Observe(float64(len(items)))
		ctx, cancel := context.WithTimeout(r.haltCtx, packHandoffTimeout)
		err := r.node.Propose(ctx, buf)
		cancel()
		if err != nil {
			perr := r.proposeErr(err)
			for _, it := range items {
				it.errc <- perr
			}
		}
	}
}

// packedEnvelope is the packed envelope to write while every current
// member reads entry formats up to cluster (ClusterEntryFormat): format
// 3's; format 2's while a member reads no newer (a node of the release
// before format 3, which writes format 2 itself: every node applies those
// entries under format 2's rule); 0, none, while a member reads neither.
func packedEnvelope(cluster uint32) byte {
	switch {
	case cluster >= PackedSpansEntryFormat:
		return packedSpansVersion
	case cluster >= PackedEntryFormat:
		return packedVersion
	}
	return 0
}

// envelope frames one proposal as a version-1 entry.
func (r *Replica) envelope(req uint64, data []byte) []byte {
	buf := make([]byte, envelopeHeader+len(data))
	buf[0] = envelopeVersion
	binary.BigEndian.PutUint64(buf[1:], r.cfg.ID)
	binary.BigEndian.PutUint64(buf[9:], req)
	copy(buf[envelopeHeader:], data)
	return buf
}

// isPacked reports whether envelope is one of the packed envelopes.
func isPacked(envelope byte) bool {
	return envelope == packedVersion || envelope == packedSpansVersion
}

// unpack appends the commands of a packed entry to run, each with the
// entry format of the envelope (AppEntry.PackFormat), or reports why the
// entry is malformed (then nothing is appended).
func unpack(run []pendingApp, index, term uint64, data []byte) ([]pendingApp, error) {
	if len(data) < packedHeader || !isPacked(data[0]) {
		return run, fmt.Errorf("packed entry of %d bytes: header too short or not a packed envelope", len(data))
	}
	format := envelopeFormats[data[0]]
	origin := binary.BigEndian.Uint64(data[1:9])
	n := binary.BigEndian.Uint32(data[9:13])
	if n == 0 || uint64(n)*packedItemHdr > uint64(len(data)-packedHeader) {
		return run, fmt.Errorf("packed entry of %d bytes claims %d commands", len(data), n)
	}
	start := len(run)
	off := packedHeader
	for i := range int(n) {
		if len(data)-off < packedItemHdr {
			return run[:start], fmt.Errorf("packed entry: command %d of %d truncated at offset %d", i, n, off)
		}
		req := binary.BigEndian.Uint64(data[off:])
		size := int(binary.BigEndian.Uint32(data[off+8:]))
		off += packedItemHdr
		if size > len(data)-off {
			return run[:start], fmt.Errorf("packed entry: command %d of %d claims %d bytes at offset %d, %d left", i, n, size, off, len(data)-off)
		}
		run = append(run, pendingApp{
			AppEntry: AppEntry{Index: index, Term: term, Data: data[off : off+size : off+size], Sub: i, Subs: int(n), PackFormat: format},
			origin:   origin,
			request:  req,
		})
		off += size
	}
	if off != len(data) {
		return run[:start], fmt.Errorf("packed entry: %d trailing bytes after %d commands", len(data)-off, n)
	}
	return run, nil
}
