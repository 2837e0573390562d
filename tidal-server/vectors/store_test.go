package vectors

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

func randVec(r *rand.Rand, dim int) []float32 {
	v := make([]float32, dim)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

// cosine64 is the reference: cosine similarity computed in float64.
func cosine64(a, b []float32) float64 {
	var d, na, nb float64
	for i := range a {
		d += float64(a[i]) * float64(b[i])
		na += float64(a[i]) * float64(a[i])
		nb += float64(b[i]) * float64(b[i])
	}
	return d / math.Sqrt(na*nb)
}

type ref struct {
	entity uint64
	score  float64
}

// bruteForce ranks every vector in want against q in float64.
func bruteForce(want map[uint64][]float32, q []float32) []ref {
	var all []ref
	for e, v := range want {
		all = append(all, ref{e, cosine64(q, v)})
	}
	slices.SortFunc(all, func(a, b ref) int {
		if a.score != b.score {
			if a.score > b.score {
				return -1
			}
			return 1
		}
		if a.entity < b.entity {
			return -1
		}
		return 1
	})
	return all
}

// checkSortedByContract fails unless got is ordered by score descending,
// then entity ascending, with no entity twice.
func checkSortedByContract(t *testing.T, got []Match) {
	t.Helper()
	seen := map[uint64]bool{}
	for i, m := range got {
		if seen[m.Entity] {
			t.Fatalf("result %d: entity %d appears twice in %v", i, m.Entity, got)
		}
		seen[m.Entity] = true
		if i > 0 && worse(got[i-1], m) {
			t.Fatalf("results %d and %d out of order: %+v before %+v", i-1, i, got[i-1], m)
		}
	}
}

func TestNearestMatchesBruteForce(t *testing.T) {
	// 1536 is the production width; 37 leaves a tail after the unrolled loop.
	for _, dim := range []int{1536, 37, 1} {
		t.Run(fmt.Sprintf("dim=%d", dim), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(dim), 7))
			s := New(dim)
			want := map[uint64][]float32{}
			for range 400 {
				e := r.Uint64N(600) // collisions exercise replacement
				v := randVec(r, dim)
				if s.Validate(v) != nil {
					continue // dim=1 can draw an exact zero only in theory
				}
				if err := s.Put(e, v); err != nil {
					t.Fatal(err)
				}
				want[e] = v
			}
			if s.Len() != len(want) {
				t.Fatalf("Len: expected %d, found %d", len(want), s.Len())
			}
			for qi := range 20 {
				q := randVec(r, dim)
				expect := bruteForce(want, q)
				for _, k := range []int{1, 7, len(want), len(want) + 13} {
					got, err := s.Nearest(q, k)
					if err != nil {
						t.Fatal(err)
					}
					if n := min(k, len(want)); len(got) != n {
						t.Fatalf("query %d k=%d: expected %d results, found %d", qi, k, n, len(got))
					}
					checkSortedByContract(t, got)
					for i, m := range got {
						exact := cosine64(q, want[m.Entity])
						if d := math.Abs(float64(m.Score) - exact); d > 1e-5 {
							t.Fatalf("query %d k=%d result %d: entity %d score %v, reference %v (off by %g)",
								qi, k, i, m.Entity, m.Score, exact, d)
						}
						// Float32 rounding may swap near-ties, never more:
						// the i-th result scores like the reference's i-th.
						if d := math.Abs(exact - expect[i].score); d > 1e-5 {
							t.Fatalf("query %d k=%d result %d: entity %d (%v) where reference ranks entity %d (%v)",
								qi, k, i, m.Entity, exact, expect[i].entity, expect[i].score)
						}
					}
				}
			}
		})
	}
}

