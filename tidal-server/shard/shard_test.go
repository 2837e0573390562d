package shard

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestSlotOfIsFixed pins SlotOf: the slot of an entity is part of the
// data format, so these values hold on every build for ever.
func TestSlotOfIsFixed(t *testing.T) {
	// SplitMix64's first output for seed 0 is the finalizer applied to
	// the golden gamma: the mix is the published one, not a look-alike.
	if got := mix64(0x9e3779b97f4a7c15); got != 0xe220a8397b1dcdaf {
		t.Fatalf("mix64(golden gamma) = %#x, expected SplitMix64's first output %#x", got, uint64(0xe220a8397b1dcdaf))
	}
	for _, c := range []struct {
		entity uint64
		slot   Slot
	}{
		{0, 0}, {1, 1385}, {2, 3517}, {3, 485}, {7, 298}, {42, 2677}, {1000, 3097},
		{1 << 32, 3458}, {1 << 63, 604}, {^uint64(0), 2893},
	} {
		if got := SlotOf(c.entity); got != c.slot {
			t.Errorf("SlotOf(%d) = %d, expected %d: the slot hash changed, which moves stored entities between groups", c.entity, got, c.slot)
		}
	}
}

// TestSlotOfSpreadsSequentialIDs: 64 ids a slot on average for the ids
// 0..NumSlots·64; every slot gets between half and twice that. (A
// binomial count of mean 64 leaves [32, 128] with probability ~1e-5 per
// slot; the check is deterministic, the bound only says what "even" is.)
func TestSlotOfSpreadsSequentialIDs(t *testing.T) {
	const per = 64
	for _, base := range []uint64{0, 1 << 40, 1e12} {
		var counts [NumSlots]int
		for e := base; e < base+NumSlots*per; e++ {
			counts[SlotOf(e)]++
		}
		lo, hi := slices.Min(counts[:]), slices.Max(counts[:])
		if lo < per/2 || hi > per*2 {
			t.Errorf("ids %d..%d: slot counts range %d..%d, expected within [%d, %d]", base, base+NumSlots*per, lo, hi, per/2, per*2)
		}
	}
}

// checkPlacement returns why m is not a balanced bootstrap placement of
// S groups of R replicas on nodes, or nil. It is the property
// TestBootstrapPlacement holds Bootstrap to; TestCheckPlacementSaysFalse
// shows it catches broken placements.
func checkPlacement(m *Map, S, R int, nodes []NodeID) error {
	if err := m.Validate(); err != nil {
		return err
	}
	N := len(nodes)
	if len(m.Groups) != S || m.ReplicationFactor != R || len(m.Nodes) != N {
		return fmt.Errorf("%d groups, R=%d, %d nodes, expected %d, %d, %d", len(m.Groups), m.ReplicationFactor, len(m.Nodes), S, R, N)
	}
	// Every slot owned once, by the group whose range holds it.
	owners := make([]int, NumSlots)
	for _, g := range m.Groups {
		for s := g.Start; s < g.End; s++ {
			owners[s]++
		}
	}
	for s, n := range owners {
		if n != 1 {
			return fmt.Errorf("slot %d owned by %d groups, expected 1", s, n)
		}
		if g, _ := m.Group(m.GroupOfSlot(Slot(s))); Slot(s) < g.Start || Slot(s) >= g.End {
			return fmt.Errorf("GroupOfSlot(%d) = group %d, whose range [%d,%d) does not hold it", s, g.ID, g.Start, g.End)
		}
	}
	minSize, maxSize := NumSlots, 0
	for _, g := range m.Groups {
		minSize, maxSize = min(minSize, g.Slots()), max(maxSize, g.Slots())
		if len(g.Replicas) != R || len(g.Voters()) != R {
			return fmt.Errorf("group %d has %d replicas (%d voters), expected %d voters", g.ID, len(g.Replicas), len(g.Voters()), R)
		}
	}
	if maxSize-minSize > 1 {
		return fmt.Errorf("group sizes range %d..%d slots, expected to differ by at most 1", minSize, maxSize)
	}
	for _, n := range m.Nodes {
		reps, leads := len(m.GroupsOn(n)), 0
		for _, g := range m.Groups {
			if g.Leader == n {
				leads++
			}
		}
		if reps < S*R/N || reps > (S*R+N-1)/N {
			return fmt.Errorf("node %d holds %d replicas, expected %d..%d", n, reps, S*R/N, (S*R+N-1)/N)
		}
		if leads < S/N || leads > (S+N-1)/N {
			return fmt.Errorf("node %d leads %d groups, expected %d..%d", n, leads, S/N, (S+N-1)/N)
		}
	}
	return nil
}

