package server

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
	"github.com/tidaldb/tidal/tidal-server/vectors"
)

// packKind is one kind of command a packed entry can carry, as the API
// proposes it: a signals batch of some length, or an embedding put.
type packKind struct {
	name   string
	events int // events of a signals command; 0 for an embedding put
}

var packKinds = []packKind{
	{name: "signals", events: 1},
	{name: "signals×3", events: 3},
	{name: "embedding"},
}

// packedCommand is one command of a packed entry and what applying it
// must leave: its events at their positions, or its vector.
type packedCommand struct {
	kind   packKind
	data   []byte
	events []ledger.Event
	put    embeddingPut
	first  uint32 // the command's first position in its entry
}

// packedEntry builds the commands of one packed entry, in the order of
// kinds, with ids and entities no other entry of the test uses. Positions
// are the contract of ledger.Span: one per event of a signals command,
// one for any other command.
func packedEntry(tag string, kinds []packKind) []packedCommand {
	cmds := make([]packedCommand, len(kinds))
	pos := uint32(0)
	for i, k := range kinds {
		c := packedCommand{kind: k, first: pos}
		entity := uint64(1000*len(tag) + 10*i)
		if k.events == 0 {
			c.put = embeddingPut{ID: fmt.Sprintf("%s-v%d", tag, i), Entity: entity, Vector: []float32{float32(i + 1), 1, 0, 2}}
			c.data = encodeEmbedding(c.put)
		} else {
			for j := range k.events {
				c.events = append(c.events, event(fmt.Sprintf("%s-e%d.%d", tag, i, j), entity+uint64(j), float64(1+j)))
			}
			c.data = signalsCmd(c.events...)
		}
		pos += ledger.Span(k.events)
		cmds[i] = c
	}
	return cmds
}

func appEntries(index uint64, cmds []packedCommand) []replica.AppEntry {
	ents := make([]replica.AppEntry, len(cmds))
	for i, c := range cmds {
		ents[i] = replica.AppEntry{Index: index, Term: 1, Data: c.data, Sub: i, Subs: len(cmds)}
	}
	return ents
}

// checkApplied fails unless every command of the entry at index was
// applied once, without error, and left its events at their positions or
// its vector in the store.
func checkApplied(t *testing.T, sm *StateMachine, index uint64, cmds []packedCommand, res []any) {
	t.Helper()
	for i, c := range cmds {
		switch r := res[i].(type) {
		case SignalsResult:
			if c.kind.events == 0 || r.Err != nil || r.Applied != len(c.events) || r.Duplicates != 0 {
				t.Errorf("command %d (%s) at index %d: %+v, expected %d events applied and no error", i, c.kind.name, index, r, len(c.events))
			}
		case EmbeddingResult:
			if c.kind.events != 0 || r.Err != nil || r.Duplicate {
				t.Errorf("command %d (%s) at index %d: %+v, expected the vector stored and no error", i, c.kind.name, index, r)
			}
		default:
			t.Errorf("command %d (%s) at index %d: result %T %v", i, c.kind.name, index, r, r)
		}
	}
	sm.Read(func(l *ledger.Ledger, v *vectors.Store, _ uint64) {
		for i, c := range cmds {
			for j, e := range c.events {
				loc, ok := l.Lookup(e.ID)
				if want := int(c.first) + j; !ok || loc.Index != index || loc.Position != want {
					t.Errorf("command %d (%s): event %s at %+v (found %v), expected index %d position %d", i, c.kind.name, e.ID, loc, ok, index, want)
				}
			}
			if c.kind.events == 0 {
				if got, ok := v.Get(c.put.Entity); !ok || !slices.Equal(got, c.put.Vector) {
					t.Errorf("command %d (%s): entity %d has vector %v (found %v), expected %v", i, c.kind.name, c.put.Entity, got, ok, c.put.Vector)
				}
			}
		}
	})
}

// checkReplayed fails unless every command of a replayed entry was
// recognised as already applied.
func checkReplayed(t *testing.T, cmds []packedCommand, res []any, what string) {
	t.Helper()
	for i, c := range cmds {
		var err error
		switch r := res[i].(type) {
		case SignalsResult:
			err = r.Err
		case EmbeddingResult:
			err = r.Err
		}
		if !errors.Is(err, ledger.ErrAlreadyApplied) {
			t.Errorf("%s: command %d (%s): %+v, expected ledger.ErrAlreadyApplied", what, i, c.kind.name, res[i])
		}
	}
}

