package shard

// NumSlots is the size of the slot space. Every entity id hashes to one of
// NumSlots slots, and the shard map assigns contiguous slot ranges to
// groups. The number is part of the on-disk format (stored in every
// encoded map and checked on decode) and never changes for a cluster:
// changing it would move entities between slots, and a slot is the unit a
// group's data is split, merged and moved by.
//
// 4096 = 2^12: it bounds a cluster to 4096 data groups (a group owns at
// least one slot), far beyond the groups a cluster of tens of nodes runs,
// while one slot is still fine enough that the ranges of S groups differ
// by at most one slot (100 groups: 40 or 41 slots, 2.5%); and a slot is
// the top 12 bits of the hash, so SlotOf is a multiply-xorshift and a
// shift.
const NumSlots = 4096

// slotBits is log2(NumSlots).
const slotBits = 12

// Slot is a position in the slot space, in [0, NumSlots).
type Slot uint32

// SlotOf returns the slot of an entity id: the top 12 bits of a fixed
// 64-bit mix of the id (the finalizer of SplitMix64: two multiply-xorshift
// rounds, constants from Stafford's "variant 13").
//
// Invariant: SlotOf is a pure function of the id, identical on every
// build, architecture and process — no seed, no Go map hash, no
// per-process randomness — because the slot of an entity is stored
// implicitly in where its data lives. TestSlotOfIsFixed pins it with
// known values; any change to it is a data-format change.
//
// Sequential ids (the common case: auto-increment entity ids) spread
// evenly over all slots, because the mix is a bijection on uint64 whose
// high bits depend on every input bit (TestSlotOfSpreadsSequentialIDs).
func SlotOf(entity uint64) Slot {
	return Slot(mix64(entity) >> (64 - slotBits))
}

// mix64 is SplitMix64's finalizer, a bijection on uint64.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
