package replica_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/tidaldb/tidal/tidal-server/replica"
)

// An entry whose envelope no entry format of this build
// defines (a newer release wrote it) stops the node with an
// *EntryFormatError naming its index, on every start, instead of being
// skipped: a skipped entry is a replica that diverged from those that
// applied it. Before, apply logged "skipping entry with unknown framing"
// and went on.
func TestUnreadableEntryFormatStopsTheNode(t *testing.T) {
	c := newCluster(t, 1, nil)
	c.waitLeader()
	before := c.mustPropose(1, "before")
	if err := replica.ProposeRaw(c.node(1).r, []byte{0x7f, 'n', 'e', 'w'}); err != nil {
		t.Fatal(err)
	}
	expectStopped := func(what string) {
		t.Helper()
		nd := c.node(1)
		select {
		case <-nd.r.Done():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the node did not stop at an entry of an unknown format", what)
		}
		var fe *replica.EntryFormatError
		if err := nd.r.Err(); !errors.As(err, &fe) || fe.Envelope != 0x7f || fe.Index <= before.Index {
			t.Fatalf("%s: Err() = %v; expected an *EntryFormatError for envelope 0x7f after index %d", what, err, before.Index)
		}
		if _, ok := nd.sm.has("before"); !ok {
			t.Fatalf("%s: the entry before it was not applied", what)
		}
	}
	expectStopped("first run")
	c.stop(1)
	c.start(1, false)
	expectStopped("after a restart")
}

// A malformed packed entry (envelope 3 of entry format 2, known to this
// build, but cut short: cannot be written by a node, only by a bug) is
// skipped on every node alike, and the log goes on; a well-formed one
// proposed raw is applied command by command.
func TestMalformedPackedEntryIsSkippedEverywhere(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.waitLeader()
	r := c.node(leader).r
	if err := replica.ProposeRaw(r, []byte{3, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 5, 1}); err != nil {
		t.Fatal(err)
	}
	packed := []byte{3, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 2}
	for i, cmd := range []string{"x", "yy"} {
		packed = append(packed, 0, 0, 0, 0, 0, 0, 0, byte(i), 0, 0, 0, byte(len(cmd)))
		packed = append(packed, cmd...)
	}
	if err := replica.ProposeRaw(r, packed); err != nil {
		t.Fatal(err)
	}
	c.mustPropose(leader, "after")
	st := c.waitConverged(1, 2, 3)
	var got []string
	for _, e := range st.Entries {
		got = append(got, e.Data)
	}
	if want := []string{"x", "yy", "after"}; !slices.Equal(got, want) {
		t.Fatalf("applied %q, expected %q", got, want)
	}
}
