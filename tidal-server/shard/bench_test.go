package shard

import "testing"

var sinkSlot Slot

func BenchmarkSlotOf(b *testing.B) {
	var s Slot
	for i := 0; i < b.N; i++ {
		s ^= SlotOf(uint64(i))
	}
	sinkSlot = s
}

func BenchmarkGroupOf(b *testing.B) {
	m, err := Bootstrap(64, 3, []NodeID{1, 2, 3, 4, 5, 6, 7, 8, 9})
	if err != nil {
		b.Fatal(err)
	}
	var g GroupID
	for i := 0; i < b.N; i++ {
		g ^= m.GroupOf(uint64(i))
	}
	sinkSlot = Slot(g)
}

// BenchmarkSplitBatch splits a batch of 100 events' entity ids, the
// request splitter's work per write.
func BenchmarkSplitBatch(b *testing.B) {
	for _, s := range []struct {
		name   string
		shards int
	}{{"shards=1", 1}, {"shards=6", 6}, {"shards=64", 64}} {
		b.Run(s.name, func(b *testing.B) {
			m, err := Bootstrap(s.shards, 3, []NodeID{1, 2, 3, 4, 5, 6})
			if err != nil {
				b.Fatal(err)
			}
			batch := make([]uint64, 100)
			for i := range batch {
				batch[i] = uint64(i) * 7919
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if parts := m.SplitBatch(batch); len(parts) == 0 {
					b.Fatal("no parts")
				}
			}
		})
	}
}