func seqNodes(n int, base NodeID) []NodeID {
	out := make([]NodeID, n)
	for i := range out {
		out[i] = base + NodeID(i)*base
	}
	return out
}

// TestBootstrapPlacement: for S in 1..64, R in 1..5, N in R..12, the
// placement is valid and balanced (checkPlacement), and the same for any
// order of the nodes (byte-equal encodings).
func TestBootstrapPlacement(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := 0
	for R := 1; R <= 5; R++ {
		for N := R; N <= 12; N++ {
			for S := 1; S <= 64; S++ {
				nodes := seqNodes(N, 3)
				m, err := Bootstrap(S, R, nodes)
				if err != nil {
					t.Fatalf("Bootstrap(S=%d, R=%d, N=%d): %v", S, R, N, err)
				}
				if err := checkPlacement(&m, S, R, nodes); err != nil {
					t.Fatalf("Bootstrap(S=%d, R=%d, N=%d): %v\n%s", S, R, N, err, table(&m))
				}
				shuffled := slices.Clone(nodes)
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				again, err := Bootstrap(S, R, shuffled)
				if err != nil || !bytes.Equal(again.Encode(), m.Encode()) {
					t.Fatalf("Bootstrap(S=%d, R=%d) on nodes %v and %v: different maps (%v)", S, R, nodes, shuffled, err)
				}
				cases++
			}
		}
	}
	t.Logf("%d placements checked", cases)
}

// TestBootstrapPlacementLarge: a few large shapes, up to the slot
// count (every group one slot).
func TestBootstrapPlacementLarge(t *testing.T) {
	for _, c := range []struct{ S, R, N int }{{1000, 3, 7}, {NumSlots, 3, 10}, {NumSlots, 1, 1}, {257, 5, 31}, {100, 3, 100}} {
		nodes := seqNodes(c.N, 1)
		m, err := Bootstrap(c.S, c.R, nodes)
		if err != nil {
			t.Fatalf("Bootstrap(%+v): %v", c, err)
		}
		if err := checkPlacement(&m, c.S, c.R, nodes); err != nil {
			t.Fatalf("Bootstrap(%+v): %v", c, err)
		}
	}
}

// TestCheckPlacementSaysFalse: the placement property catches a leader
// piled on one node, a replica moved to unbalance nodes, and uneven
// slot ranges.
func TestCheckPlacementSaysFalse(t *testing.T) {
	nodes := seqNodes(6, 1)
	good, err := Bootstrap(6, 3, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkPlacement(&good, 6, 3, nodes); err != nil {
		t.Fatalf("the good placement fails: %v", err)
	}
	for _, c := range []struct {
		name string
		edit func(m *Map)
		want string
	}{
		{"leaders piled up", func(m *Map) { m.Groups[2].Leader = 1 }, "leads 2 groups, expected 1..1"},
		{"replica moved", func(m *Map) {
			// group 2 is on 4,5,6: move its replica on 6 to 1.
			m.Groups[1].Replicas = []Replica{{1, 1, Voter}, {4, 4, Voter}, {5, 5, Voter}}
		}, "holds 4 replicas, expected 3..3"},
		{"uneven ranges", func(m *Map) { m.Groups[0].End, m.Groups[1].Start = 600, 600 }, "group sizes range 600..765"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := good.clone()
			c.edit(&m)
			err := checkPlacement(&m, 6, 3, nodes)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("checkPlacement = %v, expected an error containing %q", err, c.want)
			}
		})
	}
}

// TestBootstrapSingleShardIsTodaysGroup: --shards 1 with R = N is group 1
// owning every slot with every node a voter whose raft id is its node id.
func TestBootstrapSingleShardIsTodaysGroup(t *testing.T) {
	for N := 1; N <= 7; N++ {
		nodes := seqNodes(N, 1)
		m, err := Bootstrap(1, N, nodes)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Groups) != 1 {
			t.Fatalf("N=%d: %d groups, expected 1", N, len(m.Groups))
		}
		g := m.Groups[0]
		if g.ID != 1 || g.Start != 0 || g.End != NumSlots || g.Leader != nodes[0] {
			t.Fatalf("N=%d: group %d [%d,%d) leader %d, expected group 1 [0,%d) leader %d", N, g.ID, g.Start, g.End, g.Leader, NumSlots, nodes[0])
		}
		for i, r := range g.Replicas {
			if r.Node != nodes[i] || r.ID != ReplicaID(nodes[i]) || r.Role != Voter {
				t.Fatalf("N=%d: replica %d is %+v, expected a voter on node %d with raft id %d", N, i, r, nodes[i], nodes[i])
			}
		}
	}
}