// kindSequences returns every sequence of 1..maxLen kinds.
func kindSequences(kinds []packKind, maxLen int) [][]packKind {
	var out, level [][]packKind
	level = [][]packKind{nil}
	for range maxLen {
		var next [][]packKind
		for _, seq := range level {
			for _, k := range kinds {
				next = append(next, append(slices.Clone(seq), k))
			}
		}
		out = append(out, next...)
		level = next
	}
	return out
}

// TestPackedEntryPositions applies every order of command kinds in one
// packed entry: position inside an entry is one notion for every kind
// (ledger.Span), so each command is applied exactly once, and the entry
// applied again — a replay, on the live state or on one restored from a
// snapshot taken after it — is recognised as already applied command by
// command and changes nothing.
func TestPackedEntryPositions(t *testing.T) {
	t.Run("Regression: packed embedding before signals", func(t *testing.T) {
		for _, kinds := range kindSequences(packKinds, 4) {
			names := make([]string, len(kinds))
			for i, k := range kinds {
				names[i] = k.name
			}
			t.Run(strings.Join(names, ","), func(t *testing.T) {
				sm := NewStateMachine(testSchema(), ledger.Options{})
				// Entry 1, unpacked, so the packed entry is not the log's first.
				if r := sm.Apply(1, 1, signalsCmd(event("before", 1, 1))).(SignalsResult); r.Err != nil {
					t.Fatalf("entry 1: %v", r.Err)
				}
				cmds := packedEntry("p", kinds)
				ents := appEntries(2, cmds)
				checkApplied(t, sm, 2, cmds, sm.ApplyBatch(ents))
				_, digest := sm.Digest()

				checkReplayed(t, cmds, sm.ApplyBatch(ents), "replayed on the live state")
				if _, d := sm.Digest(); d != digest {
					t.Fatalf("the replay changed the state: digest %s, expected %s", d, digest)
				}

				var snap bytes.Buffer
				if err := sm.Snapshot(&snap); err != nil {
					t.Fatal(err)
				}
				restored := NewStateMachine(testSchema(), ledger.Options{})
				if err := restored.Restore(&snap); err != nil {
					t.Fatal(err)
				}
				checkReplayed(t, cmds, restored.ApplyBatch(ents), "replayed after a restore")
				if _, d := restored.Digest(); d != digest {
					t.Fatalf("restored and replayed: digest %s, expected %s", d, digest)
				}

				// The next packed entry applies on both, and a state machine
				// that replays the whole log from the start (a restart
				// without a snapshot) ends in the same state.
				next := packedEntry("next", slices.Concat(kinds, []packKind{packKinds[2], packKinds[0]}))
				checkApplied(t, sm, 3, next, sm.ApplyBatch(appEntries(3, next)))
				checkApplied(t, restored, 3, next, restored.ApplyBatch(appEntries(3, next)))
				fresh := NewStateMachine(testSchema(), ledger.Options{})
				fresh.Apply(1, 1, signalsCmd(event("before", 1, 1)))
				fresh.ApplyBatch(ents)
				fresh.ApplyBatch(appEntries(3, next))
				_, a := sm.Digest()
				_, b := restored.Digest()
				_, c := fresh.Digest()
				if a != b || a != c {
					t.Fatalf("digests after entry 3: live %s, restored %s, replayed from the start %s", a, b, c)
				}
			})
		}
	})
}

// A snapshot records the applied index alone, meaning "that entry whole",
// so state is never captured inside an entry: ApplyBatch applies a packed
// entry whole under the lock, and CaptureSnapshot refuses a state whose
// entry is partly applied instead of writing one that, restored, would
// skip the entry's remaining commands.
func TestSnapshotOnlyAtEntryBoundaries(t *testing.T) {
	sm := NewStateMachine(testSchema(), ledger.Options{})
	cmds := packedEntry("half", []packKind{packKinds[2], packKinds[0]})
	ents := appEntries(1, cmds)
	sm.ApplyBatch(ents[:1])
	if _, err := sm.CaptureSnapshot(); err == nil || !strings.Contains(err.Error(), "partly applied") {
		t.Fatalf("CaptureSnapshot inside entry 1: %v, expected a refusal", err)
	}
	sm.ApplyBatch(ents[1:])
	if _, err := sm.CaptureSnapshot(); err != nil {
		t.Fatalf("CaptureSnapshot after entry 1: %v", err)
	}
}
