package sched_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/shard/sched"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The benchmarks measure what a node's groups cost at rest and under a
// little load: 1,000 groups registered, one Tick per cycle (a node ticks
// at 10/s), and report the process's CPU time per cycle (user + system,
// from getrusage: the workers, the ticker and the garbage collector) and
// that cost as a share of one core at 10 cycles a second.
//
//	go test -run '^$' -bench 'TickCycle|AtRest' -benchtime 50x ./tidal-server/shard/sched/

const benchGroups = 1000

type benchCase struct {
	name      string
	busy      int  // groups that get a message every cycle
	quiescent int  // groups quiesced up front (the last ones)
	raft      bool // each group is a raft leader of three voters
}

var benchCases = []benchCase{
	{name: "quiescent=1000", quiescent: 1000},
	{name: "active=1000"},
	{name: "busy=64,quiescent=936", busy: 64, quiescent: 936},
	{name: "raft/quiescent=1000", quiescent: 1000, raft: true},
	{name: "raft/active=1000", raft: true},
	{name: "raft/busy=64,quiescent=936", busy: 64, quiescent: 936, raft: true},
}

// benchNode is a scheduler with benchGroups groups and a handler that
// counts its calls down on wg.
type benchNode struct {
	s     *sched.Scheduler
	wg    sync.WaitGroup
	rafts []*leader // per group when the case is raft
}

func newBenchNode(b *testing.B, c benchCase) *benchNode {
	n := &benchNode{}
	if c.raft {
		n.rafts = make([]*leader, benchGroups)
		for i := range n.rafts {
			n.rafts[i] = newLeader(b)
		}
	}
	n.s = sched.New(sched.HandlerFunc(func(group uint64, w sched.Work) {
		if n.rafts != nil {
			n.rafts[group].process(b, w)
		}
		n.wg.Done()
	}), sched.Config{})
	for id := range uint64(benchGroups) {
		if err := n.s.Register(id); err != nil {
			b.Fatal(err)
		}
	}
	for id := benchGroups - c.quiescent; id < benchGroups; id++ {
		if !n.s.Quiesce(uint64(id)) {
			b.Fatalf("Quiesce of idle group %d refused", id)
		}
	}
	return n
}

// cycle is one tick interval's work: a message to each busy group, then
// the node's Tick, each waited for.
func (n *benchNode) cycle(c benchCase) {
	if c.busy > 0 {
		n.wg.Add(c.busy)
		for id := range uint64(c.busy) {
			n.s.Enqueue(id, sched.Message)
		}
		n.wg.Wait()
	}
	if active := benchGroups - c.quiescent; active > 0 {
		n.wg.Add(active)
	}
	n.s.Tick()
	n.wg.Wait()
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func report(b *testing.B, cpu time.Duration) {
	perCycle := float64(cpu.Nanoseconds()) / float64(b.N)
	b.ReportMetric(perCycle, "cpu-ns/cycle")
	// 10 cycles a second: perCycle·10 ns of CPU per 1e9 ns, in percent.
	b.ReportMetric(perCycle*10/1e9*100, "%core@10Hz")
}

// BenchmarkTickCycle runs cycles back to back: the CPU one cycle costs.
func BenchmarkTickCycle(b *testing.B) {
	for _, c := range benchCases {
		b.Run(c.name, func(b *testing.B) {
			n := newBenchNode(b, c)
			defer n.s.Stop()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime(b)
			for range b.N {
				n.cycle(c)
			}
			cpu := cpuTime(b) - cpu0
			b.StopTimer()
			report(b, cpu)
		})
	}
}

// BenchmarkAtRest10Hz runs the cycles on a real 100ms ticker, as a node
// does, so the CPU measured includes the idle process around them; each
// iteration is one tick interval (so -benchtime 50x is five seconds).
func BenchmarkAtRest10Hz(b *testing.B) {
	for _, c := range benchCases {
		if c.busy > 0 {
			continue
		}
		b.Run(c.name, func(b *testing.B) {
			n := newBenchNode(b, c)
			defer n.s.Stop()
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			b.ResetTimer()
			cpu0 := cpuTime(b)
			for range b.N {
				<-t.C
				n.cycle(c)
			}
			cpu := cpuTime(b) - cpu0
			b.StopTimer()
			report(b, cpu)
		})
	}
}

// leader is one raft group as this node's replica sees it at rest: the
// leader of three voters whose followers answer every heartbeat and
// acknowledge every append, the answers stepped at once (no transport, no
// disk: the scheduler's and raft's CPU only).
type leader struct {
	rn      *raft.RawNode
	storage *raft.MemoryStorage
}

func newLeader(b *testing.B) *leader {
	ms := raft.NewMemoryStorage()
	snap := &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1),
		ConfState: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}
	if err := ms.ApplySnapshot(snap); err != nil {
		b.Fatal(err)
	}
	rn, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: ms,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, CheckQuorum: true, Logger: discardLogger{}})
	if err != nil {
		b.Fatal(err)
	}
	l := &leader{rn: rn, storage: ms}
	if err := rn.Campaign(); err != nil {
		b.Fatal(err)
	}
	l.drain(b)
	if st := rn.BasicStatus(); st.RaftState != raft.StateLeader {
		b.Fatalf("benchmark group did not become leader: %v at term %d", st.RaftState, st.Term)
	}
	return l
}