func TestBootstrapErrors(t *testing.T) {
	for _, c := range []struct {
		S, R  int
		nodes []NodeID
		want  string
	}{
		{1, 4, []NodeID{1, 2, 3}, "replication factor 4, expected 1..3"},
		{1, 0, []NodeID{1}, "replication factor 0, expected 1..1"},
		{0, 1, []NodeID{1}, "0 shards, expected 1..4096"},
		{NumSlots + 1, 1, []NodeID{1}, "4097 shards"},
		{1, 1, nil, "no nodes"},
		{2, 1, []NodeID{3, 1, 3}, "node 3 listed twice"},
		{2, 1, []NodeID{0, 1}, "node id 0"},
	} {
		_, err := Bootstrap(c.S, c.R, c.nodes)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Bootstrap(%d, %d, %v) = %v, expected an error containing %q", c.S, c.R, c.nodes, err, c.want)
		}
	}
}

// changes applies every kind of change once to a 3-group map on 4 nodes,
// in an order where each succeeds, returning the maps in order.
func changes(t *testing.T) []Map {
	t.Helper()
	m, err := Bootstrap(3, 3, []NodeID{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	steps := []func(m *Map) (Map, error){
		func(m *Map) (Map, error) { return m.AddNode(4) },
		func(m *Map) (Map, error) { return m.AddLearner(1, 4) },
		func(m *Map) (Map, error) { return m.Promote(1, 4) },
		func(m *Map) (Map, error) { return m.SetLeader(1, 4) },
		func(m *Map) (Map, error) { return m.RemoveReplica(1, 1) },
		func(m *Map) (Map, error) { return m.AddLearner(1, 1) },
		func(m *Map) (Map, error) { out, _, err := m.Split(2, 2000); return out, err },
		func(m *Map) (Map, error) { return m.Merge(2, 4) },
		func(m *Map) (Map, error) { return m.AddNode(5) },
		func(m *Map) (Map, error) { return m.RemoveNode(5) },
	}
	out := []Map{m}
	for i, step := range steps {
		prev := out[len(out)-1]
		next, err := step(&prev)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		out = append(out, next)
	}
	return out
}

// TestChangesBumpEpochAndLeaveTheReceiver: every change returns a valid
// map one epoch up and leaves the map it was called on as it was (a Map
// is a value; the maps share nothing mutable).
func TestChangesBumpEpochAndLeaveTheReceiver(t *testing.T) {
	maps := changes(t)
	encodings := make([][]byte, len(maps))
	for i := range maps {
		encodings[i] = maps[i].Encode()
		if err := maps[i].Validate(); err != nil {
			t.Fatalf("map %d: %v", i, err)
		}
		if i > 0 && maps[i].Epoch != maps[i-1].Epoch+1 {
			t.Fatalf("map %d at epoch %d after %d, expected one higher", i, maps[i].Epoch, maps[i-1].Epoch)
		}
	}
	// Scribble on the maps from the last one back; the earlier ones,
	// not yet scribbled on, must not change.
	for i := len(maps) - 1; i >= 0; i-- {
		for j := range maps[i].Groups {
			for k := range maps[i].Groups[j].Replicas {
				maps[i].Groups[j].Replicas[k].Node = 99
			}
		}
		for k := range maps[i].Nodes {
			maps[i].Nodes[k] = 99
		}
		for p := 0; p < i; p++ {
			if !bytes.Equal(maps[p].Encode(), encodings[p]) {
				t.Fatalf("editing map %d changed map %d", i, p)
			}
		}
	}
}

// TestReplicaIDsAreNeverReused: a node re-added to a group gets a fresh
// raft id above every id the group used; the old one is a tombstone.
func TestReplicaIDsAreNeverReused(t *testing.T) {
	maps := changes(t)
	last := maps[len(maps)-1]
	g, _ := last.Group(1)
	r, _ := g.Replica(1)
	if r.ID == 1 || r.ID < 5 {
		t.Fatalf("node 1 re-added to group 1 got raft id %d, expected a fresh id above 4 (ids 1..4 were used)", r.ID)
	}
	if !g.Tombstoned(1) || g.Tombstoned(r.ID) || g.Tombstoned(4) || g.Tombstoned(g.NextReplicaID) {
		t.Fatalf("tombstones of group 1 (next id %d): 1=%v %d=%v 4=%v", g.NextReplicaID, g.Tombstoned(1), r.ID, g.Tombstoned(r.ID), g.Tombstoned(4))
	}
	// A merged group's id is never handed out again.
	if _, ok := last.Group(4); ok {
		t.Fatal("group 4 still exists after merging it into 2")
	}
	_, id, err := last.Split(3, 3000)
	if err != nil || id != 5 {
		t.Fatalf("split after retiring group 4 made group %d (%v), expected 5", id, err)
	}
}

// TestEncodeRoundTrip: Decode(Encode(m)) is m, for bootstrapped and
// changed maps, in the binary and the JSON form.
func TestEncodeRoundTrip(t *testing.T) {
	maps := changes(t)
	for _, s := range []int{1, 7, 64} {
		m, err := Bootstrap(s, 3, seqNodes(5, 1))
		if err != nil {
			t.Fatal(err)
		}
		maps = append(maps, m)
	}
	for i := range maps {
		b := maps[i].Encode()
		back, err := Decode(b)
		if err != nil {
			t.Fatalf("map %d: %v", i, err)
		}
		if !bytes.Equal(back.Encode(), b) || table(&back) != table(&maps[i]) {
			t.Fatalf("map %d changed in a binary round trip:\n%s\nbecame\n%s", i, table(&maps[i]), table(&back))
		}
		j, err := json.Marshal(&maps[i])
		if err != nil {
			t.Fatal(err)
		}
		var fromJSON Map
		if err := json.Unmarshal(j, &fromJSON); err != nil {
			t.Fatalf("map %d: %v\n%s", i, err, j)
		}
		if !bytes.Equal(fromJSON.Encode(), b) {
			t.Fatalf("map %d changed in a JSON round trip: %s", i, j)
		}
	}
}

// TestDecodeCatchesEveryCorruptByte: changing any one byte of an encoded
// map makes Decode fail (CRC-32C detects every burst of up to 32 bits).
func TestDecodeCatchesEveryCorruptByte(t *testing.T) {
	m, err := Bootstrap(5, 3, seqNodes(4, 1))
	if err != nil {
		t.Fatal(err)
	}
	b := m.Encode()
	for i := range b {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			c := slices.Clone(b)
			c[i] ^= x
			if _, err := Decode(c); err == nil {
				t.Fatalf("byte %d xor %#x: decoded without error", i, x)
			}
		}
	}
	for n := range len(b) {
		if _, err := Decode(b[:n]); err == nil {
			t.Fatalf("the first %d of %d bytes decoded without error", n, len(b))
		}
	}
}

// TestDecodeRefusesAFutureVersion: the version error names the version
// and is not a DecodeError (not corruption).
func TestDecodeRefusesAFutureVersion(t *testing.T) {
	m, _ := Bootstrap(1, 1, []NodeID{1})
	b := m.Encode()
	b[4] = FormatVersion + 1
	body := b[:len(b)-4]
	b = append(slices.Clone(body), 0, 0, 0, 0)
	putCRC(b)
	_, err := Decode(b)
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Version != FormatVersion+1 || !strings.Contains(err.Error(), "a newer tidal-server wrote it") {
		t.Fatalf("Decode of version %d = %v, expected a *VersionError naming it", FormatVersion+1, err)
	}
}

func putCRC(b []byte) {
	body := b[:len(b)-4]
	binary.LittleEndian.PutUint32(b[len(body):], crc32.Checksum(body, castagnoli))
}

// TestValidateSaysFalse: each invariant Validate states, broken in a
// valid map, is caught and named.
func TestValidateSaysFalse(t *testing.T) {
	good, err := Bootstrap(4, 3, seqNodes(5, 1))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(m *Map)
		want string
	}{
		{"epoch 0", func(m *Map) { m.Epoch = 0 }, "epoch is 0"},
		{"slot owned twice", func(m *Map) { m.Groups[1].Start-- }, "owned twice: by group 1"},
		{"gap", func(m *Map) { m.Groups[1].Start++ }, "owned by no group"},
		{"gap at the end", func(m *Map) { m.Groups[3].End-- }, "owned by no group (the last group, 4"},
		{"empty range", func(m *Map) { m.Groups[1].End = m.Groups[1].Start }, "expected start < end"},
		{"too few voters", func(m *Map) { m.Groups[0].Replicas[2].Role = Learner }, "2 voters (nodes 1,2), expected at least 3"},
		{"unknown node", func(m *Map) { m.Groups[0].Replicas[2].Node = 9 }, "replica on unknown node 9"},
		{"two replicas on a node", func(m *Map) { m.Groups[0].Replicas[1].Node = 1 }, "two replicas on node 1"},
		{"duplicate replica id", func(m *Map) { m.Groups[0].Replicas[1].ID = 1 }, "replica id 1 used on nodes 1 and 2"},
		{"replica id at next", func(m *Map) { m.Groups[0].NextReplicaID = 3 }, "has id 3, expected 1..2"},
		{"bad role", func(m *Map) { m.Groups[0].Replicas[0].Role = 7 }, "has role(7)"},
		{"leader not a voter", func(m *Map) { m.Groups[0].Leader = 5 }, "preferred leader 5 is not one of its voters"},
		{"group id twice", func(m *Map) { m.Groups[1].ID = 1 }, "listed twice"},
		{"group id at next", func(m *Map) { m.NextGroupID = 4 }, "group 4: id 4, expected below the next group id 4"},
		{"meta group owns slots", func(m *Map) { m.Groups[0].ID = 0 }, "id 0 is the meta group's"},
		{"conf epoch ahead", func(m *Map) { m.Groups[2].ConfEpoch = 2 }, "conf epoch 2 and slots epoch 1, expected each in 1..1"},
		{"unknown meta node", func(m *Map) { m.Meta = []NodeID{1, 7} }, "meta: node 7 is not a node"},
		{"no meta", func(m *Map) { m.Meta = nil }, "no meta voters"},
		{"nodes unsorted", func(m *Map) { m.Nodes[0], m.Nodes[1] = m.Nodes[1], m.Nodes[0] }, "node 1 after node 2"},
		{"R above nodes", func(m *Map) { m.ReplicationFactor = 6 }, "replication factor 6, expected 1..5"},
		{"no groups", func(m *Map) { m.Groups = nil }, "no groups"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := good.clone()
			c.edit(&m)
			err := m.Validate()
			var ve *ValidationError
			if !errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate = %v, expected a *ValidationError containing %q", err, c.want)
			}
			// The encoder writes it, the decoder refuses it.
			if _, derr := Decode(m.Encode()); derr == nil {
				t.Fatalf("Decode accepted the broken map")
			}
		})
	}
}