func TestNearestTiesOrderedByEntity(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	s := New(64)
	v := randVec(r, 64)
	doubled := make([]float32, len(v))
	for i, x := range v {
		doubled[i] = 2 * x // a power-of-two scale keeps the cosine bit-exact
	}
	for _, e := range []uint64{90, 30, 70} {
		if err := s.Put(e, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(50, doubled); err != nil {
		t.Fatal(err)
	}
	for e := uint64(100); e < 150; e++ {
		if err := s.Put(e, randVec(r, 64)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Nearest(v, 4)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, m := range got {
		ids = append(ids, m.Entity)
		if m.Score != got[0].Score {
			t.Fatalf("duplicates scored differently: %+v", got)
		}
	}
	if !slices.Equal(ids, []uint64{30, 50, 70, 90}) {
		t.Fatalf("expected duplicates in entity order [30 50 70 90], found %v", ids)
	}
	if math.Abs(float64(got[0].Score)-1) > 1e-6 {
		t.Fatalf("a vector against itself: expected score 1, found %v", got[0].Score)
	}
	// k cuts inside the tie: the lowest ids win.
	got, err = s.Nearest(v, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Entity != 30 || got[1].Entity != 50 {
		t.Fatalf("k=2 inside a tie: expected [30 50], found %+v", got)
	}
}

func TestNearestRejectsBadArguments(t *testing.T) {
	s := New(4)
	if err := s.Put(1, []float32{1, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []int{0, -1} {
		_, err := s.Nearest([]float32{1, 0, 0, 0}, k)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "k" || !strings.Contains(fe.Message, fmt.Sprint(k)) {
			t.Fatalf("k=%d: expected a FieldError on k naming the value, found %v", k, err)
		}
	}
	_, err := s.Nearest([]float32{1, 0}, 3)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "vector" {
		t.Fatalf("short query: expected a FieldError on vector, found %v", err)
	}
	got, err := New(4).Nearest([]float32{1, 0, 0, 0}, 3)
	if err != nil || len(got) != 0 {
		t.Fatalf("empty store: expected no matches and no error, found %v, %v", got, err)
	}
}

func TestPutReplaces(t *testing.T) {
	s := New(3)
	for e, v := range map[uint64][]float32{1: {1, 0, 0}, 2: {0, 1, 0}, 3: {0, 0, 1}} {
		if err := s.Put(e, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(2, []float32{0, 0, -1}); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 3 {
		t.Fatalf("Len after replacement: expected 3, found %d", s.Len())
	}
	if v, _ := s.Get(2); !slices.Equal(v, []float32{0, 0, -1}) {
		t.Fatalf("Get(2) after replacement: expected [0 0 -1], found %v", v)
	}
	got, err := s.Nearest([]float32{0, 1, 0}, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Nothing points along y any more; entity 2's old vector must not match.
	if got[0].Score > 1e-6 {
		t.Fatalf("old vector of entity 2 still matched: %+v", got)
	}
	got, _ = s.Nearest([]float32{0, 0, -1}, 3)
	if got[0].Entity != 2 || got[2].Entity != 3 {
		t.Fatalf("expected entity 2 first and 3 last, found %+v", got)
	}
}

func TestValidateMessages(t *testing.T) {
	s := New(20)
	ok := make([]float32, 20)
	ok[0] = 1
	with := func(i int, x float32) []float32 {
		v := slices.Clone(ok)
		v[i] = x
		return v
	}
	cases := []struct {
		name  string
		vec   []float32
		field string
		msg   []string
	}{
		{"short", []float32{1, 2, 3}, "vector", []string{"expected 20", "found 3"}},
		{"long", make([]float32, 21), "vector", []string{"expected 20", "found 21"}},
		{"nil", nil, "vector", []string{"expected 20", "found 0"}},
		{"nan", with(17, float32(math.NaN())), "vector[17]", []string{"finite", "NaN"}},
		{"inf", with(3, float32(math.Inf(-1))), "vector[3]", []string{"finite", "-Inf"}},
		{"zero", make([]float32, 20), "vector", []string{"non-zero", "undefined"}},
		{"tiny", with(0, 1e-30), "vector", []string{"norm", "1e-30"}},
		{"huge", with(0, 1e30), "vector", []string{"norm", "1e+30"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.Digest()
			fe := s.Validate(c.vec)
			if fe == nil {
				t.Fatalf("expected a FieldError, found none")
			}
			if fe.Field != c.field {
				t.Fatalf("expected field %q, found %q (%v)", c.field, fe.Field, fe)
			}
			for _, m := range c.msg {
				if !strings.Contains(fe.Message, m) {
					t.Fatalf("message %q does not mention %q", fe.Message, m)
				}
			}
			err := s.Put(9, c.vec)
			var pe *FieldError
			if !errors.As(err, &pe) || *pe != *fe {
				t.Fatalf("Put: expected the same FieldError %v, found %v", fe, err)
			}
			if s.Len() != 0 || s.Digest() != before {
				t.Fatalf("a rejected Put changed the store")
			}
		})
	}
	if fe := s.Validate(ok); fe != nil {
		t.Fatalf("valid vector rejected: %v", fe)
	}
	// A valid Put must return a nil error interface, not a typed nil.
	if err := s.Put(1, ok); err != nil {
		t.Fatalf("valid Put: %v", err)
	}
}

func TestGetIsACopy(t *testing.T) {
	s := New(2)
	in := []float32{1, 2}
	if err := s.Put(1, in); err != nil {
		t.Fatal(err)
	}
	in[0] = 99
	out, ok := s.Get(1)
	if !ok || !slices.Equal(out, []float32{1, 2}) {
		t.Fatalf("mutating the input changed the store: %v", out)
	}
	out[1] = 99
	if again, _ := s.Get(1); !slices.Equal(again, []float32{1, 2}) {
		t.Fatalf("mutating Get's result changed the store: %v", again)
	}
	if _, ok := s.Get(2); ok {
		t.Fatal("Get of an absent entity reported a vector")
	}
}

func populated(seed uint64, dim, puts int) *Store {
	r := rand.New(rand.NewPCG(seed, seed))
	s := New(dim)
	for range puts {
		if err := s.Put(r.Uint64N(uint64(puts)), randVec(r, dim)); err != nil {
			panic(err)
		}
	}
	return s
}

func TestSnapshotRoundTrip(t *testing.T) {
	src := populated(3, 96, 300)
	var buf bytes.Buffer
	if err := src.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	snap := slices.Clone(buf.Bytes())
	// Restore must stop exactly at the end of the snapshot.
	buf.WriteString("NEXT")

	dst := populated(4, 96, 10) // restore replaces existing contents
	if err := dst.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	if rest := buf.String(); rest != "NEXT" {
		t.Fatalf("Restore consumed bytes past the snapshot: %q left", rest)
	}
	if dst.Len() != src.Len() {
		t.Fatalf("Len: expected %d, found %d", src.Len(), dst.Len())
	}
	var again bytes.Buffer
	if err := dst.Snapshot(&again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(snap, again.Bytes()) {
		t.Fatal("snapshot of the restored store differs from the original snapshot")
	}
	if src.Digest() != dst.Digest() {
		t.Fatal("digests differ after restore")
	}
	for _, e := range src.entities {
		a, _ := src.Get(e)
		b, ok := dst.Get(e)
		if !ok || !slices.Equal(a, b) {
			t.Fatalf("entity %d: expected %v, found %v", e, a[:3], b)
		}
	}
	q := randVec(rand.New(rand.NewPCG(9, 9)), 96)
	a, _ := src.Nearest(q, 25)
	b, _ := dst.Nearest(q, 25)
	if !slices.Equal(a, b) {
		t.Fatalf("Nearest differs after restore:\n%v\n%v", a, b)
	}
}

func TestRestoreRejectsDamageAndKeepsState(t *testing.T) {
	src := populated(5, 4, 6)
	var buf bytes.Buffer
	if err := src.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	snap := buf.Bytes()
	dst := populated(6, 4, 3)
	before := dst.Digest()

	for off := range snap {
		for bit := range 8 {
			bad := slices.Clone(snap)
			bad[off] ^= 1 << bit
			if err := dst.Restore(bytes.NewReader(bad)); err == nil {
				t.Fatalf("flipped bit %d of byte %d: Restore accepted it", bit, off)
			}
		}
	}
	for n := range len(snap) {
		err := dst.Restore(bytes.NewReader(snap[:n]))
		if err == nil || !strings.Contains(err.Error(), "before end of stream") {
			t.Fatalf("truncated to %d of %d bytes: expected an end-of-stream error, found %v", n, len(snap), err)
		}
	}
	if dst.Digest() != before {
		t.Fatal("a failed Restore changed the store")
	}

	err := New(8).Restore(bytes.NewReader(snap))
	if err == nil || !strings.Contains(err.Error(), "expected dimension 8") || !strings.Contains(err.Error(), "found 4") {
		t.Fatalf("dimension mismatch: expected an error naming both dimensions, found %v", err)
	}
}

func TestDigestDeterminism(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	final := map[uint64][]float32{}
	for e := range uint64(50) {
		final[e*7919] = randVec(r, 32)
	}
	keys := slices.Collect(func(yield func(uint64) bool) {
		for k := range final {
			if !yield(k) {
				return
			}
		}
	})
	slices.Sort(keys)

	// Same final state through different histories: ascending order,
	// descending order with overwritten intermediate values.
	a, b := New(32), New(32)
	for _, k := range keys {
		if err := a.Put(k, final[k]); err != nil {
			t.Fatal(err)
		}
	}
	for i := len(keys) - 1; i >= 0; i-- {
		if err := b.Put(keys[i], randVec(r, 32)); err != nil {
			t.Fatal(err)
		}
	}
	for i := len(keys) - 1; i >= 0; i-- {
		if err := b.Put(keys[i], final[keys[i]]); err != nil {
			t.Fatal(err)
		}
	}
	if a.Digest() != b.Digest() {
		t.Fatal("equal states, different digests")
	}
	var snap bytes.Buffer
	if err := a.Snapshot(&snap); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(snap.Bytes())
	if a.Digest() != hex.EncodeToString(sum[:]) {
		t.Fatal("Digest is not the SHA-256 of the snapshot")
	}

	// One ulp in one component must change the digest.
	v := slices.Clone(final[keys[3]])
	v[5] = math.Nextafter32(v[5], float32(math.Inf(1)))
	if err := b.Put(keys[3], v); err != nil {
		t.Fatal(err)
	}
	if a.Digest() == b.Digest() {
		t.Fatal("states one ulp apart have equal digests")
	}
	if New(32).Digest() != New(32).Digest() || New(32).Digest() == New(16).Digest() {
		t.Fatal("empty-store digests must be equal for equal dims and differ across dims")
	}
}

func TestDotAgainstFloat64(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for n := range 70 {
		a, b := randVec(r, n), randVec(r, n)
		var want, mag float64
		for i := range a {
			want += float64(a[i]) * float64(b[i])
			mag += math.Abs(float64(a[i]) * float64(b[i]))
		}
		got := float64(dot(a, b))
		// float32 summation error is bounded by n·eps·Σ|aᵢbᵢ|.
		if math.Abs(got-want) > float64(n+1)*0x1p-23*mag+1e-30 {
			t.Fatalf("n=%d: dot = %v, reference %v", n, got, want)
		}
	}
}

func TestConcurrentPutAndQuery(t *testing.T) {
	s := New(64)
	r := rand.New(rand.NewPCG(15, 16))
	for e := range uint64(100) {
		if err := s.Put(e, randVec(r, 64)); err != nil {
			t.Fatal(err)
		}
	}
	q := randVec(r, 64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(17, 18))
		for i := range 500 {
			if err := s.Put(uint64(i%150), randVec(r, 64)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				got, err := s.Nearest(q, 10)
				if err != nil {
					t.Error(err)
					return
				}
				checkSortedByContract(t, got)
				_ = s.Digest()
			}
		}()
	}
	wg.Wait()
	if s.Len() != 150 {
		t.Fatalf("Len: expected 150, found %d", s.Len())
	}
}
