// Package shard is the foundation for running many raft groups per
// process: the slot space entity ids hash into, the shard map (which
// group owns which slots, where each group's replicas live, the epoch the
// map is at), the bootstrap placement of groups on nodes, and the routing
// of requests and of batches to groups.
//
// The package is pure: it does no I/O, reads no clock, starts no
// goroutines and draws no random numbers. A Map is a value — changes
// return a new Map — so the caller decides where maps are replicated,
// stored and cached (docs/ARCHITECTURE.md "Shards (shard)": a meta group
// keeps the map; every node caches it).
//
// # Invariants
//
// Each is stated where it lives and pinned by the test named.
//
//   - SlotOf is fixed for ever: the same id has the same slot on every
//     build (TestSlotOfIsFixed), and sequential ids spread evenly
//     (TestSlotOfSpreadsSequentialIDs).
//   - A valid map owns every slot exactly once, by contiguous ranges; every
//     group has at least ReplicationFactor voters, at most one replica per
//     node, only known nodes, and a voter as preferred leader (Validate;
//     TestValidateSaysFalse, testdata/validate.txt).
//   - Every change returns a valid map exactly one epoch up and leaves the
//     map it was called on unchanged; the groups it touches carry the new
//     epoch as their ConfEpoch or SlotsEpoch
//     (TestChangesBumpEpochAndLeaveTheReceiver, testdata/changes.txt).
//   - Replica ids within a group, and group ids within a map, are never
//     reused (TestReplicaIDsAreNeverReused, testdata/changes.txt).
//   - Bootstrap is deterministic and balanced: independent of the order
//     of its nodes, every node holds ⌊S·R/N⌋ or ⌈S·R/N⌉ replicas and leads
//     ⌊S/N⌋ or ⌈S/N⌉ groups, slot ranges differ by at most one slot
//     (TestBootstrapPlacement, TestAssignLeadersOnPlantedInstances,
//     TestCheckPlacementSaysFalse, testdata/placement.txt); with S = 1 and
//     R = N it is today's single group (TestBootstrapSingleShardIsTodaysGroup).
//   - The encoding is canonical and checked: Decode returns only valid
//     maps, re-encoding to the bytes decoded; any one corrupt byte is
//     refused; a newer format version is refused naming it
//     (TestEncodeRoundTrip, TestDecodeCatchesEveryCorruptByte,
//     TestDecodeRefusesAFutureVersion, FuzzDecode, testdata/encoding.txt).
//   - SplitBatch partitions a batch by owning group, keeping batch order
//     within each part (TestSplitBatch, testdata/routing.txt).
//   - CheckRoute serves a request exactly when the group owns all its
//     entities, and otherwise answers with the node's map; both routing
//     answers survive their JSON form (TestCheckRoute, TestRouteErrorJSON,
//     FuzzDecodeRouteError, testdata/routing.txt).
package shard