// TestSplitBatch: the parts partition the batch, keep batch order within
// a group, come in slot-range order, and each entity is in its group;
// with groups sorted by counting and by comparison, batches on the stack
// and on the heap.
func TestSplitBatch(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range []int{1, 2, 6, 64, countingSortGroups, countingSortGroups + 1, NumSlots} {
		m, err := Bootstrap(s, 3, seqNodes(6, 1))
		if err != nil {
			t.Fatal(err)
		}
		for range 200 {
			batch := make([]uint64, rng.IntN(300))
			for i := range batch {
				batch[i] = rng.Uint64N(500)
			}
			parts := m.SplitBatch(batch)
			seen := make([]bool, len(batch))
			lastStart := -1
			for _, p := range parts {
				g, _ := m.Group(p.Group)
				if int(g.Start) <= lastStart || len(p.Indexes) == 0 {
					t.Fatalf("S=%d: part of group %d out of slot order or empty", s, p.Group)
				}
				lastStart = int(g.Start)
				if !slices.IsSorted(p.Indexes) {
					t.Fatalf("S=%d: part of group %d not in batch order: %v", s, p.Group, p.Indexes)
				}
				for _, i := range p.Indexes {
					if seen[i] {
						t.Fatalf("S=%d: position %d in two parts", s, i)
					}
					seen[i] = true
					if got := m.GroupOf(batch[i]); got != p.Group {
						t.Fatalf("S=%d: entity %d in the part of group %d, owned by group %d", s, batch[i], p.Group, got)
					}
				}
			}
			if i := slices.Index(seen, false); i >= 0 {
				t.Fatalf("S=%d: position %d in no part", s, i)
			}
		}
	}
	if parts := (&Map{}).SplitBatch(nil); parts != nil {
		t.Fatalf("empty batch: %v parts", parts)
	}
}

