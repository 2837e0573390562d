// Package sched runs the raft groups of one node on a fixed pool of
// workers: the node's raft scheduler. A group is a number and a pending
// bitmask here; what processing a group means (stepping messages, ticking,
// handling a Ready) is the Handler's.
//
// A node hosts hundreds to thousands of groups, so nothing here is per
// group but a small record: no goroutine, timer or channel. One Tick call
// per tick interval (the node's one ticker) marks every active group; a
// group marked quiescent is skipped by Tick at no cost, and woken by the
// first Enqueue of real work for it. The worker count is fixed at New.
//
// # Invariants
//
// Each is stated where it lives and pinned by the test named.
//
//   - A group's handler is never called concurrently with itself: at most
//     one worker processes a group at a time, so everything a group owns
//     (its raft.RawNode, its staged writes, its apply state) needs no lock
//     of its own against other workers (TestNoConcurrentProcessingOfAGroup
//     under -race, whose guard TestGuardSaysFalse shows can fail).
//   - A group has at most one queue entry however often it is enqueued:
//     enqueues while it waits merge into its pending bitmask
//     (TestEnqueuesCoalesce).
//   - Work is never lost: an Enqueue that returns true is followed by a
//     ProcessGroup call that sees its flags, started after the Enqueue —
//     a group enqueued while being processed is queued again when that
//     call returns (TestEnqueueDuringProcessingIsNotLost).
//   - FIFO among groups: a group that is enqueued again, by itself or
//     anyone, goes to the back of the queue, so a flood on one group
//     delays another by at most one of its calls per worker
//     (TestFIFO, TestFloodDoesNotStarveOthers).
//   - Ticks owed are counted per group and capped at Config.MaxTicks: a
//     group that falls behind gets at most MaxTicks at once, never a burst
//     of elections (TestTicksAreCapped).
//   - Tick skips quiescent groups; an Enqueue of Ready, Message or Custom
//     wakes a quiescent group, and Quiesce refuses while such work is
//     pending, so a wake-up cannot be lost between the handler's decision
//     to quiesce and its Quiesce call (TestQuiescence,
//     TestQuiesceRefusesPendingWork).
//   - Stop drains: it refuses new work, waits for the calls in progress
//     and for every group queued before it to be processed, then returns
//     with every worker gone (TestStopDrains).
//   - No call of a group starts after Unregister returns, and the id is
//     refused by Register until a call still running for it returns
//     (TestUnregister).
package sched
