package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/tidaldb/tidal/tidal-server/ledger"
	"github.com/tidaldb/tidal/tidal-server/replica"
)

// packedIn builds the commands of the packed entry at index as the
// replica hands them over from the envelope of entry format f.
func packedIn(f uint32, index uint64, cmds ...[]byte) []replica.AppEntry {
	ents := make([]replica.AppEntry, len(cmds))
	for i, c := range cmds {
		ents[i] = replica.AppEntry{Index: index, Term: 1, Data: c, Sub: i, Subs: len(cmds), PackFormat: f}
	}
	return ents
}

// outcome is a command's result as its proposer sees it: how many
// events applied, or which refusal.
func outcome(r any) string {
	class := func(err error) string {
		var ce *ledger.ConflictError
		switch {
		case err == nil:
			return "ok"
		case errors.Is(err, ledger.ErrAlreadyApplied):
			return "already-applied"
		case errors.As(err, &ce):
			return "conflict"
		}
		return "refused"
	}
	switch r := r.(type) {
	case nil:
		return "nil"
	case SignalsResult:
		return fmt.Sprintf("signals %s applied=%d duplicates=%d", class(r.Err), r.Applied, r.Duplicates)
	case EmbeddingResult:
		return fmt.Sprintf("embedding %s duplicate=%v", class(r.Err), r.Duplicate)
	}
	return fmt.Sprintf("%T", r)
}

// A packed entry keeps the position rule of the envelope it was written
// in, on every release: a leader writes the envelope of entry format 2
// while a member runs the release that reads no newer, and that release
// applies [embedding, signals, …] by refusing the signals right behind
// the embedding (ErrAlreadyApplied, not applied) and placing later events
// one position lower per embedding. This build must do exactly that with
// a format-2 entry, or the replicas of a mixed cluster diverge; with the
// format-3 envelope it applies every command (ledger.Span). The expected
// positions, outcomes and digest are those of the release that wrote
// format 2 (its state machine, fed these entries).
func TestPackedEntryKeepsItsFormatsRule(t *testing.T) {
	t.Run("Regression: a mixed-release cluster applies packed entries alike", func(t *testing.T) {
		emb := func(id string, entity uint64) []byte {
			return encodeEmbedding(embeddingPut{ID: id, Entity: entity, Vector: []float32{1, 2, 3, 4}})
		}
		cmds := [][]byte{
			emb("v1", 10),
			signalsCmd(event("a", 1, 1), event("b", 2, 1)),
			signalsCmd(event("c", 3, 1)),
			emb("v2", 11),
			signalsCmd(event("d", 4, 1)),
		}
		for _, tc := range []struct {
			format    uint32
			outcomes  []string
			positions map[string]int // -1: not applied
			digest    string
		}{
			{
				format: replica.PackedEntryFormat,
				outcomes: []string{
					"embedding ok duplicate=false",
					"signals already-applied applied=0 duplicates=0",
					"signals ok applied=1 duplicates=0",
					"embedding ok duplicate=false",
					"signals ok applied=1 duplicates=0",
				},
				positions: map[string]int{"a": -1, "b": -1, "c": 2, "d": 3},
				digest:    "b39dc442d37a202e037199a4826824a056fa62538844d91696d7a28ec81a1f3a",
			},
			{
				format: replica.PackedSpansEntryFormat,
				outcomes: []string{
					"embedding ok duplicate=false",
					"signals ok applied=2 duplicates=0",
					"signals ok applied=1 duplicates=0",
					"embedding ok duplicate=false",
					"signals ok applied=1 duplicates=0",
				},
				positions: map[string]int{"a": 1, "b": 2, "c": 3, "d": 5},
			},
		} {
			t.Run(fmt.Sprintf("format %d", tc.format), func(t *testing.T) {
				sm := NewStateMachine(testSchema(), ledger.Options{})
				if r := sm.Apply(1, 1, signalsCmd(event("before", 1, 1))).(SignalsResult); r.Err != nil {
					t.Fatalf("entry 1: %v", r.Err)
				}
				for i, r := range sm.ApplyBatch(packedIn(tc.format, 2, cmds...)) {
					if got := outcome(r); got != tc.outcomes[i] {
						t.Errorf("command %d of the format-%d entry: %s, expected %s", i, tc.format, got, tc.outcomes[i])
					}
				}
				for id, want := range tc.positions {
					loc, ok := sm.ledger.Lookup(id)
					switch {
					case want < 0 && ok:
						t.Errorf("event %s at %+v, expected it refused (not applied)", id, loc)
					case want >= 0 && (!ok || loc.Index != 2 || loc.Position != want):
						t.Errorf("event %s at %+v (found %v), expected index 2 position %d", id, loc, ok, want)
					}
				}
				if sm.ledger.EntryOpen() || sm.ledger.AppliedIndex() != 2 {
					t.Errorf("after the entry: applied index %d, entry open %v; expected 2, finished", sm.ledger.AppliedIndex(), sm.ledger.EntryOpen())
				}
				if _, d := sm.Digest(); tc.digest != "" && d != tc.digest {
					t.Errorf("digest %s, expected %s (the format-2 release's)", d, tc.digest)
				}
			})
		}
	})
}