// TestCheckRoute: served iff the group owns every entity; otherwise an
// EpochMismatch carrying the node's map, which survives JSON.
func TestCheckRoute(t *testing.T) {
	m, err := Bootstrap(6, 3, seqNodes(6, 1))
	if err != nil {
		t.Fatal(err)
	}
	for e := uint64(0); e < 300; e++ {
		own := m.GroupOf(e)
		// With a second entity of another group, the group owns the
		// batch only partly: refused.
		other := e + 1
		for m.GroupOf(other) == own {
			other++
		}
		if err := m.CheckRoute(own, 1, []uint64{e, other}); err == nil {
			t.Fatalf("entities %d (group %d) and %d (group %d) routed to group %d: served", e, own, other, m.GroupOf(other), own)
		}
		for _, g := range []GroupID{1, 2, 3, 4, 5, 6, 7} {
			err := m.CheckRoute(g, 1, []uint64{e})
			if (err == nil) != (g == own) {
				t.Fatalf("entity %d (group %d) routed to group %d: %v", e, own, g, err)
			}
			if err == nil {
				continue
			}
			var em *EpochMismatch
			if !errors.As(err, &em) || em.Current.Epoch != m.Epoch || em.Group != g {
				t.Fatalf("entity %d routed to group %d: %v, expected an EpochMismatch carrying epoch %d", e, g, err, m.Epoch)
			}
		}
	}
}