// process is the group's ProcessGroup: a message is a proposal, ticks are
// ticked, and the Ready handled until there is none.
func (l *leader) process(b *testing.B, w sched.Work) {
	if w.Flags&sched.Message != 0 {
		if err := l.rn.Propose(make([]byte, 64)); err != nil {
			b.Fatal(err)
		}
	}
	for range w.Ticks {
		l.rn.Tick()
	}
	l.drain(b)
}

// drain handles Readies, answering for the followers, until raft has
// nothing more.
func (l *leader) drain(b *testing.B) {
	for l.rn.HasReady() {
		rd := l.rn.Ready()
		if !raft.IsEmptyHardState(rd.HardState) {
			if err := l.storage.SetHardState(rd.HardState); err != nil {
				b.Fatal(err)
			}
		}
		if err := l.storage.Append(rd.Entries); err != nil {
			b.Fatal(err)
		}
		var answers []*raftpb.Message
		for _, m := range rd.Messages {
			var typ raftpb.MessageType
			switch m.GetType() {
			case raftpb.MsgVote:
				typ = raftpb.MsgVoteResp
			case raftpb.MsgHeartbeat:
				typ = raftpb.MsgHeartbeatResp
			case raftpb.MsgApp:
				typ = raftpb.MsgAppResp
			default:
				continue
			}
			a := &raftpb.Message{Type: typ.Enum(), From: proto.Uint64(m.GetTo()), To: proto.Uint64(1), Term: proto.Uint64(m.GetTerm())}
			if typ == raftpb.MsgAppResp {
				last := m.GetIndex()
				if ents := m.GetEntries(); len(ents) > 0 {
					last = ents[len(ents)-1].GetIndex()
				}
				a.Index = proto.Uint64(last)
			}
			answers = append(answers, a)
		}
		l.rn.Advance(rd)
		for _, a := range answers {
			if err := l.rn.Step(a); err != nil {
				b.Fatal(err)
			}
		}
		if len(rd.CommittedEntries) > 0 {
			// Keep the in-memory log short: applied entries are not needed.
			last := rd.CommittedEntries[len(rd.CommittedEntries)-1].GetIndex()
			if err := l.storage.Compact(last); err != nil && err != raft.ErrCompacted {
				b.Fatal(err)
			}
		}
	}
}

type discardLogger struct{}

func (discardLogger) Debug(...any)              {}
func (discardLogger) Debugf(string, ...any)     {}
func (discardLogger) Error(...any)              {}
func (discardLogger) Errorf(string, ...any)     {}
func (discardLogger) Info(...any)               {}
func (discardLogger) Infof(string, ...any)      {}
func (discardLogger) Warning(...any)            {}
func (discardLogger) Warningf(string, ...any)   {}
func (discardLogger) Fatal(v ...any)            { panic(fmt.Sprint(v...)) }
func (discardLogger) Fatalf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
func (discardLogger) Panic(v ...any)            { panic(fmt.Sprint(v...)) }
func (discardLogger) Panicf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }

// BenchmarkAtRest10HzTickerPerGroup is the design the scheduler replaces,
// for comparison: a goroutine and a 100ms ticker per group, each tick
// handled with the same trivial work (a counter) as active=1000.
func BenchmarkAtRest10HzTickerPerGroup(b *testing.B) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	counts := make([]int, benchGroups)
	for i := range benchGroups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					counts[i]++
				case <-stop:
					return
				}
			}
		}()
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	b.ResetTimer()
	cpu0 := cpuTime(b)
	for range b.N {
		<-t.C
	}
	cpu := cpuTime(b) - cpu0
	b.StopTimer()
	close(stop)
	wg.Wait()
	report(b, cpu)
}

// BenchmarkEnqueue is the message path's scheduling cost: Enqueue of one
// of 1,000 groups from parallel senders (as the transport's receivers
// are), each processed by a trivial handler, per Enqueue.
func BenchmarkEnqueue(b *testing.B) {
	s := sched.New(sched.HandlerFunc(func(uint64, sched.Work) {}), sched.Config{})
	for id := range uint64(benchGroups) {
		if err := s.Register(id); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := next.Add(7919)
		for pb.Next() {
			id += 7919
			s.Enqueue(id%benchGroups, sched.Message)
		}
	})
	s.Stop()
	b.StopTimer()
	st := s.Stats()
	b.ReportMetric(float64(st.Processed)/float64(b.N), "calls/enqueue")
}