// format2Log is a seeded log of entries mixing ordinary ones and packed
// ones of the format-2 envelope, whose commands are signals batches (new
// ids, retries, conflicting reuses), embedding puts (new, repeated,
// conflicting), empty batches, undecodable and empty commands and one of
// an unknown kind; and the ids of the events it carries.
func format2Log(seed uint64, entries int) (log [][]replica.AppEntry, ids []string) {
	rng := rand.New(rand.NewPCG(seed, 7))
	command := func() []byte {
		switch rng.IntN(12) {
		case 0, 1, 2:
			vec := []float32{float32(1 + rng.IntN(3)), 1, 0, 2}
			return encodeEmbedding(embeddingPut{ID: fmt.Sprintf("v%d", rng.IntN(6)), Entity: uint64(rng.IntN(4)), Vector: vec})
		case 3:
			return []byte{kindSignals, 1, 2}
		case 4:
			return signalsCmd()
		case 5:
			return nil
		case 6:
			return []byte{0x7e, 1}
		}
		evs := make([]ledger.Event, 1+rng.IntN(3))
		for i := range evs {
			id := fmt.Sprintf("e%d", len(ids))
			if len(ids) > 0 && rng.IntN(4) == 0 {
				id = ids[rng.IntN(len(ids))]
			} else {
				ids = append(ids, id)
			}
			evs[i] = event(id, uint64(rng.IntN(3)), float64(1+rng.IntN(2)))
		}
		return signalsCmd(evs...)
	}
	for index := uint64(1); index <= uint64(entries); index++ {
		if rng.IntN(4) == 0 {
			log = append(log, []replica.AppEntry{{Index: index, Term: 1, Data: command(), Subs: 1}})
			continue
		}
		cmds := make([][]byte, 1+rng.IntN(5))
		for i := range cmds {
			cmds[i] = command()
		}
		log = append(log, packedIn(replica.PackedEntryFormat, index, cmds...))
	}
	return log, ids
}

// Seeded logs of format-2 entries of every mix of command kinds, with a
// small id memory (rotations inside them), leave exactly the outcomes,
// event positions and digests, entry by entry, that the release that
// wrote format 2 gives: the fingerprint is that release's, computed by
// its state machine from these logs.
func TestFormat2LogsReplayAsTheirRelease(t *testing.T) {
	const want = "c9d71507c5c22de91cc478b030728bff06a4943a3d5ee1ecd87d23a85431408b"
	h := sha256.New()
	refused := 0
	for seed := range uint64(200) {
		sm := NewStateMachine(testSchema(), ledger.Options{IDsPerGeneration: 1 + int(seed%5)})
		log, ids := format2Log(seed, 8)
		for _, ents := range log {
			for _, r := range sm.ApplyBatch(ents) {
				o := outcome(r)
				if o == "signals already-applied applied=0 duplicates=0" {
					refused++
				}
				fmt.Fprintln(h, o)
			}
			_, d := sm.Digest()
			fmt.Fprintln(h, d)
		}
		for _, id := range ids {
			loc, ok := sm.ledger.Lookup(id)
			fmt.Fprintln(h, id, ok, loc.Index, loc.Position)
		}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		t.Errorf("fingerprint of 200 format-2 logs %s, expected %s (the format-2 release's); %d signals commands refused as already applied", got, want, refused)
	}
	if refused == 0 {
		t.Error("no signals command was refused as already applied: the logs do not exercise format 2's rule")
	}
}

// A format-2 entry applied again — on the live state or on one restored
// from a snapshot taken after it — is refused command by command and
// changes nothing, as one of format 3 is; and the state after it is at an
// entry boundary, where a snapshot may be taken.
func TestFormat2ReplayIsRefused(t *testing.T) {
	log, _ := format2Log(3, 6)
	sm := NewStateMachine(testSchema(), ledger.Options{})
	for _, ents := range log {
		sm.ApplyBatch(ents)
		if _, err := sm.CaptureSnapshot(); err != nil {
			t.Fatalf("CaptureSnapshot after entry %d: %v", ents[0].Index, err)
		}
	}
	_, digest := sm.Digest()
	var snap bytes.Buffer
	if err := sm.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	restored := NewStateMachine(testSchema(), ledger.Options{})
	if err := restored.Restore(&snap); err != nil {
		t.Fatal(err)
	}
	for what, s := range map[string]*StateMachine{"live": sm, "restored": restored} {
		for _, ents := range log {
			for i, r := range s.ApplyBatch(ents) {
				if r == nil && len(ents[i].Data) == 0 {
					continue // an empty command has no result to refuse with
				}
				if o := outcome(r); !strings.Contains(o, "already-applied") {
					t.Errorf("%s: entry %d command %d replayed: %s, expected refused as already applied", what, ents[i].Index, i, o)
				}
			}
		}
		if _, d := s.Digest(); d != digest {
			t.Errorf("%s: digest %s after the replay, expected %s", what, d, digest)
		}
	}
}