// TestRouteErrorJSON: both routing answers survive their JSON form, the
// map inside an EpochMismatch whole; a body that is neither is refused
// naming what it found.
func TestRouteErrorJSON(t *testing.T) {
	m, err := Bootstrap(3, 3, seqNodes(3, 1))
	if err != nil {
		t.Fatal(err)
	}
	m, _ = m.AddNode(4)
	m, _ = m.AddLearner(2, 4)
	for _, in := range []error{
		m.CheckRoute(1, 1, []uint64{1, 2, 3}),
		m.NotLeaderOf(2, 0),
		m.NotLeaderOf(2, 3),
		fmt.Errorf("wrapped: %w", m.NotLeaderOf(1, 2)),
	} {
		body, ok := EncodeRouteError(in)
		if !ok {
			t.Fatalf("EncodeRouteError(%v): not a routing error", in)
		}
		var generic struct {
			Error struct{ Code, Message, Field *string } `json:"error"`
		}
		if err := json.Unmarshal(body, &generic); err != nil || generic.Error.Code == nil || generic.Error.Message == nil || generic.Error.Field == nil {
			t.Fatalf("body %s lacks the API error shape {code, message, field}: %v", body, err)
		}
		out, err := DecodeRouteError(body)
		if err != nil {
			t.Fatal(err)
		}
		var em, emBack *EpochMismatch
		if errors.As(in, &em) {
			if !errors.As(out, &emBack) || !bytes.Equal(emBack.Current.Encode(), em.Current.Encode()) || emBack.Routed != em.Routed {
				t.Fatalf("EpochMismatch changed in JSON: %s", body)
			}
			continue
		}
		var nl, nlBack *NotLeader
		errors.As(in, &nl)
		if !errors.As(out, &nlBack) || nlBack.Leader != nl.Leader || !slices.Equal(nlBack.Replicas, nl.Replicas) || nlBack.Epoch != nl.Epoch {
			t.Fatalf("NotLeader changed in JSON: %+v became %+v", nl, out)
		}
	}
	if _, ok := EncodeRouteError(errors.New("other")); ok {
		t.Fatal("EncodeRouteError accepted an error that is not a routing answer")
	}
	for body, want := range map[string]string{
		`{"error":{"code":"conflict","message":"x","field":""}}`:                                `code "conflict", expected "epoch_mismatch" or "not_leader"`,
		`{"error":{"code":"epoch_mismatch","message":"x","field":""}}`:                          `without its "epoch_mismatch" member`,
		`{"error":{"code":"not_leader"}}`:                                                       `without its "not_leader" member`,
		`{"error":{"code":"not_leader","not_leader":{"replicas":[{"role":"boss"}]}}}`:           `role "boss"`,
		`{"error":{"code":"epoch_mismatch","epoch_mismatch":{"map":{"slots":16384}}}}`:          "slot count 16384",
		`{"error":{"code":"epoch_mismatch","epoch_mismatch":{"map":{"slots":4096,"epoch":1}}}}`: "invalid shard map",
		`not json`: "routing error body",
	} {
		_, err := DecodeRouteError([]byte(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("DecodeRouteError(%s) = %v, expected an error containing %q", body, err, want)
		}
	}
}
